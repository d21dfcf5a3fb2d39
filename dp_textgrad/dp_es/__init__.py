"""DP evolution strategy: population, scorer, selector, mutation, accountant, controller."""
