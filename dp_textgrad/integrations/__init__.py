"""Integrations with the frameworks where prompts are optimized today: :mod:`.dspy` (a DSPy
optimizer) and :mod:`.gepa` (GEPA's call shape). Each imports its framework only when used."""
