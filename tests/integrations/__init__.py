"""Tests of dp_textgrad: integrations."""
