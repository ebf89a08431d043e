"""Executor protocols, the shard runner, attempts and intents, leases, job control, result parts."""
