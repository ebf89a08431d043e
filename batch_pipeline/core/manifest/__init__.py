"""Inputs, normalisation and request IDs; building and reading generations of shards."""
