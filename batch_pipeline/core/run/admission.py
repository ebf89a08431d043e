"""The runner's side of admission: a provider batch is created only inside a reservation that fits the account's
queue (core/ledger/capacity.py), and a refusal ("not now") is learned from, never a job stop.

Before the intent of an attempt, the runner reserves what the batch will hold (enqueued tokens by the quote's
tokenizer counts, requests, one job), and sends only the items that fit (``fitting_prefix``: all, a part, or
nothing yet: ``QuotaWait``). After the create the reservation is bound to the batch; when the batch ends or the
attempt is closed it is released. A create refused for capacity (``QuotaError``) closes the attempt with nothing
billed, releases its reservation and teaches the ledger the limit.
"""

import logging
import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from batch_pipeline.core.errors import BatchPipelineError, QuotaError
from batch_pipeline.core.ledger.admission import decide, fitting_prefix
from batch_pipeline.core.ledger.capacity import CapacityLedger, CapacityScope, Dimension, Holding, Need, Snapshot
from batch_pipeline.core.manifest.read import Manifest
from batch_pipeline.core.money.estimate import RequestTokens
from batch_pipeline.core.money.quote_record import read_quote
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.quota import QuotaSpec
from batch_pipeline.core.store import Store

log = logging.getLogger(__name__)
RESERVE_TRIES = 5


class QuotaWait(BatchPipelineError):
    """The shard's next batch does not fit in the account's queue now; the message gives the figures."""

    retryable = True


@runtime_checkable
class QueueCappedExecutor(Protocol):
    quota_dimensions: tuple[Dimension, ...]

    def capacities(self, model: str) -> list[tuple[str | None, CapacityScope, QuotaSpec]]: ...


def ledgers_for(store: Store, executor: object, model: str) -> dict[str | None, CapacityLedger]:
    """The capacity ledger of each of the executor's accounts, by account name ({}: no provider queue)."""
    if not isinstance(executor, QueueCappedExecutor):
        return {}
    return {
        label: CapacityLedger(store, scope, quota, hold_ttl=store.lease_ttl)
        for label, scope, quota in executor.capacities(model)
    }


@dataclass(frozen=True)
class Admitted:
    """An attempt's place in one account's queue."""

    account: str | None
    holding: Holding


class TokenCounts:
    """Input tokens per request as the quote counts them (its tokenizer model and calibration), plus headroom."""

    def __init__(self, store: Store, spec: JobSpec, headroom: float = 0.0):
        quote = read_quote(store, spec.name)
        self.model: RequestTokens | None = quote.tokenizer if quote is not None else None
        self.factor = (quote.calibration.tokenizer_factor if quote is not None else 1.0) * (1 + headroom)

    def per_item(self, est: np.ndarray) -> np.ndarray:
        est = est.astype(np.float64)
        if self.model is not None:
            est = (
                np.clip(est - self.model.fixed_estimated, 0, None) * self.model.per_estimated + self.model.fixed_tokens
            )
        return np.ceil(est * self.factor).astype(np.int64)

    def total(self, est_sum: float, requests: int) -> int:
        tokens = self.model.tokens(est_sum, requests) if self.model is not None else est_sum
        return math.ceil(tokens * self.factor)

    def estimate_prompts(self, prompts: pa.Array) -> np.ndarray:
        """The manifest's cheap estimate for prompts it does not hold (golden probes): bytes / 4 + the fixed part."""
        nbytes = pc.binary_length(pc.cast(prompts, pa.binary())).to_numpy(zero_copy_only=False)
        fixed = self.model.fixed_estimated if self.model is not None else 0
        return np.ceil(nbytes / 4).astype(np.int64) + fixed


class Admission:
    def __init__(self, store: Store, spec: JobSpec, executor: object, min_items: int = 0):
        self.store, self.spec = store, spec
        self.ledgers = ledgers_for(store, executor, spec.model)
        self.min_items = max(min_items, 1)

    def admit(
        self, shard_id: str, attempt: int, items: pa.Table, extra: pa.Table | None
    ) -> tuple[pa.Table, Admitted | None]:
        """The items this attempt sends (all, or the part that fits, golden probes first) and its place: in the
        first account whose queue takes them whole, else the one that takes the most. Raises ``QuotaWait`` when
        nothing worth a batch fits in any account now."""
        whole = items if extra is None else _items_then_extra(items, extra)
        if not self.ledgers:
            return whole, None
        batch = (
            whole if extra is None else pa.concat_tables([whole.slice(items.num_rows), whole.slice(0, items.num_rows)])
        )
        headroom = max(ledger.quota.headroom for ledger in self.ledgers.values())
        counts = TokenCounts(self.store, self.spec, headroom)
        tokens = np.concatenate(
            [
                counts.estimate_prompts(extra.column("user_prompt")) if extra is not None else np.zeros(0, np.int64),
                counts.per_item(self._est(shard_id, items)),
            ]
        )
        n_extra = 0 if extra is None else extra.num_rows
        reasons: list[str] = []
        for _ in range(RESERVE_TRIES):
            reasons = []
            best: tuple[int, str | None, Snapshot] | None = None
            for label, ledger in self.ledgers.items():
                snap = ledger.snapshot()
                k = fitting_prefix(snap, tokens)
                if k == len(tokens):
                    best = (k, label, snap)
                    break
                if k >= self.min_items and k > n_extra and (best is None or k > best[0]):
                    best = (k, label, snap)
                reasons.append(self._why(snap, tokens))
            if best is None:
                raise QuotaWait(f"shard {shard_id}: " + "; ".join(reasons))
            k, label, snap = best
            holding = self.ledgers[label].reserve(self.spec.name, shard_id, attempt, Need(int(tokens[:k].sum()), k, 1))
            if holding is None:  # another job took the room meanwhile: look again
                continue
            if k < len(tokens):
                log.info(
                    "shard %s: attempt %d sends %d of %d items (what fits in the queue: %s)",
                    shard_id,
                    attempt,
                    k - n_extra,
                    items.num_rows,
                    snap.describe(),
                )
                return batch.slice(0, k), Admitted(label, holding)
            return whole, Admitted(label, holding)
        raise QuotaWait(f"shard {shard_id}: the queue filled while it was being reserved: {'; '.join(reasons)}")

    def _why(self, snap: Snapshot, tokens: np.ndarray) -> str:
        _, dim = decide(snap, Need(int(tokens.sum()), len(tokens), 1))
        return f"quota: {snap.describe(dim)}; sent when a batch ends and frees room"

    def _est(self, shard_id: str, items: pa.Table) -> np.ndarray:
        manifest = pl.from_arrow(
            Manifest(self.spec.name, self.store).shard_items(shard_id, ["request_id", "est_input_tokens"])
        )
        assert isinstance(manifest, pl.DataFrame)
        ids = pl.from_arrow(items.select(["request_id"]))
        assert isinstance(ids, pl.DataFrame)
        joined = ids.join(manifest, on="request_id", how="left", maintain_order="left")
        return joined["est_input_tokens"].fill_null(0).to_numpy()

    # -- after the create -------------------------------------------------------------------------------------
    def bound(self, admitted: Admitted | None, batch_id: str) -> None:
        if admitted is not None:
            ledger = self.ledgers[admitted.account]
            ledger.bind(admitted.holding.number, batch_id)
            ledger.clean_submission()

    def reattached(
        self,
        shard_id: str,
        attempt: int,
        request_ids: list[str],
        batch_id: str,
        account: str | None,
        number: int | None,
    ) -> None:
        """A batch found at the provider after a crash holds its place, fit or not: its own reservation when it
        is still live, else a new one."""
        ledger = self.ledgers.get(account) or next(iter(self.ledgers.values()), None)
        if ledger is None:
            return
        live = (
            number is not None
            and ledger.store.exists(ledger._rel(number))
            and not ledger.store.exists(ledger._rel(number, ".released"))
        )
        if not live:
            ids = pa.table({"request_id": pa.array(request_ids, pa.string())})
            counts = TokenCounts(self.store, self.spec, ledger.quota.headroom)
            need = Need(int(counts.per_item(self._est(shard_id, ids)).sum()), len(request_ids), 1)
            holding = ledger.reserve(self.spec.name, shard_id, attempt, need, force=True)
            number = holding.number if holding is not None else None
        if number is not None:
            ledger.bind(number, batch_id)

    def held(self, shard_id: str, attempt: int) -> Admitted | None:
        """The place this attempt holds, in whichever account."""
        for label, ledger in self.ledgers.items():
            for h in ledger.snapshot(sweep=False).holdings:
                if (h.job, h.shard_id, h.attempt) == (self.spec.name, shard_id, attempt):
                    return Admitted(label, h)
        return None

    def refused(self, admitted: Admitted | None, exc: QuotaError, account: str | None = None) -> str:
        """Release the refused batch's place and learn the limit; the note for the attempt log."""
        label = admitted.account if admitted is not None else account
        ledger = self.ledgers.get(label) or next(iter(self.ledgers.values()), None)
        if ledger is None:
            return str(exc)
        if admitted is not None:
            ledger.release(admitted.holding.number, "refused by the provider")
        dim = Dimension(exc.dimension)
        load = ledger.snapshot().in_use(dim)
        limit = ledger.learn(dim, exc.limit, load, admitted.holding.need.get(dim) if admitted is not None else 0)
        return f"{exc} (the account's limit is now taken as {limit} {dim.label})"

    def release(self, shard_id: str, attempt: int, why: str) -> None:
        for ledger in self.ledgers.values():
            ledger.release_attempt(self.spec.name, shard_id, attempt, why)


def _items_then_extra(items: pa.Table, extra: pa.Table) -> pa.Table:
    """The order a whole attempt has always been sent in: the shard's items, then the probes riding along."""
    return pa.concat_tables(
        [
            items.select(["request_id", "user_prompt"]),
            extra.select(["request_id", "user_prompt"]).cast(items.select(["request_id", "user_prompt"]).schema),
        ]
    )
