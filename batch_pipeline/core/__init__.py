"""Pure Python: every decision of the pipeline, no dagster, no SDK.

Its parts import one way, from the top of this list down to the bottom, never up (a module may import any part
below its own, and its own part's modules; ``batch_pipeline_tests/test_import_boundaries.py`` checks every import
statically, those inside functions included, and that no two files of core import each other in a circle):

- ``publish``: the staged and validated tables, dead letters, the report and its plots
- ``state``: the driver that decides every next action, the job view it decides from, shard ranges
- ``run``: the shard runner (submit, collect, stream), admission into an account's queue, per-shard summaries
- ``money``: quotes, the budget guard, routed and fallback allowances, backend comparison, the retry-spend cap
- ``route``: the router (``backend: auto`` picks a backend and model per shard)
- ``quality``: output validation, canary and golden probes, the judge, evals
- ``manifest``: inputs, request IDs, deduplication, shards and their generations
- ``pricing``: price tables and token counts, read by the manifest, the router, the runner and the quote
- ``ledger``: the records the rest reads back: the item and shard states and their machine, attempts and intents,
  job control, result parts, replays, the capacity ledger, and the executor protocols
- ``spec``: the job spec and JobPaths
- ``store``: the filesystem (local or S3) every record is written through
- ``settings``: the settings read from the environment, once
- ``arrow_pool``: the process's Arrow memory pool, chosen at the edge of a process from the settings
- ``troubleshooting``, ``progress``, ``errors``, ``error_table``: the vocabulary everything above may use
"""

# bottom first; a name is a subpackage or a top-level module of core
LAYERS = (
    "error_table",
    "errors",
    "progress",
    "troubleshooting",
    "arrow_pool",
    "settings",
    "store",
    "spec",
    "ledger",
    "pricing",
    "manifest",
    "quality",
    "route",
    "money",
    "run",
    "state",
    "publish",
)
