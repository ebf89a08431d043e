"""Driver decision time: the plan from per-shard summaries against the old full read of every item and result.

Builds a synthetic job store on local disk (a temp dir, or ``--home``, reused while its build parameters match):
``--shards`` shards holding ``--items`` items, laid out exactly as the pipeline writes them:

- manifest: one item Parquet per shard (``ITEM_SCHEMA``, sorted by request ID, at ``JobPaths.shard_items``) and one
  generation record listing ``new_shards`` (what ``Manifest.shard_ids`` reads);
- results: one Parquet part per (shard, attempt) with ``write_results`` (full ``RESULT_SCHEMA`` rows, an ~850-byte
  OpenAI ``raw_payload`` each, as the ingest writes them); per try an item succeeds, is invalid (contract
  violation) or errors (transient ``server_error``; both spend the budget of 3), and a few have no row;
- attempt records through ``AttemptLog`` (intent with the attempt's request IDs, submitted with the batch handle,
  collected with the provider counts);
- summaries: ``ShardSummaries(spec, store).refresh(shard)`` for every shard once its records are in (the real
  computation, not counts written by hand), each checked against the state the shard was built to be in;
- a passed canary verdict for the first shard and a fresh quote, so the plan is the mid-job one (the job spec has
  ``canary_first: true``).

Shard states: the first shard is the canary (a 300-item canary attempt, then the rest, settled); of the others
~85% settled (retries until every item succeeded or spent its 3 tries), ~8% collected with retryable items, ~5%
submitted (half a first attempt, half a retry after a collected one), ~1% an intent with no submission, ~1% new.
The build runs on ``--build-workers`` spawned processes (default 2), ~100 shards per task.

Timed in this process, best of ``--repeat`` (variants interleaved), every call from a fresh ``Store``:

1. ``driver``: ``load_view(spec, store).plan()``, the decision every caller makes;
2. ``tick``: a shard-sensor tick without Dagster: ``Manifest.shard_ids()``, ``load_view`` with no runs in flight
   and a ``batch_ended`` that answers False (the real sensor asks the provider about each submitted shard: one
   HTTP call each, not counted), the plan, the per-shard attempt counts, one (job, run key) per step and
   ``plan.describe()``; run queries to the Dagster instance (``_partitions_in_flight``, ``_keyed_request``) are
   not counted. It is (1) plus that glue;
3. ``status``: ``batch-pipeline status`` (``cli_state.status``, without ``--check``): the summaries, the plan,
   totals, shards per state and a rich table row for each shard not settled, rendered into a string (a console on
   a StringIO, 160 columns);
4. ``status_all``: ``status --all``, a row for every shard;
5. ``old``: ``JobState.load(spec, store)`` (every manifest item, every result row, all columns) and the old
   ``defs/pipeline.retryable_shards`` on its ``states``;
6. ``old_status``: what ``batch-pipeline status`` ran before it read the summaries (``cmd_status`` until 66fe6d7):
   ``JobState.load``, ``shard_table`` and ``state.check()``, table not rendered; ``status --check`` adds this
   same full read (``JobState.load(...).check()``) to (3) today.

Then each variant once more in its own ``spawn`` child (``_harness.run_in_child``) for its peak RSS (the child's
VmHWM: see ``peak_rss_mb``). Also timed:
``ShardSummaries.refresh`` of one 1,000-item shard (what every record write of a collection costs), for a
collected shard (1 attempt) and a settled one (3 attempts). ``--old-max-items N`` skips the old variants above N
items; ``--profile`` prints a cProfile of one driver decision. Where a decision's time goes is always printed, step
by step (cProfile sees only the main thread; the summaries are read on pool threads).

    python benchmarks/driver_bench.py --shards 1000 --items 1000000
    python benchmarks/driver_bench.py [--shards 10000] [--items 10000000] [--repeat 3] [--home DIR] [--profile]
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks._harness import OUT, load, maxrss_mb, raw_payload_expr, run_in_child

JOB = "driver_bench"
BUDGET = 3
CANARY_SIZE = 300
LABELS = ["billing", "bug", "feature_request", "account", "other"]
KINDS = ("settled", "collected", "submitted", "intent", "new")
MIX = {"settled": 0.85, "collected": 0.08, "submitted": 0.05, "intent": 0.01, "new": 0.01}
P_FAIL = (0.04, 0.20, 0.50)  # per try, by the failures the item already spent
P_MISSING_FIRST = 0.01  # collected shards: first-try items with no result row at all
SPEC_YAML = """\
name: {job}
input:
  path: {home}/input.jsonl
  text_field: body
  key_field: id
  max_input_tokens: 100000
prompt:
  version: v1
  system: You label support tickets.
  template: "Ticket:\\n{{body}}"
model: gpt-4o-mini
backend:
  name: openai_batch
sampling: {{temperature: 0, max_tokens: 8}}
output:
  choice: [billing, bug, feature_request, account, other]
retries: {{per_item: {budget}}}
canary_first: true
canary: {{size: {canary}}}
"""
WORDS = [
    "the",
    "invoice",
    "was",
    "charged",
    "twice",
    "after",
    "I",
    "upgraded",
    "my",
    "plan",
    "and",
    "app",
    "crashes",
    "when",
    "open",
    "settings",
    "please",
    "add",
    "dark",
    "mode",
    "export",
    "to",
    "csv",
    "login",
    "fails",
    "with",
    "error",
    "500",
    "since",
    "yesterday",
    "account",
    "locked",
    "refund",
    "request",
    "for",
    "order",
    "café",
    "déjà",
    "vu",
    "naïve",
    "résumé",
    "straße",
    "dashboard",
    "is",
    "slow",
    "load",
    "on",
    "mobile",
]


# -- build (spawned workers) ----------------------------------------------------------------------
def _prompts(rng, n: int) -> list[str]:
    base = " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), 800))
    starts = rng.integers(0, len(base) - 1300, n)
    lengths = rng.integers(200, 1200, n)
    return [base[s : s + n_] for s, n_ in zip(starts.tolist(), lengths.tolist())]


def _items_table(rng, sid: str, n: int, first_line: int):
    import polars as pl

    from batch_pipeline.core.manifest.shards import ITEM_SCHEMA, length_bucket
    from batch_pipeline.core.pricing.cost import estimate_request_tokens

    raw = rng.bytes(32 * n)
    ids = sorted(raw[i * 32 : (i + 1) * 32].hex() for i in range(n))
    frame = pl.DataFrame({"request_id": ids, "user_prompt": _prompts(rng, n)})
    frame = frame.with_columns(pl.col("user_prompt").str.len_bytes().cast(pl.Int32).alias("request_bytes"))
    frame = frame.with_columns(
        estimate_request_tokens(pl.col("request_bytes"), 25).cast(pl.Int32).alias("est_input_tokens")
    )
    frame = frame.select(
        "request_id",
        pl.lit(sid).alias("shard_id"),
        "user_prompt",
        "est_input_tokens",
        length_bucket(pl.col("est_input_tokens")).alias("length_bucket"),
        "request_bytes",
        pl.lit("input.jsonl").alias("source"),
        (pl.int_range(pl.len(), dtype=pl.Int64) + first_line).alias("line"),
        pl.lit(1, pl.Int32).alias("generation"),
    )
    return frame.to_arrow().cast(ITEM_SCHEMA)


def _result_part(ids, outcome, labels, sid: str, attempt: int, now: datetime):
    """RESULT_SCHEMA rows for one attempt: outcome 0 succeeded, 1 invalid, 2 errored (transient)."""
    import polars as pl

    from batch_pipeline.core.ledger.result_parts import RESULT_SCHEMA

    ok, inv, err = pl.col("o") == 0, pl.col("o") == 1, pl.col("o") == 2
    frame = pl.DataFrame({"request_id": ids, "o": outcome, "label": labels}).select(
        "request_id",
        pl.lit(sid).alias("shard_id"),
        pl.lit(attempt, pl.Int32).alias("attempt"),
        pl.lit("openai_batch").alias("backend"),
        pl.lit("batch").alias("pricing"),
        pl.lit("gpt-4o-mini").alias("model"),
        pl.lit("v1").alias("prompt_version"),
        pl.when(ok)
        .then(pl.lit("succeeded"))
        .when(inv)
        .then(pl.lit("invalid"))
        .otherwise(pl.lit("errored"))
        .alias("status"),
        pl.when(err)
        .then(None)
        .when(inv)
        .then(pl.lit('{"label": "spam"}'))
        .otherwise(pl.format('{{"label": "{}"}}', "label"))
        .alias("output_text"),
        pl.when(ok).then(pl.col("label")).otherwise(None).alias("parsed_output"),
        pl.when(err).then(None).otherwise(pl.lit("stop")).alias("finish_reason"),
        pl.when(err).then(0).otherwise(231).cast(pl.Int64).alias("input_tokens"),
        pl.lit(0, pl.Int64).alias("cached_tokens"),
        pl.when(err).then(0).otherwise(7).cast(pl.Int64).alias("output_tokens"),
        pl.when(err).then(0.0).otherwise(0.0000215).alias("cost_usd"),
        pl.when(ok)
        .then(None)
        .when(inv)
        .then(pl.lit("invalid_output"))
        .otherwise(pl.lit("transient"))
        .alias("error_class"),
        pl.when(ok)
        .then(None)
        .when(inv)
        .then(pl.lit("contract_violation"))
        .otherwise(pl.lit("server_error"))
        .alias("error_code"),
        pl.when(ok)
        .then(None)
        .when(inv)
        .then(pl.lit('output \'{"label": "spam"}\' is not one of the allowed labels'))
        .otherwise(pl.lit("The server had an error while processing your request."))
        .alias("error_message"),
        pl.lit(f"batch_{sid}_{attempt}").alias("provider_batch_id"),
        pl.format("req_{}", pl.col("request_id").str.slice(0, 32)).alias("provider_request_id"),
        raw_payload_expr(),
        pl.lit(now).dt.replace_time_zone("UTC").alias("recorded_at"),
    )
    import pyarrow as pa

    table = frame.to_arrow()
    missing = [f for f in RESULT_SCHEMA if f.name not in table.column_names]  # columns added to the schema since
    for f in missing:
        table = table.append_column(
            f.name, pa.repeat(pa.scalar(0 if pa.types.is_integer(f.type) else None, f.type), table.num_rows)
        )
    return table.select(RESULT_SCHEMA.names).cast(RESULT_SCHEMA)


def _try(rng, failures):
    """One try of each item: 0 succeeded, else 1 invalid / 2 errored (half each), by the failures spent."""
    import numpy as np

    fail = rng.random(len(failures)) < np.array(P_FAIL)[np.minimum(failures, len(P_FAIL) - 1)]
    return np.where(fail, rng.integers(1, 3, len(failures)), 0)


def _build_shard(store, spec, summaries, number: int, n: int, kind: str, first_line: int, seed: int) -> dict:
    import numpy as np
    import polars as pl

    from batch_pipeline.core.ledger.attempts import AttemptLog
    from batch_pipeline.core.ledger.result_parts import write_results
    from batch_pipeline.core.manifest.shards import shard_name
    from batch_pipeline.core.spec.paths import JobPaths

    rng = np.random.default_rng([seed, number])
    sid = shard_name(number)
    paths = JobPaths(spec.name)
    table = _items_table(rng, sid, n, first_line)
    store.write_table(paths.shard_items(sid), table)
    ids = pl.Series(table.column("request_id").to_pylist())
    labels = np.array(LABELS)[rng.integers(0, len(LABELS), n)]
    ok = np.zeros(n, bool)
    failures = np.zeros(n, np.int64)
    log_ = AttemptLog(store, spec.name, sid)
    now = datetime.now(UTC)
    attempt = 0
    rows = 0

    def run(members, *, canary=False, submit=True, collect=True, missing=0.0) -> None:
        nonlocal attempt, rows
        attempt += 1
        key = f"{spec.name}:{sid}:{attempt}"
        assert log_.create_intent(
            attempt,
            {
                "key": key,
                "backend": "openai_batch",
                "lease_token": f"bench-{sid}",
                "request_ids": ids.gather(members).to_list(),
                "requests": len(members),
                "canary": canary,
            },
        )
        if submit:
            log_.record(
                attempt,
                "submitted",
                {
                    "backend": "openai_batch",
                    "batch_id": f"batch_{sid}_{attempt}",
                    "key": key,
                    "input_file_id": f"file_{sid}_{attempt}",
                },
            )
        if not collect:
            return
        outcome = _try(rng, failures[members])
        answered = members if not missing else members[rng.random(len(members)) >= missing]
        outcome = outcome if not missing else outcome[np.isin(members, answered)]
        part = _result_part(ids.gather(answered), outcome, labels[answered], sid, attempt, now)
        write_results(store, spec.name, sid, attempt, 1, part)
        rows += part.num_rows
        ok[answered[outcome == 0]] = True
        failures[answered[outcome != 0]] += 1
        log_.record(
            attempt,
            "collected",
            {
                "state": "completed",
                "rows": part.num_rows,
                "succeeded": int((outcome == 0).sum()),
                "systemic": None,
                "provider_counts": {"total": len(members), "completed": part.num_rows, "failed": 0},
            },
        )

    def retryable():
        return np.nonzero(~ok & (failures < BUDGET))[0]

    everything = np.arange(n)
    if kind == "canary":
        run(rng.choice(n, size=min(CANARY_SIZE, n), replace=False), canary=True)
    if kind in ("canary", "settled"):
        run(retryable())
        while len(retryable()):
            run(retryable())
    elif kind == "collected":
        run(everything, missing=P_MISSING_FIRST)
    elif kind == "submitted":
        if rng.random() < 0.5:
            run(everything, missing=P_MISSING_FIRST)
            run(retryable(), collect=False)
        else:
            run(everything, collect=False)
    elif kind == "intent":
        run(everything, submit=False, collect=False)
    summary = summaries.refresh(sid)
    want = {
        "canary": "settled",
        "settled": "settled",
        "collected": "collected" if len(retryable()) else "settled",
        "submitted": "submitted",
        "intent": "intent",
        "new": "new",
    }[kind]
    if summary.state.value != want or not summary.balanced or summary.expected != n:
        raise AssertionError(f"shard {sid} built as {kind}: summary says {summary.as_dict()}")
    return {
        "state": summary.state.value,
        "valid": summary.valid,
        "invalid": summary.invalid,
        "missing": summary.missing,
        "dead_lettered": summary.dead_lettered,
        "rows": rows,
        "attempts": attempt,
    }


def build_chunk(home: str, spec_path: str, tasks: list[tuple[int, int, str, int]], seed: int) -> dict:
    from batch_pipeline.core.run.summary import ShardSummaries
    from batch_pipeline.core.spec.loading import load_spec
    from batch_pipeline.core.store import Store

    spec = load_spec(spec_path)
    store = Store(home)
    summaries = ShardSummaries(spec, store)
    out: dict = {"states": {}, "valid": 0, "invalid": 0, "missing": 0, "dead_lettered": 0, "rows": 0, "attempts": 0}
    for number, n, kind, first_line in tasks:
        r = _build_shard(store, spec, summaries, number, n, kind, first_line, seed)
        out["states"][r["state"]] = out["states"].get(r["state"], 0) + 1
        for k in ("valid", "invalid", "missing", "dead_lettered", "rows", "attempts"):
            out[k] += r[k]
    return out


def _fresh_quote(spec):
    """A quote that stays fresh for a year (its figures are not what the driver decides from)."""
    from batch_pipeline.core.money.estimate import RequestTokens
    from batch_pipeline.core.money.quote_record import Quote
    from batch_pipeline.core.pricing.cost import Price

    now = datetime.now(UTC)
    nothing = {"low": 0.0, "expected": 0.0, "high": 0.0}
    a_pass = {k: 0 for k in ("requests", "input_tokens", "output_tokens_expected", "output_tokens_max")}
    a_pass |= {"cost_low": 0.0, "cost_expected": 0.0, "cost_high": 0.0}
    return Quote(
        job=spec.name,
        model=spec.model,
        backend=spec.backend.name,
        pending_requests=0,
        probe_requests=0,
        price=Price(input_per_mtok=0.15, output_per_mtok=0.6, checked=date(2026, 1, 1)),
        calibration={"factor": 1.0, "items_measured": 0, "tokenizer_factor": 1.0},
        tokenizer=RequestTokens("o200k_base", True, 1.0, 0, 0, 0, 0, 0),
        cache_hit_share=nothing,
        cache_write_share=nothing,
        cache={
            "prefix_tokens": 0,
            "writes_billed": False,
            "ttl": None,
            "write_multiplier": 1.25,
            "first_write_batches": 0,
        },
        passes={
            "first": a_pass,
            "probes": {**a_pass, "shards": 0},
            "retries": {"expected_share": 0.0, "cost_expected": 0.0, "cost_high": 0.0},
        },
        cascade=None,
        est_cost_usd=nothing,
        spent_usd=0.0,
        budget_usd=None,
        within_budget=True,
        components={},
        fingerprint="bench",
        created_at=now.isoformat(),
        expires_at=(now + timedelta(days=365)).isoformat(),
    )


def build(home: str, spec_path: str, shards: int, items: int, seed: int, workers: int) -> dict:
    import numpy as np

    from batch_pipeline.core.manifest.shards import ManifestSummary, shard_name
    from batch_pipeline.core.quality.golden import CanaryVerdict
    from batch_pipeline.core.spec.loading import load_spec
    from batch_pipeline.core.spec.paths import JobPaths
    from batch_pipeline.core.store import Store

    started = time.perf_counter()
    spec = load_spec(spec_path)
    store = Store(home)
    rng = np.random.default_rng(seed)
    kinds = rng.choice(list(MIX), size=shards, p=list(MIX.values())).tolist()
    kinds[0] = "canary"
    sizes = [items // shards + (1 if i < items % shards else 0) for i in range(shards)]
    firsts = np.concatenate([[1], np.cumsum(sizes)[:-1] + 1]).tolist()
    tasks = [(i + 1, sizes[i], kinds[i], int(firsts[i])) for i in range(shards)]
    chunks = [tasks[i : i + 100] for i in range(0, shards, 100)]
    import multiprocessing as mp

    totals: dict = {"states": {}, "valid": 0, "invalid": 0, "missing": 0, "dead_lettered": 0, "rows": 0, "attempts": 0}
    done = 0
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(build_chunk, home, spec_path, c, seed) for c in chunks]
        for f in futures:
            r = f.result()
            for s, c in r["states"].items():
                totals["states"][s] = totals["states"].get(s, 0) + c
            for k in ("valid", "invalid", "missing", "dead_lettered", "rows", "attempts"):
                totals[k] += r[k]
            done += 1
            if done % max(1, len(chunks) // 10) == 0:
                print(
                    f"  built {min(done * 100, shards):,} / {shards:,} shards  {time.perf_counter() - started:6.1f} s",
                    flush=True,
                )
    paths = JobPaths(spec.name)
    names = [shard_name(i + 1) for i in range(shards)]
    store.write_json(
        paths.generation(1),
        ManifestSummary(
            job=spec.name,
            generation=1,
            input_files=1,
            input_rows=items,
            accepted_rows=items,
            unique_requests=items,
            new_requests=items,
            shards_total=shards,
            new_shards=names,
        ).as_dict(),
    )
    store.write_json(
        paths.canary_verdict, CanaryVerdict(names[0], True, 0, 1.0, 1.0, 1.0, CANARY_SIZE, 0.0, "passed").as_dict()
    )
    store.write_json(paths.quote, _fresh_quote(spec).as_json())
    totals["build_seconds"] = round(time.perf_counter() - started, 1)
    return totals


# -- the variants -----------------------------------------------------------------------------------
def driver(spec, store):
    from batch_pipeline.core.state.view import load_view

    return load_view(spec, store).plan()


def tick(spec, store):
    """The shard sensor's work without Dagster and without the provider polls."""
    from batch_pipeline.core.manifest.shards import Manifest
    from batch_pipeline.core.state.driver import Action
    from batch_pipeline.core.state.view import load_view

    run_jobs = {
        Action.CANARY: "submit",
        Action.SUBMIT: "submit",
        Action.RESOLVE: "submit",
        Action.RESCUE: "submit",
        Action.COLLECT: "collect",
    }
    shard_ids = Manifest(spec.name, store).shard_ids()
    if not shard_ids:
        return None
    view = load_view(spec, store, in_flight=frozenset(), busy=False, batch_ended=lambda submitted: set())
    plan = view.plan()
    attempts = {s.shard_id: s.attempts for s in view.summaries}
    requests = []
    for step in plan.steps:
        if step.action == Action.REQUOTE:
            requests.append(("quote", "quote"))
        elif step.action == Action.PUBLISH:
            requests.append(("publish", f"publish:{sum(s.valid + s.dead_lettered for s in view.summaries)}"))
        else:
            requests.append(
                (run_jobs[step.action], f"{step.action.value}:{step.shard_id}:{attempts[step.shard_id] + 1}")
            )
    return plan, requests, plan.describe()


def old(spec, store):
    import polars as pl

    from batch_pipeline.core.ledger.reconcile import INVALID, MISSING
    from batch_pipeline.core.publish.tables import JobState

    state = JobState.load(spec, store)
    todo = sorted(state.states.filter(pl.col("state").is_in([INVALID, MISSING]))["shard_id"].unique().to_list())
    return state, todo


def old_status(spec, store):
    from batch_pipeline.core.publish.report import shard_table
    from batch_pipeline.core.publish.tables import JobState

    state = JobState.load(spec, store)
    rows = shard_table(state)
    return state, rows, state.check()


def _status(spec, store, every_row: bool) -> str:
    import argparse
    import io

    from rich.console import Console

    from batch_pipeline.cli_jobs import cli_settings
    from batch_pipeline.cli_state import status as cli_status

    console = Console(file=io.StringIO(), width=160)
    args = argparse.Namespace(home=store.root, check=False, all=every_row, settings=cli_settings(str(store.root)))
    assert cli_status(spec, args, console) == 0
    return console.file.getvalue()


def status(spec, store):
    """``batch-pipeline status`` (``cli_state.status``): summaries, plan, totals, shards per state, and a rich table
    row for each shard that is not settled, rendered into a string instead of the terminal."""
    return _status(spec, store, every_row=False)


def status_all(spec, store):
    """``batch-pipeline status --all``: the same with a row for every shard (drawing 10,000 rows is the cost)."""
    return _status(spec, store, every_row=True)


VARIANTS = {
    "driver": driver,
    "tick": tick,
    "status": status,
    "status_all": status_all,
    "old": old,
    "old_status": old_status,
}
OLD = ("old", "old_status")


def _fresh(home: str, spec_path: str):
    from batch_pipeline.core.spec.loading import load_spec
    from batch_pipeline.core.store import Store

    return load_spec(spec_path), Store(home)


def _imports() -> None:
    import polars  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    from batch_pipeline.core.publish import report, tables  # noqa: F401
    from batch_pipeline.core.state import view  # noqa: F401


def child_variant(name: str, home: str, spec_path: str, times: int) -> dict:
    """One variant in a fresh interpreter: its wall times and its peak RSS (imports done before the timer)."""
    _imports()
    rss_before = maxrss_mb()
    secs = []
    out = None
    for _ in range(times):
        out = None
        spec, store = _fresh(home, spec_path)
        t = time.perf_counter()
        out = VARIANTS[name](spec, store)
        secs.append(time.perf_counter() - t)
    result = {"variant": name, "seconds": secs, "peak_rss_mb": maxrss_mb(), "rss_after_imports_mb": rss_before}
    if name in OLD:  # after the timer: does the full read agree with the summaries?
        result["checks"] = _check_old(name, out, *_fresh(home, spec_path))
    return result


def _check_old(name: str, out, spec, store) -> dict[str, bool]:
    from batch_pipeline.core.ledger.reconcile import counts_by_shard
    from batch_pipeline.core.run.summary import ShardSummaries

    state = out[0]
    summaries = ShardSummaries(spec, store).all()
    per_shard = counts_by_shard(state.states)
    checks = {
        "per-shard counts of the summaries == the full read's": all(
            per_shard[s.shard_id].as_dict()
            == {
                "expected": s.expected,
                "valid": s.valid,
                "invalid": s.invalid,
                "missing": s.missing,
                "dead_lettered": s.dead_lettered,
            }
            for s in summaries
        )
        and len(per_shard) == len(summaries)
    }
    if name == "old":
        unsettled = sorted(s.shard_id for s in summaries if s.state.value != "settled")
        checks["old retryable shards == the summaries' unsettled shards"] = out[1] == unsettled
    else:
        checks["status totals balanced"] = bool(out[2].balanced)
    return checks


def time_refresh(home: str, spec_path: str, sid: str, times: int) -> list[float]:
    from batch_pipeline.core.run.summary import ShardSummaries

    spec, store = _fresh(home, spec_path)
    summaries = ShardSummaries(spec, store)
    secs = []
    for _ in range(times):
        t = time.perf_counter()
        summaries.refresh(sid)
        secs.append(time.perf_counter() - t)
    return secs


def profile_driver(home: str, spec_path: str, name: str = "driver") -> str:
    import cProfile
    import io
    import pstats

    spec, store = _fresh(home, spec_path)
    prof = cProfile.Profile()
    prof.enable()
    VARIANTS[name](spec, store)
    prof.disable()
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    st.sort_stats("cumulative").print_stats(30)
    st.sort_stats("tottime").print_stats(20)
    return s.getvalue()


def breakdown(home: str, spec_path: str, times: int) -> dict[str, float]:
    """Where a decision's time goes, step by step (best of ``times``). cProfile sees only the main thread, and
    the summaries are read on ``ordered_map``'s pool threads, so the steps are timed one by one, serially."""
    import json as _json

    from batch_pipeline.core.ledger.control import JobControl
    from batch_pipeline.core.manifest.shards import Manifest
    from batch_pipeline.core.run.summary import ShardSummaries, ShardSummary
    from batch_pipeline.core.spec.paths import JobPaths
    from batch_pipeline.core.state.driver import next_steps
    from batch_pipeline.core.state.view import (
        canary_status,
        load_view,
        paused,
        quote_fresh,
    )

    spec, store = _fresh(home, spec_path)
    paths = JobPaths(spec.name)
    ids = Manifest(spec.name, store).shard_ids()
    rels = [paths.shard_summary(s) for s in ids]
    steps: dict[str, list[float]] = {}

    def timed(label, fn, *args):
        t = time.perf_counter()
        out = fn(*args)
        steps.setdefault(label, []).append(time.perf_counter() - t)
        return out

    for _ in range(times):
        timed("Manifest.shard_ids() (the generation records)", lambda: Manifest(spec.name, store).shard_ids())
        raw = timed("read_bytes of every summary, serial", lambda: [store.read_bytes(r) for r in rels])
        dicts = timed("json.loads of every summary", lambda r: [_json.loads(x) for x in r], raw)
        timed("ShardSummary.from_dict of every summary", lambda ds: [ShardSummary.from_dict(d) for d in ds], dicts)
        timed(
            "ShardSummaries.read of every summary, serial (what workers=1 would do)",
            lambda: [ShardSummaries(spec, store).read(x) for x in ids],
        )
        summaries = timed(
            "ShardSummaries.all() (read + parse on 4 pool threads, as load_view does)",
            lambda: ShardSummaries(spec, store).all(),
        )
        timed(
            "job facts (stop, pause, canary verdict, quote)",
            lambda: (
                JobControl(store, spec.name).current(),
                canary_status(spec, store, ids),
                paused(store, spec.name),
                quote_fresh(store, spec.name),
            ),
        )
        facts = load_view(spec, store).facts
        plan = timed("next_steps (the rules over every summary)", next_steps, summaries, facts)
        timed("plan.describe()", plan.describe)
    return {k: min(v) for k, v in steps.items()}


# -- driver ------------------------------------------------------------------------------------------
def _available_gb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return float("inf")


def _watched_child(name: str, home: str, spec_path: str, min_free_gb: float) -> dict:
    """``run_in_child`` of one variant; a watchdog kills that child (our own, by its Process object) if the
    machine's available memory falls below ``min_free_gb`` (other work shares the machine)."""
    import multiprocessing as mp
    import threading

    done = threading.Event()
    seen = {"min_available_gb": _available_gb(), "killed": False}

    def watch() -> None:
        while not done.wait(0.2):
            avail = _available_gb()
            seen["min_available_gb"] = min(seen["min_available_gb"], avail)
            if avail < min_free_gb:
                for child in mp.active_children():
                    child.kill()
                seen["killed"] = True
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = run_in_child("benchmarks.driver_bench:child_variant", name, home, spec_path, 1)
    except (EOFError, RuntimeError, OSError) as exc:
        result = {"variant": name, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        done.set()
        watcher.join()
    return {**result, **seen}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=10_000)
    ap.add_argument("--items", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--home", help="store root to build in (kept, and reused while shards/items/seed match)")
    ap.add_argument("--rebuild", action="store_true", help="build again even if --home holds a matching store")
    ap.add_argument("--build-workers", type=int, default=2)
    ap.add_argument(
        "--old-max-items", type=int, default=None, help="skip the old full-read variants above this many items"
    )
    ap.add_argument(
        "--old-in-process-max-items",
        type=int,
        default=2_000_000,
        help="above this many items the old variants run only once, in their watched children "
        "(their peak RSS is GBs; this process keeps timing the driver)",
    )
    ap.add_argument(
        "--min-free-gb",
        type=float,
        default=2.0,
        help="kill a variant's child when the machine's available memory falls below this",
    )
    ap.add_argument("--no-children", action="store_true", help="skip the per-variant children (peak RSS)")
    ap.add_argument("--profile", action="store_true", help="also cProfile one driver decision and one tick")
    args = ap.parse_args()

    home = args.home or tempfile.mkdtemp(prefix="driver_bench-")
    Path(home).mkdir(parents=True, exist_ok=True)
    home = str(Path(home).resolve())
    spec_path = str(Path(home) / "job.yaml")
    meta_path = Path(home) / "driver_bench_build.json"
    params = {"shards": args.shards, "items": args.items, "seed": args.seed}
    try:
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else None
        if meta is None or meta.get("params") != params or args.rebuild:
            shutil.rmtree(Path(home) / "jobs" / JOB, ignore_errors=True)
            Path(spec_path).write_text(SPEC_YAML.format(job=JOB, home=home, budget=BUDGET, canary=CANARY_SIZE))
            print(
                f"building {args.shards:,} shards / {args.items:,} items in {home} ({args.build_workers} workers)",
                flush=True,
            )
            meta = {
                "params": params,
                "build": build(home, spec_path, args.shards, args.items, args.seed, args.build_workers),
            }
            meta_path.write_text(json.dumps(meta, indent=1))
        b = meta["build"]
        du = sum(f.stat().st_size for f in (Path(home) / "jobs" / JOB).rglob("*") if f.is_file())
        print(
            f"store: {args.shards:,} shards, {args.items:,} items, {b['rows']:,} result rows, {b['attempts']:,} "
            f"attempts, {du / 2**30:.2f} GiB; shard states {b['states']}; items valid {b['valid']:,} invalid "
            f"{b['invalid']:,} missing {b['missing']:,} dead {b['dead_lettered']:,}; built in "
            f"{b['build_seconds']} s (summaries by ShardSummaries.refresh)",
            flush=True,
        )

        variants = [
            v for v in VARIANTS if v not in OLD or args.old_max_items is None or args.items <= args.old_max_items
        ]
        in_process = [v for v in variants if v not in OLD or args.items <= args.old_in_process_max_items]
        _imports()
        secs: dict[str, list[float]] = {v: [] for v in in_process}
        last: dict[str, object] = {}
        print(f"\nin this process, interleaved, {args.repeat} rounds:")
        for _ in range(args.repeat):
            for v in in_process:
                last[v] = None
                spec, store = _fresh(home, spec_path)
                t = time.perf_counter()
                last[v] = VARIANTS[v](spec, store)
                secs[v].append(time.perf_counter() - t)
                print(f"  {v:12s} {secs[v][-1]:8.3f} s  load {load():.1f}", flush=True)
        plan = last["driver"]
        steps: dict[str, int] = {}
        for s in plan.steps:
            steps[s.action.value] = steps.get(s.action.value, 0) + 1
        n_requests = len(last["tick"][1])
        last.clear()
        print(f"plan: {plan.describe()}")
        out = {
            "params": params,
            "build": b,
            "store_bytes": du,
            "date": date.today().isoformat(),
            "cpus": os.cpu_count(),
            "in_process": {v: {"best_s": min(x), "all_s": [round(y, 4) for y in x]} for v, x in secs.items()},
            "plan_steps": steps,
            "plan": plan.describe(),
            "tick_requests": n_requests,
        }

        # ShardSummaries.refresh of one shard (the cost of each record write during a collection)
        from batch_pipeline.core.ledger.attempts import AttemptLog

        spec, store = _fresh(home, spec_path)
        by_kind: dict[str, str] = {}
        for sid, st in sorted(plan.states.items()):
            if sid == "s00001":
                continue
            n = len(AttemptLog(store, JOB, sid).all())
            kind = (
                "collected (1 attempt)"
                if st.value == "collected" and n == 1
                else "settled (3 attempts)"
                if st.value == "settled" and n == 3
                else None
            )
            if kind and kind not in by_kind:
                by_kind[kind] = sid
            if len(by_kind) == 2:
                break
        out["refresh"] = {}
        print()
        for kind, sid in by_kind.items():
            r = time_refresh(home, spec_path, sid, max(10, args.repeat))
            med = sorted(r)[len(r) // 2]
            out["refresh"][kind] = {"shard": sid, "best_s": min(r), "median_s": med}
            print(
                f"  ShardSummaries.refresh, {kind}, shard {sid} ({args.items // args.shards:,} items): "
                f"best {min(r) * 1000:.1f} ms, median {med * 1000:.1f} ms over {len(r)}"
            )

        parts = breakdown(home, spec_path, args.repeat)
        out["breakdown"] = parts
        print(f"\nwhere a decision's time goes ({args.shards:,} summaries; best of {args.repeat}, each step alone):")
        for label, sec in parts.items():
            print(f"  {sec * 1000:9.1f} ms  {label}")

        children: dict[str, dict] = {}
        if not args.no_children:
            print("\neach variant once in its own spawned child (peak RSS = the child's VmHWM):")
            for v in variants:
                r = children[v] = _watched_child(v, home, spec_path, args.min_free_gb)
                if "error" in r:
                    why = "killed by the memory watchdog" if r["killed"] else r["error"].splitlines()[0]
                    print(
                        f"  {v:12s} FAILED: {why} (machine's available memory fell to {r['min_available_gb']:.1f} GB)"
                    )
                    continue
                print(
                    f"  {v:12s} {min(r['seconds']):8.3f} s  peak RSS {r['peak_rss_mb']:8,.0f} MB "
                    f"(after imports {r['rss_after_imports_mb']:,.0f} MB; machine's available memory fell to "
                    f"{r['min_available_gb']:.1f} GB)  load {load():.1f}",
                    flush=True,
                )
            out["children"] = children

        best = {v: (min(x), f"best of {args.repeat}, in process") for v, x in secs.items()}
        for v in variants:
            if v not in best and v in children and "seconds" in children[v]:
                best[v] = (min(children[v]["seconds"]), "1 run, own child")
        print(f"\nsummary ({args.shards:,} shards, {args.items:,} items):")
        for v in variants:
            if v not in best:
                print(f"  {v:12s} not measured")
                continue
            sec, how = best[v]
            rss = children.get(v, {}).get("peak_rss_mb")
            ref = "old_status" if v.startswith("status") else "old"
            ratio = f"  {ref} / this {best[ref][0] / sec:6.1f}x" if ref in best and v not in OLD else ""
            print(f"  {v:12s} {sec:8.3f} s ({how}){ratio}" + (f"  peak RSS {rss:,.0f} MB" if rss else ""))
        out["best_s"] = {v: x[0] for v, x in best.items()}
        if "old" in best:
            out["ratio_old_over_driver"] = best["old"][0] / best["driver"][0]
            out["ratio_old_over_tick"] = best["old"][0] / best["tick"][0]
        if "old_status" in best:
            out["ratio_old_status_over_status"] = best["old_status"][0] / best["status"][0]

        if args.profile:
            for v in ("driver", "tick"):
                print(f"\n-- cProfile of one {v} call (main thread only: the summary reads run on pool threads) --")
                print(profile_driver(home, spec_path, v))
        goal = 2.0
        checks = [
            (f"driver decision < {goal} s", best["driver"][0] < goal),
            (f"sensor tick (no Dagster, no provider polls) < {goal} s", best["tick"][0] < goal),
        ]
        if "old_status" in best:
            checks.append(
                (f"`status` as it was (full read, table not rendered) < {goal} s", best["old_status"][0] < goal)
            )
        checks.append(
            (f"`status` (summaries, rows for the shards not settled, rendered) < {goal} s", best["status"][0] < goal)
        )
        for v in OLD:
            for what, ok in children.get(v, {}).get("checks", {}).items():
                checks.append((f"{v}: {what}", ok))
        print()
        for what, ok in checks:
            print(f"  [{'ok' if ok else 'NO'}] {what}")
        out["checks"] = {what: ok for what, ok in checks}
        out["load_at_end"] = load()
        OUT.mkdir(exist_ok=True)
        dest = OUT / f"driver_bench-{args.shards}-{args.items}.json"
        dest.write_text(json.dumps(out, indent=1, default=str))
        print(f"figures: {dest}")
    finally:
        if not args.home:
            shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
