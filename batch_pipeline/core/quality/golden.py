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

from batch_pipeline.core.ledger.control import JobControl
from batch_pipeline.core.quality.evals import load_golden, wilson
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.paths import JobPaths
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
        recorded = self.recorded(shard_id)
        if recorded is not None:
            return recorded
        probes = self._choose(shard_id, shard_items, canary)
        self.store.write_table(self.registry_path(shard_id), probes.to_arrow())
        return probes

    def recorded(self, shard_id: str) -> pl.DataFrame | None:
        """The shard's probes as recorded when they were first attached; None before that."""
        rel = self.registry_path(shard_id)
        return pl.read_parquet(self.store.read_bytes(rel)) if self.store.exists(rel) else None

    def _choose(self, shard_id: str, shard_items: int, canary: bool) -> pl.DataFrame:
        golden = self.golden()
        assert self.spec.quality is not None
        k = (
            golden.height
            if canary
            else min(golden.height, max(1, math.ceil(self.spec.quality.golden_share * shard_items)))
        )
        ids = pl.Series("request_id", [probe_id(shard_id, g) for g in golden["golden_id"].to_list()], pl.String)
        chosen = golden.with_columns(ids).sort("request_id").head(k)
        return chosen.select("request_id", "golden_id", "user_prompt", "label")

    def riding(self, shard_sizes: dict[str, int], canary_shard: str | None, answered: pl.DataFrame) -> pl.DataFrame:
        """The probes that go out with the next submission of each listed shard (shard_id, request_id, golden_id,
        user_prompt), as the shard runner's probe hook attaches them: every golden record with the canary shard,
        ``golden_share`` of its size with any other, and none again once any probe of the shard has a result
        (``answered``: result rows with request_id). Nothing is recorded: a shard's recorded choice, where there is
        one, else the choice ``for_shard`` will record. ``shard_sizes``: shard -> its items (all, not only pending)."""
        empty = pl.DataFrame(
            schema={"shard_id": pl.String, "request_id": pl.String, "golden_id": pl.String, "user_prompt": pl.String}
        )
        if not self.enabled or not shard_sizes:
            return empty
        recorded = {
            rel.rsplit("/", 1)[-1].removesuffix(".parquet")
            for rel in self.store.list_files(f"{self.paths.root}/golden/probes", suffix=".parquet")
        }
        frames = []
        for shard_id, size in shard_sizes.items():
            probes = self.recorded(shard_id) if shard_id in recorded else None
            if probes is None:
                probes = self._choose(shard_id, size, shard_id == canary_shard)
            frames.append(probes.select(pl.lit(shard_id).alias("shard_id"), "request_id", "golden_id", "user_prompt"))
        probes = pl.concat(frames)
        if answered.height:
            done = probes.join(answered.select("request_id"), on="request_id", how="semi")["shard_id"].unique()
            probes = probes.filter(~pl.col("shard_id").is_in(done.to_list()))
        return probes

    def all_probe_ids(self) -> pl.DataFrame:
        tables = [
            self.store.read_part(p, ["request_id", "golden_id", "label"])
            for p in self.store.list_files(f"{self.paths.root}/golden/probes", suffix=".parquet")
        ]
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
    answered = (
        results.join(probes.select("request_id", "label"), on="request_id")
        .sort("attempt")
        .unique("request_id", keep="last")
    )
    return (
        answered.group_by("shard_id")
        .agg(
            pl.len().alias("probes"),
            ((pl.col("status") == "succeeded") & (pl.col("parsed_output") == pl.col("label"))).sum().alias("correct"),
        )
        .with_columns((pl.col("correct") / pl.col("probes")).alias("accuracy"))
        .sort("shard_id")
    )


def canary_sample(items: pl.DataFrame, size: int) -> list[str]:
    """``size`` request IDs of a shard spread evenly over its length order (a stratified sample across length
    buckets: short, typical and long prompts all ride in the canary). Deterministic."""
    if items.height <= size:
        return items["request_id"].to_list()
    ordered = items.sort("est_input_tokens", "request_id")["request_id"]
    step = items.height / size
    return [ordered[int(i * step + step / 2)] for i in range(size)]


def judge_canary(
    spec: JobSpec, store: Store, shard_id: str, results: pl.DataFrame, item_states: pl.DataFrame, *, final: bool = True
) -> CanaryVerdict | None:
    """Decide the canary from what its attempt(s) answered; a failing canary stops the job.

    The structural failure rate (answers that break the contract, truncation included, over the items that got
    an answer) is gated always; golden accuracy when the job has a golden set. With no evidence yet (nothing
    answered: every request errored transiently) and ``final`` False, there is no verdict: the canary runs again.
    """
    mine = item_states.filter(pl.col("shard_id") == shard_id)
    answered_items = mine.filter(
        (pl.col("attempts") > 0) & pl.col("last_status").is_in(["succeeded", "invalid"]) | (pl.col("state") == "valid")
    )
    failed = answered_items.filter(pl.col("last_status") == "invalid").height
    failure_rate = failed / answered_items.height if answered_items.height else 1.0
    reasons = []
    probes_n, acc, low, high = 0, 1.0, 1.0, 1.0
    if spec.quality is not None:
        probes = GoldenProbes(spec, store).for_shard(shard_id, 0, canary=True)
        answered = (
            results.join(probes.select("request_id", "label"), on="request_id")
            .sort("attempt")
            .unique("request_id", keep="last")
            .filter(pl.col("status") != "errored")
        )  # a model answer
        correct = int(((answered["status"] == "succeeded") & (answered["parsed_output"] == answered["label"])).sum())
        ci = wilson(correct, answered.height)
        probes_n, acc, low, high = answered.height, ci.estimate, ci.low, ci.high
        if answered.height == 0 and not final:
            return None
        if answered.height == 0 or ci.estimate < spec.quality.canary_min_accuracy:
            reasons.append(
                f"golden accuracy {ci.estimate:.3f} [{ci.low:.3f}, {ci.high:.3f}] on {answered.height} "
                f"probes < {spec.quality.canary_min_accuracy}"
            )
    if answered_items.height == 0 and not final:
        return None
    if failure_rate > spec.canary.max_failure_rate:
        what = (
            f"{failed} of {answered_items.height} answers broke the output contract"
            if answered_items.height
            else "no canary item got an answer"
        )
        reasons.append(
            f"structural failure rate {failure_rate:.3f} > canary.max_failure_rate "
            f"{spec.canary.max_failure_rate} ({what})"
        )
    verdict = CanaryVerdict(
        shard_id,
        not reasons,
        probes_n,
        acc,
        low,
        high,
        answered_items.height,
        failure_rate,
        "; ".join(reasons) or "passed",
    )
    store.write_json(JobPaths(spec.name).canary_verdict, verdict.as_dict())
    if not verdict.passed:
        JobControl(store, spec.name).stop(f"canary shard {shard_id} failed: {verdict.reason}", code="canary_failed")
    return verdict


def canary_passed(spec: JobSpec, store: Store) -> CanaryVerdict | None:
    """The canary's recorded verdict, or None while it has not been judged."""
    raw = store.read_json(JobPaths(spec.name).canary_verdict)
    return CanaryVerdict(**raw) if raw else None
