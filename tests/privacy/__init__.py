"""Tests of dp_textgrad: privacy."""
