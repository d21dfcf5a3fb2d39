"""Tests of dp_textgrad.audit.canaries."""
