"""Tests of dp_textgrad.audit.end_to_end."""
