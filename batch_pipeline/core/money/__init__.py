"""Prices, quotes, budgets, the retry-spend cap, backend comparison."""
