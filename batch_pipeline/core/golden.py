"""Golden probes and the canary gate.

Golden records (trusted labels) are mixed into shards as probes: every golden record into the canary
shard, and ``quality.golden_share`` of a shard's size into every other shard, so each shard reports its
own accuracy. A probe's request ID is salted with its shard, so probes never collide with items or with
each other; they are paid like any request but are not items of the job (reconciliation leaves them out).
The canary gate: once the canary shard has settled, its probe accuracy and structural failure rate must
meet the spec's thresholds, or the job stops before any other shard is submitted.
"""

import hashlib
import math
from dataclasses import asdict, dataclass

import polars as pl
import pyarrow as pa

from batch_pipeline.core.control import JobControl
from batch_pipeline.core.evals import load_golden, wilson
from batch_pipeline.core.paths import JobPaths
from batch_pipeline.core.spec import JobSpec
from batch_pipeline.core.store import Store


def probe_id(shard_id: str, golden_id: str) -> str:
    return hashlib.sha256(f"probe\x1f{shard_id}\x1f{golden_id}".encode()).hexdigest()


class GoldenProbes:
    def __init__(self, spec: JobSpec, store: Store):
        self.spec, self.store, self.paths = spec, store, JobPaths(spec.name)
        self._golden: pl.DataFrame | None = None

    @property
    def enabled(self) -> bool:
        return self.spec.quality is not None

    def golden(self) -> pl.DataFrame:
        if self._golden is None:
            self._golden = load_golden(self.spec)
        return self._golden

    def registry_path(self, shard_id: str) -> str:
        return f"{self.paths.root}/golden/probes/{shard_id}.parquet"

    def for_shard(self, shard_id: str, shard_items: int, canary: bool) -> pl.DataFrame:
        """The shard's probes (request_id, golden_id, user_prompt, label), chosen deterministically, recorded once."""
        rel = self.registry_path(shard_id)
        if self.store.exists(rel):
            return pl.read_parquet(self.store.read_bytes(rel))
        golden = self.golden()
        assert self.spec.quality is not None
        k = golden.height if canary else min(golden.height, max(1, math.ceil(self.spec.quality.golden_share
                                                                              * shard_items)))
        chosen = golden.with_columns(pl.col("golden_id").map_elements(
            lambda g: probe_id(shard_id, g), return_dtype=pl.String).alias("request_id")).sort("request_id").head(k)
        probes = chosen.select("request_id", "golden_id", "user_prompt", "label")
        self.store.write_table(rel, probes.to_arrow())
        return probes

    def all_probe_ids(self) -> pl.DataFrame:
        tables = [self.store.read_part(p, ["request_id", "golden_id", "label"])
                  for p in self.store.list_files(f"{self.paths.root}/golden/probes", suffix=".parquet")]
        tables = [t for t in tables if t is not None]
        if not tables:
            return pl.DataFrame(schema={"request_id": pl.String, "golden_id": pl.String, "label": pl.String})
        frame = pl.from_arrow(pa.concat_tables(tables))
        assert isinstance(frame, pl.DataFrame)
        return frame


@dataclass
class CanaryVerdict:
    shard_id: str
    passed: bool
    probes: int
    accuracy: float
    accuracy_low: float
    accuracy_high: float
    items: int
    failure_rate: float
    reason: str

    def as_dict(self) -> dict:
        return asdict(self)


def probe_accuracy(results: pl.DataFrame, probes: pl.DataFrame) -> pl.DataFrame:
    """Per shard: probes answered, correct, accuracy (latest answer per probe)."""
    answered = results.join(probes.select("request_id", "label"), on="request_id").sort("attempt") \
        .unique("request_id", keep="last")
    return answered.group_by("shard_id").agg(
        pl.len().alias("probes"),
        ((pl.col("status") == "succeeded") & (pl.col("parsed_output") == pl.col("label"))).sum().alias("correct"),
    ).with_columns((pl.col("correct") / pl.col("probes")).alias("accuracy")).sort("shard_id")


def judge_canary(spec: JobSpec, store: Store, shard_id: str, results: pl.DataFrame,
                 item_states: pl.DataFrame) -> CanaryVerdict:
    """Decide the canary; a failing canary stops the job (every other shard is refused until a human looks)."""
    assert spec.quality is not None
    probes = GoldenProbes(spec, store).for_shard(shard_id, 0, canary=True)
    answered = results.join(probes.select("request_id", "label"), on="request_id").sort("attempt") \
        .unique("request_id", keep="last").filter(pl.col("status") != "errored")  # a model answer, right or wrong
    correct = int(((answered["status"] == "succeeded") & (answered["parsed_output"] == answered["label"])).sum())
    ci = wilson(correct, answered.height)
    mine = item_states.filter(pl.col("shard_id") == shard_id)
    # structural failures: answers that break the contract (or items already dead), not transient errors
    tried = mine.filter(pl.col("attempts") > 0)
    failed = tried.filter((pl.col("last_status") == "invalid") | (pl.col("state") == "dead_lettered")).height
    failure_rate = failed / tried.height if tried.height else 0.0
    q = spec.quality
    reasons = []
    if answered.height == 0 or ci.estimate < q.canary_min_accuracy:
        reasons.append(f"golden accuracy {ci.estimate:.3f} [{ci.low:.3f}, {ci.high:.3f}] on {answered.height} probes "
                       f"< {q.canary_min_accuracy}")
    if failure_rate > q.canary_max_failure_rate:
        reasons.append(f"structural failure rate {failure_rate:.3f} > {q.canary_max_failure_rate}")
    verdict = CanaryVerdict(shard_id, not reasons, answered.height, ci.estimate, ci.low, ci.high, mine.height,
                            failure_rate, "; ".join(reasons) or "passed")
    store.write_json(f"{JobPaths(spec.name).root}/golden/canary.json", verdict.as_dict())
    if not verdict.passed:
        JobControl(store, spec.name).stop(f"canary shard {shard_id} failed: {verdict.reason}", code="canary_failed")
    return verdict


def canary_passed(spec: JobSpec, store: Store) -> dict | None:
    return store.read_json(f"{JobPaths(spec.name).root}/golden/canary.json")
