"""The item and shard state machine, the per-shard summaries it is read from, and the one driver."""
