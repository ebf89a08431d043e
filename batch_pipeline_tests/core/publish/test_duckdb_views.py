"""The DuckDB file's views over an incremental manifest: ``source_rows`` and ``rejects`` hold every live row of
every generation (each file's rows stay in the generation that read them), not only the last generation's."""

import duckdb

from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.publish.tables import write_duckdb_views
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline_tests.core.helpers import base_spec_dict, write_jsonl, write_spec


def counts(store: Store, job: str) -> tuple[int, int, int]:
    con = duckdb.connect(str(store.local_path(JobPaths(job).duckdb)), read_only=True)
    try:
        return tuple(
            con.execute(f"SELECT count(*) FROM {view}").fetchone()[0]
            for view in ("source_rows", "rejects", "(SELECT DISTINCT source FROM source_rows)")
        )
    finally:
        con.close()


def test_views_follow_the_live_rows_of_every_generation(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    write_jsonl(inputs / "day1.jsonl", [*({"id": f"a{i}", "body": f"ticket {i}"} for i in range(12)), b"{not json"])
    spec = write_spec(tmp_path / "job", base_spec_dict(str(inputs)))
    store = Store(tmp_path / "store")
    build_manifest(spec, store)
    write_duckdb_views(store, spec.name)
    assert counts(store, spec.name) == (12, 1, 1)
    # a new daily file: generation 2 reads only it, and its rows live in generation 2's parts
    write_jsonl(inputs / "day2.jsonl", [*({"id": f"b{i}", "body": f"new ticket {i}"} for i in range(5)), b"[1, 2]"])
    build_manifest(spec, store)
    manifest = Manifest(spec.name, store)
    assert manifest.last_generation() == 2 and sorted(manifest.live_parts()) == [1, 2]
    write_duckdb_views(store, spec.name)
    assert counts(store, spec.name) == (manifest.rows().num_rows, manifest.rejects().num_rows, 2) == (17, 2, 2)
