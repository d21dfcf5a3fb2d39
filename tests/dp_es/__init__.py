"""Tests of dp_textgrad: dp_es."""
