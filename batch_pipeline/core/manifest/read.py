"""Read side of a job's committed manifest: generations, shards, the source rows and rejects that are live.

Each generation writes the rows (and rejects) of only the files it read. The latest generation record names,
per current input file, the generations whose rows parts hold that file's live rows (its last full read plus
any appends since), so ``rows()`` answers every source row of the current input without any generation
having re-read or re-written the rows of files that did not change.
"""

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from batch_pipeline.core.ledger.result_parts import PART_SCHEMA
from batch_pipeline.core.manifest.generation import GenerationRecord
from batch_pipeline.core.manifest.incremental import FileState
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store, empty_table

ITEM_SCHEMA = pa.schema(
    [
        ("request_id", pa.string()),
        ("shard_id", pa.string()),
        ("user_prompt", pa.string()),
        ("est_input_tokens", pa.int32()),
        ("length_bucket", pa.int8()),
        ("request_bytes", pa.int32()),
        ("source", pa.string()),
        ("line", pa.int64()),
        ("generation", pa.int32()),
    ]
)
ROW_SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("line", pa.int64()),
        ("source_key", pa.string()),
        ("request_id", pa.string()),
    ]
)
REJECT_SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("line", pa.int64()),
        ("field", pa.string()),
        ("kind", pa.string()),
        ("reason", pa.string()),
        ("raw", pa.string()),
    ]
)
# the columns of a request's valid result that the validated table carries as they are, after its output
ANSWER_COLUMNS = (
    "output_text",
    "finish_reason",
    "model",
    "prompt_version",
    "backend",
    "pricing",
    "attempt",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
    "cost_usd",
)
# a job's validated table (publish.validated writes it; an upstream job's is read as the next job's input)
VALIDATED_SCHEMA = pa.schema(
    [
        *ROW_SCHEMA,  # source, line, source_key, request_id
        PART_SCHEMA.field("shard_id"),
        pa.field("output", pa.string()),
        *[PART_SCHEMA.field(c) for c in ANSWER_COLUMNS],
        pa.field("is_duplicate", pa.bool_()),
        PART_SCHEMA.field("provider_batch_id"),
    ]
)
VALIDATED_COLUMNS = VALIDATED_SCHEMA.names


def canary_of(shard_ids: Sequence[str]) -> str | None:
    """The canary shard: the first in shard order. The one place that says which (the view, the quote and the
    shard runs ask it)."""
    return shard_ids[0] if shard_ids else None


class Manifest:
    """Read side of a job's committed manifest generations."""

    def __init__(self, job: str, store: Store):
        self.job, self.store, self.paths = job, store, JobPaths(job)

    def generations(self) -> list[GenerationRecord]:
        out = [self.store.read_json(p) for p in self.store.list_files(self.paths.generations, suffix=".json")]
        return [GenerationRecord.model_validate(g) for g in out if g]

    def last_generation(self) -> int:
        gens = self.generations()
        return max((g.generation for g in gens), default=0)

    def latest(self) -> GenerationRecord | None:
        gens = self.generations()
        return max(gens, key=lambda g: g.generation) if gens else None

    def shard_ids(self) -> list[str]:
        return sorted(s for g in self.generations() for s in g.new_shards)

    def canary_shard_id(self) -> str | None:
        """The canary shard (``canary_of``)."""
        return canary_of(self.shard_ids())

    def max_shard_number(self) -> int:
        return max((int(s[1:]) for s in self.shard_ids()), default=0)

    def shard_items(self, shard_id: str, columns: list[str] | None = None) -> pa.Table:
        table = self.store.read_part(self.paths.shard_items(shard_id), columns)
        if table is None:
            raise FileNotFoundError(f"manifest of job {self.job} has no readable items for shard {shard_id}")
        return table

    def shard_totals(self) -> dict[str, tuple[int, int]]:
        """Every shard -> (items, sum of their est_input_tokens), in shard order: as each generation stored them
        (``GenerationRecord.shard_totals``), or, for a generation written before it stored them, computed from its
        shard files (the est_input_tokens column of each)."""
        out: dict[str, tuple[int, int]] = {}
        for g in self.generations():
            stored = g.totals()
            if stored is None:
                stored = {s: _column_totals(self.shard_items(s, ["est_input_tokens"])) for s in g.new_shards}
            out.update(stored)
        return dict(sorted(out.items()))

    def items_of(self, shard_ids: Sequence[str], columns: list[str]) -> pa.Table:
        """The items of the listed shards (``columns`` of them), in that order."""
        tables = [self.shard_items(s, columns) for s in shard_ids]
        return pa.concat_tables(tables) if tables else empty_table(pa.schema([ITEM_SCHEMA.field(c) for c in columns]))

    def item_index(self, columns: list[str] | None = None) -> pa.Table:
        return self.items_of(
            self.shard_ids(), columns or ["request_id", "shard_id", "est_input_tokens", "length_bucket"]
        )

    def file_states(self, latest: GenerationRecord | None = None) -> dict[str, FileState]:
        """Each input file as the latest generation left it (none for generations before incremental builds)."""
        latest = latest if latest is not None else self.latest()
        return {state.uri: state for state in latest.files} if latest is not None else {}

    def live_parts(self) -> dict[int, list[str]]:
        """Generation -> the sources whose live rows are in that generation's rows and rejects parts."""
        latest = self.latest()
        if not latest:
            return {}
        states = self.file_states(latest)
        if not states:  # a generation before incremental builds: its own parts hold every row
            return {latest.generation: []}
        out: dict[int, list[str]] = {}
        for uri, state in states.items():
            for g in state.row_generations:
                out.setdefault(g, []).append(uri)
        return out

    def rows(self) -> pa.Table:
        """Every source row of the current input: (source, line, source_key, request_id)."""
        return self._live(self.paths.rows, ROW_SCHEMA)

    def rejects(self) -> pa.Table:
        return self._live(self.paths.rejects, REJECT_SCHEMA)

    def live_counts(self) -> tuple[int, int]:
        """(source rows, rejects) of the current input: what ``rows()`` and ``rejects()`` hold, counted from one
        column (a part shared with files since re-read is filtered by source)."""
        counts = []
        for path_of in (self.paths.rows, self.paths.rejects):
            n = 0
            for gen, sources in self.live_parts().items():
                t = self.store.read_part(path_of(gen), ["source"])
                if t is None:
                    continue
                if sources:
                    n += pc.sum(pc.is_in(t.column("source"), value_set=pa.array(sources, pa.string()))).as_py() or 0
                else:
                    n += t.num_rows
            counts.append(n)
        return counts[0], counts[1]

    def row_parts(self) -> list[str]:
        """The rows parts that hold live rows (each may also hold rows of files since re-read: filter by
        ``rows()`` semantics when reading them directly)."""
        return [self.paths.rows(g) for g in sorted(self.live_parts())]

    def _live(self, path_of, schema: pa.Schema) -> pa.Table:
        tables = []
        for gen, sources in sorted(self.live_parts().items()):
            t = self.store.read_part(path_of(gen))
            if t is None or not t.num_rows:
                continue
            if sources:
                t = t.filter(pc.is_in(t.column("source"), value_set=pa.array(sources, pa.string())))
            tables.append(t.cast(schema))
        return pa.concat_tables(tables) if tables else empty_table(schema)


def _column_totals(table: pa.Table) -> tuple[int, int]:
    """(rows, sum of est_input_tokens) of a shard file's column."""
    return table.num_rows, int(pc.sum(table.column("est_input_tokens")).as_py() or 0)
