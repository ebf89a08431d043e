"""The passes of a multi-pass job merged: one final answer per source row, and the pass that produced it.

Every pass keeps the first pass's row identity (``source``, ``line``: ``core/manifest/upstream.py``), so the
merge is a left join of each later pass's validated table onto the first's: a row's final answer is the one of
the last pass that answered it, else of the pass before, down to the first pass (a row no later pass selected,
or one it rejected or dead-lettered, keeps its earlier answer). The ``cascade`` view in the last pass's DuckDB
file is this query over the passes' validated Parquet files, so it follows every pass's latest publish.

``pass_costs`` is the report's side: cost per accepted item of each pass and of the whole cascade (every pass's
spend over the source rows with a final answer).
"""

import duckdb
import pyarrow as pa

from batch_pipeline.core.manifest.upstream import chain
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store


def _published(store: Store, passes: list[JobSpec]) -> list[JobSpec]:
    """The passes up to the first that has not published (a later one cannot have rows without it)."""
    out = []
    for spec in passes:
        if not store.exists(JobPaths(spec.name).validated):
            break
        out.append(spec)
    return out


def cascade_sql(sources: list[str], jobs: list[str]) -> str:
    """The merge over the passes' tables (``sources``: a table expression per pass, the first pass first)."""
    alias = [f"p{i + 1}" for i in range(len(sources))]
    joins = [f"{sources[0]} AS p1"]
    joins += [
        f"LEFT JOIN {src} AS {a} ON {a}.source = p1.source AND {a}.line = p1.line"
        for src, a in zip(sources[1:], alias[1:])
    ]
    latest_first = list(reversed(list(enumerate(alias, start=1))))

    def pick(column: str) -> str:
        whens = " ".join(f"WHEN {a}.request_id IS NOT NULL THEN {a}.{column}" for _, a in latest_first)
        return f"CASE {whens} END"

    number = "CASE " + " ".join(f"WHEN {a}.request_id IS NOT NULL THEN {n}" for n, a in latest_first) + " END"
    job = "CASE " + " ".join(f"WHEN {a}.request_id IS NOT NULL THEN '{jobs[n - 1]}'" for n, a in latest_first) + " END"
    per_pass = ", ".join(f"{a}.output AS pass_{n}_output" for n, a in enumerate(alias, start=1))
    return (
        f"SELECT p1.source, p1.line, p1.source_key, {pick('output')} AS output, {number} AS pass, "
        f"{job} AS job, {pick('model')} AS model, {pick('request_id')} AS request_id, {per_pass} "
        f"FROM {' '.join(joins)} ORDER BY p1.source, p1.line"
    )


def cascade_view(spec: JobSpec, store: Store) -> str | None:
    """``CREATE VIEW cascade`` for the DuckDB file of ``spec`` (local stores), over every pass that published;
    None for a one-pass job."""
    if spec.input.from_job is None:
        return None
    passes = _published(store, chain(spec))
    if len(passes) < 2:
        return None
    paths = [store.local_path(JobPaths(p.name).validated) for p in passes]
    sources = [f"read_parquet('{p}')" for p in paths]
    return f"CREATE VIEW cascade AS {cascade_sql(sources, [p.name for p in passes])}"


def cascade_rows(spec: JobSpec, store: Store) -> pa.Table:
    """The merged rows, read through Arrow datasets (any store): what the ``cascade`` view holds."""
    passes = _published(store, chain(spec))
    con = duckdb.connect()
    try:
        for i, p in enumerate(passes):
            con.register(
                f"pass_{i + 1}",
                store.dataset(JobPaths(p.name).validated),
            )
        return con.sql(
            cascade_sql([f"pass_{i + 1}" for i in range(len(passes))], [p.name for p in passes])
        ).to_arrow_table()
    finally:
        con.close()


def pass_costs(spec: JobSpec, store: Store, own: dict | None = None) -> dict:
    """Cost per accepted item of each pass (its spend over its valid requests) and of the cascade (all passes'
    spend over the source rows with a final answer). ``own``: this pass's ``cost_usd`` and ``succeeded`` as its
    report has them (its validated table may be the previous publish)."""
    passes = chain(spec)
    rows = []
    for n, p in enumerate(passes, start=1):
        rel = JobPaths(p.name).validated
        cost, accepted = 0.0, 0
        if store.exists(rel):
            con = duckdb.connect()
            try:
                con.register("v", store.dataset(rel))
                got = con.execute(
                    "SELECT coalesce(sum(cost_usd), 0), count(*) FILTER (WHERE NOT is_duplicate) FROM v"
                ).fetchone()
            finally:
                con.close()
            cost, accepted = float(got[0]), int(got[1])  # type: ignore[index]
        if p.name == spec.name and own is not None:
            cost, accepted = float(own["cost_usd"]), int(own["succeeded"])
        rows.append(
            {
                "pass": n,
                "job": p.name,
                "model": p.model,
                "backend": p.backend.name,
                "cost_usd": round(cost, 6),
                "accepted": accepted,
                "cost_per_accepted_item_usd": round(cost / accepted, 8) if accepted else None,
            }
        )
    final = cascade_rows(spec, store).num_rows if store.exists(JobPaths(passes[0].name).validated) else 0
    total = sum(r["cost_usd"] for r in rows)
    return {
        "passes": rows,
        "total": {
            "cost_usd": round(total, 6),
            "final_answers": final,
            "cost_per_accepted_item_usd": round(total / final, 8) if final else None,
        },
    }
