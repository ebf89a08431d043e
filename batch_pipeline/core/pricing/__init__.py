"""Prices, token counts and what a request costs: read by the manifest, the router, the runner and the quote."""
