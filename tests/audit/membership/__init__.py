"""Tests of dp_textgrad.audit.membership."""
