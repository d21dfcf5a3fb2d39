"""Tests of dp_textgrad: distributed."""
