"""Helpers of the provider-quota tests that run real processes (defs/test_quota_procs.py and
e2e/test_quota_sensors_dev.py): job specs on the 40 small tickets, the sandbox's own token count of each shard (to set a cap that holds N shards),
and what the sandbox's load ledger, the attempt logs and the capacity ledger say afterwards.
"""

from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import yaml

from batch_pipeline.core.ledger.attempts import Attempt, AttemptLog
from batch_pipeline.core.ledger.capacity import CapacityLedger, CapacityScope
from batch_pipeline.core.ledger.control import JobControl
from batch_pipeline.core.ledger.reconcile import VALID
from batch_pipeline.core.manifest.read import Manifest
from batch_pipeline.core.manifest.shards import build_manifest
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.loading import load_spec
from batch_pipeline.core.store import Store
from batch_pipeline.sandbox import SandboxAdmin

REPO = Path(__file__).resolve().parents[1]
SMALL = REPO / "data" / "samples" / "tickets_small" / "tickets.jsonl"
ROWS = 40
MODEL = "gpt-4o-mini"
ACCOUNT = "OPENAI_API_KEY"  # the ledger's name of the account: the key's variable (no `account:` in the specs)


def write_spec(
    root: Path, name: str, max_requests: int, *, version: str = "v1", cap: int | None = None, **overrides
) -> JobSpec:
    """``root/jobs/<name>.yaml``: the demo's spec on the 40 small tickets (``root/in``), ``max_requests`` a shard,
    no golden probes, the account's queue cap ``cap`` (enqueued tokens) when given, then ``overrides``. ``version``
    is the prompt version: two jobs on the same rows with different versions have different request IDs, so the
    sandbox's billing ledger tells their bills apart (and their prompts, so their token counts, are the same)."""
    inputs = root / "in"
    inputs.mkdir(parents=True, exist_ok=True)
    if not (inputs / "rows.jsonl").exists():
        (inputs / "rows.jsonl").write_bytes(SMALL.read_bytes())
    spec = yaml.safe_load((REPO / "data" / "jobs" / "demo.yaml").read_text())
    spec.pop("quality", None)
    settings: dict = {"sandbox": True}
    if cap is not None:
        settings["quota"] = {"enqueued_tokens": cap}
    spec.update(
        name=name,
        input={**spec["input"], "path": str(inputs / "*.jsonl")},
        prompt={**spec["prompt"], "version": version},
        shards={"max_requests": max_requests},
        backend={"name": "openai_batch", "settings": settings},
        **overrides,
    )
    path = root / "jobs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec))
    return load_spec(path)


class Sizes:
    """The sandbox's own count of each request's prompt tokens (billed by one uncapped batch of all 40 rows), and
    the shards a spec with ``max_requests`` deals them into (its manifest, built without a run: membership depends
    on the rows and the shard caps only, never on the job's name or prompt version)."""

    def __init__(self, root: Path, tokens: dict[str, int]):
        self.root, self.tokens = root, tokens

    @classmethod
    def probe(cls, sandbox_url: str, root: Path) -> "Sizes":
        from batch_pipeline.defs.pipeline import run_job
        from batch_pipeline.defs.resources import PricesResource, StoreResource

        admin = SandboxAdmin(sandbox_url)
        admin.reset()
        with pytest.MonkeyPatch.context() as mp, dg.DagsterInstance.ephemeral() as instance:
            mp.setenv("BATCH_PIPELINE_SANDBOX_URL", sandbox_url)
            spec = write_spec(root / "one", "probe", ROWS)  # one shard, one batch: the canary is the whole job
            report = run_job(
                spec,
                instance,
                {
                    "store": StoreResource(root=str(root / "one" / "home")),
                    "prices": PricesResource(path=str(REPO / "data" / "prices.yaml")),
                },
            )
            assert report["complete"], report
        tokens = {e["custom_id"]: int(e["input_tokens"]) for e in admin.ledger()}
        admin.reset()
        return cls(root, tokens)

    def shards(self, max_requests: int) -> dict[str, int]:
        """Shard ID -> the sandbox's prompt tokens of its requests."""
        spec = write_spec(self.root / f"m{max_requests}", "probe", max_requests)
        store = Store(self.root / f"m{max_requests}" / "home")
        build_manifest(spec, store)
        index = pl.from_arrow(Manifest(spec.name, store).item_index(["request_id", "shard_id"]))
        missing = set(index["request_id"]) - set(self.tokens)
        assert not missing, f"the probe did not bill {len(missing)} of the manifest's requests"
        frame = index.with_columns(pl.col("request_id").replace_strict(self.tokens).alias("tokens"))
        return dict(frame.group_by("shard_id").agg(pl.col("tokens").sum()).iter_rows())

    def cap(self, max_requests: int, holding: int = 3) -> int:
        """Enqueued tokens that hold the ``holding`` largest shards at once."""
        return sum(sorted(self.shards(max_requests).values())[-holding:])


# -- what the store says -------------------------------------------------------------------------------------------
def ledger_of(home: Path) -> CapacityLedger:
    return CapacityLedger(Store(home), CapacityScope("openai_batch", ACCOUNT, MODEL))


def attempts(home: Path, spec: JobSpec) -> list[Attempt]:
    store = Store(home)
    return [a for shard in Manifest(spec.name, store).shard_ids() for a in AttemptLog(store, spec.name, shard).all()]


def batch_owners(home: Path, specs: Iterable[JobSpec]) -> dict[str, str]:
    """Provider batch ID -> the job whose attempt log records it."""
    return {a.submitted.batch_id: spec.name for spec in specs for a in attempts(home, spec) if a.submitted}


def reservations(home: Path) -> list[dict]:
    """Every reservation of the account's ledger, in number order, with its bound and released records (or None)."""
    store = Store(home)
    held = ledger_of(home).dir
    out = []
    for rel in sorted(store.list_files(held, suffix=".json")):
        stem = rel.rsplit("/", 1)[1].removeprefix("r-").removesuffix(".json")
        if stem.isdigit():
            out.append(
                {
                    **store.read_json(rel),
                    "number": int(stem),
                    "bound": store.read_json(f"{held}/r-{stem}.bound.json"),
                    "released": store.read_json(f"{held}/r-{stem}.released.json"),
                }
            )
    return out


def at(record: dict) -> datetime:
    return datetime.fromisoformat(record["at"])


def assert_finished_once(home: Path, specs: Iterable[JobSpec], sandbox: SandboxAdmin) -> None:
    """Every item of every job valid, no job stopped, and each billed exactly once (and nothing else billed)."""
    billed = Counter(e["custom_id"] for e in sandbox.ledger())
    valid: set[str] = set()
    store = Store(home)
    for spec in specs:
        assert JobControl(store, spec.name).current() is None, f"job {spec.name} stopped"
        state = JobState.load(spec, store)
        counts = state.check()
        assert counts.valid == counts.expected == ROWS, (spec.name, counts)
        ids = set(state.states.filter(pl.col("state") == VALID)["request_id"])
        assert not ids & valid, "two jobs share request IDs: their bills cannot be told apart"
        valid |= ids
    twice = {rid: n for rid, n in billed.items() if n != 1}
    assert not twice, f"billed more than once: {twice}"
    assert set(billed) == valid, f"billed {len(billed)} requests for {len(valid)} items"


# -- what the sandbox's load ledger says ---------------------------------------------------------------------------
def openai_events(sandbox: SandboxAdmin) -> list[dict]:
    return [e for e in sandbox.load()["events"] if e["provider"] == "openai"]


def spans(events: list[dict]) -> dict[str, tuple[float, float]]:
    """Each batch's time in the queue (sandbox clock): from its enqueue to its release (still open: forever)."""
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    for e in events:
        if e["event"] == "enqueue":
            start.setdefault(e["batch_id"], e["t"])
        elif e["event"] == "release":
            end[e["batch_id"]] = e["t"]
    return {b: (t, end.get(b, float("inf"))) for b, t in start.items()}


def assert_within_cap(sandbox: SandboxAdmin, cap: int) -> list[dict]:
    """The account's queue never held more than ``cap`` tokens and never refused a batch (our ledger kept every
    job's batches inside the configured cap); returns the queue's events."""
    load = sandbox.load()
    events = [e for e in load["events"] if e["provider"] == "openai"]
    assert events, "nothing was ever queued"
    assert load["refusals"] == 0, "the provider refused a batch: admission let more into the queue than the cap"
    assert max(e["tokens"] for e in events) <= cap, f"the queue held more than {cap} tokens"
    return events


def assert_queue_shared(
    sandbox: SandboxAdmin, home: Path, specs: list[JobSpec], cap: int, together: bool = True
) -> None:
    """``assert_within_cap``; every batch in the queue is one of the jobs' (by their attempt logs), and (when
    ``together``) batches of every pair of jobs were in it at the same time."""
    events = assert_within_cap(sandbox, cap)
    owner = batch_owners(home, specs)
    queued = spans(events)
    assert set(queued) == set(owner), "the sandbox queued batches no attempt log records, or missed some"
    assert set(owner.values()) == {spec.name for spec in specs}, "a job never had a batch in the queue"
    if not together:
        return
    by_job = {spec.name: [queued[b] for b, job in owner.items() if job == spec.name] for spec in specs}
    for i, a in enumerate(specs):
        for b in specs[i + 1 :]:
            together = sum(1 for a0, a1 in by_job[a.name] for b0, b1 in by_job[b.name] if a0 < b1 and b0 < a1)
            assert together, f"jobs {a.name} and {b.name} never had batches in the queue at the same time"
