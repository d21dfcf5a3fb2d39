"""Tests of dp_textgrad.audit.mechanism_audits."""
