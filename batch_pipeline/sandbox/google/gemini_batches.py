"""Gemini Developer API files and batches, and the batches' clock-driven lifecycle (advanced lazily).

``BATCH_STATE_PENDING`` (``validating_s``) -> ``RUNNING`` (requests answered linearly over ``in_progress_s``,
then ``finalizing_s``) -> ``SUCCEEDED`` with a responses file, one line per request, ``{"key", "response"}`` or
``{"key", "error"}``. An input that does not parse ends ``FAILED`` (the operation's ``error`` says which line).
A cancel stops processing; ``cancelling_s`` later the batch is ``CANCELLED`` with a responses file of what was
answered. A batch still unfinished 48 h after creation, or at the end of ``in_progress`` under the ``expire``
scenario, is ``EXPIRED`` **with no responses file at all** (the Gemini semantics the pipeline must absorb).
Answered requests are billed when the batch ends with a responses file (never for an expired batch).

A batch of inline requests (``inputConfig.requests.requests``, what ``batches.create(src=[...])`` sends) has the
same lifecycle, quota and billing; its answers come back in the operation itself
(``output.inlinedResponses.inlinedResponses``, in input order, each ``{"response"|"error", "metadata"}``) instead
of a responses file. A file batch's requests are spooled at create and its answers appended to a part as they are
produced (``gemini_answers.py``), the part becoming its responses file; an inline batch keeps both in memory.

An embeddings batch (``asyncBatchEmbedContent``: ``EmbedContentRequest`` lines, ``sandbox/google/gemini_embed.py``)
has the same lifecycle, quota, files and billing (input tokens only); its operation carries the
``EmbedContentBatch`` type URLs.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from batch_pipeline.sandbox.batches import digest_order, lines_due, output_order
from batch_pipeline.sandbox.google.errors import RETRY_INFO, GoogleError
from batch_pipeline.sandbox.google.gemini_answers import RESPONSES, GeminiAnswers
from batch_pipeline.sandbox.google.gemini_embed import GeminiEmbedder, embed_problem, embed_tokens
from batch_pipeline.sandbox.google.gemini_files import GeminiFile, GeminiFiles, gemini_id
from batch_pipeline.sandbox.google.gemini_inputs import InputScan, contents_problem, parse_inline, scan_input
from batch_pipeline.sandbox.google.gemini_record import GeminiBatch
from batch_pipeline.sandbox.google.responder import GeminiResponder, prompt_tokens
from batch_pipeline.sandbox.quotas import DEFAULT_ACCOUNT, Load, LoadBook, quota, retry_after_s
from batch_pipeline.sandbox.scenarios import Scenario
from batch_pipeline.sandbox.spooled_lines import SpooledLines
from batch_pipeline.sandbox.spooled_parts import bill_rows
from batch_pipeline.sandbox.spooled_record import SpooledStore
from batch_pipeline.sandbox.store import Bill

MAX_INLINE_BYTES = 20 * 2**20  # the API's request payload limit, which bounds a create with inline requests


@dataclass(frozen=True)
class BatchAsk:
    """What a create asks for, whatever its input: the model, under which scenario, account and clock.
    ``clock`` is read once the input has been read; ``embed``: the requests are ``EmbedContentRequest`` s."""

    model: str
    display_name: str | None
    scenario: Scenario
    clock: Callable[[], float]
    account: str = DEFAULT_ACCOUNT
    scale: float = 1.0
    embed: bool = False

    @property
    def problem(self) -> Callable[[Any], str | None]:
        """What checks one request of this kind."""
        return embed_problem if self.embed else contents_problem


class GeminiService(SpooledStore[GeminiBatch]):
    """The batches of the Gemini API on one sandbox (callers hold the state lock); their files are ``files``."""

    record_type = GeminiBatch

    def __init__(
        self, responder: GeminiResponder, bill: Bill, files: GeminiFiles, load: LoadBook | None = None
    ) -> None:
        super().__init__(load)
        self.responder = responder
        self.embedder = GeminiEmbedder(responder.seen_keys)
        self.bill = bill
        self.files = files
        self.spool = files.spool.root

    def create(self, ask: BatchAsk, file_name: str) -> GeminiBatch:
        """A new batch (PENDING) of an uploaded JSONL file, its lines checked and spooled one at a time (read back
        by span when run; its answers go to parts). One whose input parses holds its prompt tokens for
        ``ask.account`` until it ends; past the server's ``quota_enqueued_tokens`` the create is a 429
        RESOURCE_EXHAUSTED instead."""
        stored = self.files.get(file_name.removeprefix("files/"))
        batch_id, scan, tokens = gemini_id(), InputScan(), [0]
        count = embed_tokens if ask.embed else prompt_tokens

        def counted(source: BinaryIO) -> Iterator[dict[str, Any]]:
            for item in scan_input(source, scan, ask.problem):
                item["prompt_tokens"] = count(ask.model, item["request"])
                tokens[0] += item["prompt_tokens"]
                yield item

        with stored.path.open("rb") as source:
            lines = SpooledLines.write(self.spool / f"{batch_id}.requests", counted(source))
        lines.columns["order"] = array("q", digest_order(scan.digest.hexdigest(), len(lines)))
        try:
            return self._create(ask, batch_id, f"files/{stored.id}", lines, scan.invalid, tokens[0])
        except BaseException:
            lines.release()
            raise

    def create_inline(self, ask: BatchAsk, config: Any) -> GeminiBatch:
        """A new batch of inline requests (``inputConfig.requests``): as ``create``, answered in the operation. Its
        requests and answers stay lists in memory: they are the create's body, at most the API's 20 MB payload
        (``MAX_INLINE_BYTES``)."""
        requests, invalid = parse_inline(config, ask.problem)
        count = embed_tokens if ask.embed else prompt_tokens
        for item in requests if invalid is None else []:
            item["prompt_tokens"] = count(ask.model, item["request"])
        tokens = sum(int(r.get("prompt_tokens", 0)) for r in requests)
        return self._create(ask, gemini_id(), "", requests, invalid, tokens)

    def _create(
        self,
        ask: BatchAsk,
        batch_id: str,
        input_file: str,
        requests: list[dict[str, Any]] | SpooledLines,
        invalid: str | None,
        tokens: int,
    ) -> GeminiBatch:
        scenario, inline = ask.scenario, not isinstance(requests, SpooledLines)
        if scenario.name == "fail_validation":
            invalid = f"Line {scenario.param('lines')[0]} was rejected (sandbox scenario fail_validation)."
        name, now = ask.model.removeprefix("models/"), ask.clock()
        if invalid is None:
            self._check_quota(scenario, ask.account, name, tokens, now, ask.scale)
        if isinstance(requests, SpooledLines):
            order: Any = requests.column("order")
        else:
            seed = json.dumps([r["request"] for r in requests], sort_keys=True).encode("utf-8")
            order = output_order(seed, len(requests))
        batch = GeminiBatch(
            batch_id,
            ask.display_name,
            ask.model,
            input_file,
            now,
            scenario,
            requests,
            order,
            invalid,
            results=[] if inline else GeminiAnswers(self.spool, batch_id),
            account=ask.account,
            inline=inline,
            embed=ask.embed,
        )
        self.add(batch)
        if invalid is None:
            self.book.hold("gemini", f"batches/{batch.id}", ask.account, {name: Load(tokens, len(requests), 1)}, now)
        return batch

    def _check_quota(self, scenario: Scenario, account: str, model: str, tokens: int, now: float, scale: float) -> None:
        cap = quota(scenario, "quota_enqueued_tokens")
        held = self.book.enqueued("gemini", account, model).tokens
        if not cap or held + tokens <= cap:
            return
        self.book.refuse("gemini", "", account, [model], now)
        ends = [
            b.processing_end + b.duration("finalizing_s")
            for b in self.records.values()
            if not b.ended and b.account == account and b.model.removeprefix("models/") == model
        ]
        wait = retry_after_s(min(ends, default=now) - now, scale)
        raise GoogleError(
            429,
            f"Enqueued token limit reached for {model}. Limit: {cap} enqueued tokens "
            f"({held} enqueued in batches pending or running, {tokens} in this batch). Please "
            "retry after some of your batches have finished.",
            details=[{"@type": RETRY_INFO, "retryDelay": f"{wait}s"}],
        )

    def not_found(self, batch_id: str) -> Exception:
        return GoogleError(404, f"Batch batches/{batch_id} not found.")

    def cancel(self, batch: GeminiBatch, now: float) -> None:
        """Stop processing; the batch is CANCELLED ``cancelling_s`` later (400 once it has ended)."""
        self.advance(batch, now)
        if batch.ended:
            raise GoogleError(
                400, f"Batch batches/{batch.id} is already in state {batch.state} and cannot be cancelled."
            )
        if batch.cancel_at is None:
            if batch.state == "BATCH_STATE_RUNNING":
                self._process_until(batch, now)
            batch.cancel_at = now
            batch.updated_at = now

    def delete(self, batch_id: str, now: float = 0.0) -> None:
        self.get(batch_id)
        self.records.pop(batch_id).release()
        self.book.release("gemini", f"batches/{batch_id}", now)

    def advance(self, batch: GeminiBatch, now: float) -> bool:
        """Apply every transition due by ``now``; True if anything changed."""
        if batch.ended:
            return False
        before = (batch.state, len(batch.results))
        expires = batch.expires_at
        if batch.cancel_at is not None:
            due = batch.cancel_due(batch.cancel_at)
            if now >= due:
                self._close(batch, "BATCH_STATE_CANCELLED", due)
        elif now >= batch.processing_start and batch.invalid is not None:
            self._close(batch, "BATCH_STATE_FAILED", batch.processing_start)
        elif now >= batch.processing_start:
            end = batch.processing_end
            done_at = end + batch.duration("finalizing_s")
            if expires < done_at and now >= expires:
                self._close(batch, "BATCH_STATE_EXPIRED", expires)
            elif batch.scenario.name == "expire" and now >= end:
                self._process_until(batch, end)
                self._close(batch, "BATCH_STATE_EXPIRED", end)
            else:
                batch.state = "BATCH_STATE_RUNNING"
                self._process_until(batch, min(now, end))
                if now >= done_at:
                    self._close(batch, "BATCH_STATE_SUCCEEDED", done_at)
        elif now >= expires:
            self._close(batch, "BATCH_STATE_EXPIRED", expires)
        changed = before != (batch.state, len(batch.results))
        if changed:
            batch.updated_at = batch.end_at if batch.ended else now
        return changed

    def _process_until(self, batch: GeminiBatch, at: float) -> None:
        due = lines_due(batch, batch.processing_start, at)
        answers: Any = batch.results
        while len(answers) < due:
            item = batch.requests[batch.order[len(answers)]]
            if batch.embed:
                answers.append(
                    self.embedder.answer(
                        item["key"], batch.model, item["request"], batch.scenario, item.get("prompt_tokens")
                    )
                )
                continue
            answers.append(
                self.responder.answer(
                    item["key"], batch.model, item["request"], batch.scenario, batch.id, item.get("prompt_tokens")
                )
            )
        if isinstance(answers, GeminiAnswers):
            answers.flush()  # on disk before the state is saved

    def _close(self, batch: GeminiBatch, state: str, at: float) -> None:
        """The batch ends: a file batch's answers' part becomes its responses file, the succeeded requests are
        billed (once; nothing for a failed or expired batch) and a file batch keeps its counts only."""
        batch.state, batch.end_at = state, at
        self.book.release("gemini", f"batches/{batch.id}", at)
        if state not in ("BATCH_STATE_FAILED", "BATCH_STATE_EXPIRED"):
            self._give_back(batch, at)
        if not batch.inline:
            batch.compact()

    def _give_back(self, batch: GeminiBatch, at: float) -> None:
        model, name = batch.model.removeprefix("models/"), f"batches/{batch.id}"
        answers = batch.results
        if not isinstance(answers, GeminiAnswers):  # inline: answered in the operation
            rows = (r.billed().ledger_row("gemini", name, r.key, model, at) for r in answers if r.succeeded)
            bill_rows(self.bill, iter(rows))
            return
        # the live API names the responses file after the batch: files/batch-<batch id>
        part = self.spool / f"{batch.id}.responses.jsonl"
        answers.take(RESPONSES, part)
        generated = GeminiFile(f"batch-{batch.id}", f"batch-{batch.id}", "application/jsonl", at, 0, "GENERATED")
        batch.output_file = f"files/{self.files.add_file(generated, part).id}"
        bill_rows(self.bill, answers.billing("gemini", model, at, batch_id=name))
