"""The router: ``backend: auto`` picks a backend (and model) per shard before it is submitted (rules.py)."""
