"""Tests of dp_textgrad: federated."""
