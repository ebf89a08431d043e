"""The shard runner (submit, collect, stream), admission into an account's queue, leases, per-shard summaries."""
