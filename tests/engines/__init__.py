"""Tests of dp_textgrad: engines."""
