"""Tests of dp_textgrad.audit.statistics."""
