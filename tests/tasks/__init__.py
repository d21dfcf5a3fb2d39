"""Tests of dp_textgrad: tasks."""
