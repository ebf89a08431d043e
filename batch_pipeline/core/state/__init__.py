"""The one driver that decides every next action, the job view it decides from, and shard ranges."""
