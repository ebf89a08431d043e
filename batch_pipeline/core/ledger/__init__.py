"""The records every other part of core reads back, and the vocabulary they are read in.

``reconcile`` (item states), ``machine`` (shard states and the moves between them), ``attempts`` (attempts and
intents), ``control`` (pause and stop records), ``result_parts`` (append-only result rows), ``replay``,
``fallback`` (the stage an item is on), ``executor`` and ``outcomes`` (what an executor is and returns), and the
per-(provider, account, model) capacity ledger (``capacity``, ``admission``, ``queue_clock``, ``ceilings``).
"""
