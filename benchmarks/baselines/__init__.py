"""Competitors rebuilt from their papers for side-by-side benchmarks (never shipped in the package)."""
