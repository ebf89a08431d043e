"""Quotes, the budget guard, routed and fallback allowances, the retry-spend cap, backend comparison."""
