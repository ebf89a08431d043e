"""The store: torn parts and temporary names are ignored, writes are atomic, exclusive creates win once."""

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch_pipeline.core.ledger.result_parts import RESULT_SCHEMA, read_results
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import TMP_PREFIX, Store, parquet_bytes


def table(start: int, n: int) -> pa.Table:
    return pa.table({"request_id": [f"r{i}" for i in range(start, start + n)], "n": list(range(start, start + n))})


def torn_copy(store: Store, src: str, dst: str, keep: int) -> None:
    data = store.read_bytes(src)
    assert 0 <= keep < len(data)
    path = store.local_path(dst)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[:keep])  # written directly: a torn file, as a crashed copy would leave it


def result_rows(request_ids: list[str], shard: str, attempt: int) -> pa.Table:
    n = len(request_ids)
    cols = {f.name: pa.nulls(n, f.type) for f in RESULT_SCHEMA}
    cols.update(
        request_id=pa.array(request_ids),
        shard_id=pa.array([shard] * n),
        attempt=pa.array([attempt] * n, pa.int32()),
        status=pa.array(["succeeded"] * n),
    )
    return pa.table(cols, schema=RESULT_SCHEMA)


@pytest.mark.parametrize("keep", [0, 1, 7, 100, -9, -1])
def test_torn_part_is_ignored_with_a_warning(tmp_path, caplog, keep):
    store = Store(tmp_path)
    store.write_table("parts/a.parquet", table(0, 50))
    store.write_table("parts/b.parquet", table(50, 50))
    size = len(store.read_bytes("parts/b.parquet"))
    torn_copy(store, "parts/b.parquet", "parts/c.parquet", keep if keep >= 0 else size + keep)
    with caplog.at_level(logging.WARNING, logger="batch_pipeline.core.store"):
        assert store.read_part("parts/c.parquet") is None
        union = store.read_parts("parts")
    assert sorted(union.column("n").to_pylist()) == list(range(100))
    torn_warnings = [r for r in caplog.records if "torn" in r.getMessage() and "c.parquet" in r.getMessage()]
    assert len(torn_warnings) == 2


def test_a_part_without_a_column_asked_for_is_none_with_a_warning(tmp_path, caplog):
    """Parquet itself would leave the column out; the store refuses the part, as ``pq.read_table`` did, so an
    older part is never read as if it had the column (``result_parts._read_part`` asks only for what it has)."""
    store = Store(tmp_path)
    store.write_table("parts/a.parquet", pa.table({"n": [1, 2], "s": ["x", "y"]}))
    assert store.read_part("parts/a.parquet", ["s", "n"]).to_pydict() == {"s": ["x", "y"], "n": [1, 2]}
    with caplog.at_level(logging.WARNING, logger="batch_pipeline.core.store"):
        assert store.read_part("parts/a.parquet", ["n", "later"]) is None
    assert any("later" in r.getMessage() and "a.parquet" in r.getMessage() for r in caplog.records)


def test_missing_part_is_none_without_a_warning(tmp_path, caplog):
    store = Store(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert store.read_part("nope.parquet") is None
        assert store.read_parts("nothing-here") is None
    assert not caplog.records


def test_read_results_ignores_torn_and_temporary_parts(tmp_path, caplog):
    store = Store(tmp_path)
    paths = JobPaths("job")
    good = paths.result_part("s00001", 1, 1, "aaaa")
    store.write_table(good, result_rows(["a", "b"], "s00001", 1))
    store.write_table(paths.result_part("s00002", 1, 1, "bbbb"), result_rows(["c"], "s00002", 1))
    torn_copy(store, good, paths.result_part("s00001", 1, 2, "cccc"), 200)
    # a complete, valid part under a temporary name: a writer that has not renamed it yet
    tmp = f"{paths.results}/s00001/{TMP_PREFIX}0123456789ab-attempt-0001-flush-00003-dddd.parquet"
    pq.write_table(result_rows(["zzz"], "s00001", 1), store.local_path(tmp))
    with caplog.at_level(logging.WARNING, logger="batch_pipeline.core.store"):
        everything = read_results(store, "job")
        shard1 = read_results(store, "job", "s00001", ["request_id", "attempt", "status"])
    assert sorted(everything["request_id"].to_list()) == ["a", "b", "c"]
    assert sorted(shard1["request_id"].to_list()) == ["a", "b"]
    assert shard1.columns == ["request_id", "attempt", "status"]
    assert any("torn" in r.getMessage() for r in caplog.records)
    assert store.read_parts(paths.results).num_rows == 3


def test_read_results_keeps_one_row_per_request_and_attempt(tmp_path):
    """A re-collected attempt writes the same rows again; readers see them once."""
    store = Store(tmp_path)
    paths = JobPaths("job")
    store.write_table(paths.result_part("s1", 1, 1, "x1"), result_rows(["a", "b"], "s1", 1))
    store.write_table(paths.result_part("s1", 1, 1, "x2"), result_rows(["a", "b"], "s1", 1))  # re-collection
    store.write_table(paths.result_part("s1", 2, 1, "x3"), result_rows(["a"], "s1", 2))
    frame = read_results(store, "job", "s1")
    assert sorted(zip(frame["request_id"], frame["attempt"])) == [("a", 1), ("a", 2), ("b", 1)]
    # asking for columns without the key still dedups on the key
    assert read_results(store, "job", "s1", ["status"]).height == 3
    assert read_results(store, "job", "nothing").height == 0


def test_temporary_names_are_not_listed(tmp_path):
    store = Store(tmp_path)
    store.write_bytes("d/x.json", b"{}")
    (tmp_path / "d" / f"{TMP_PREFIX}abc-y.json").write_bytes(b"{}")
    (tmp_path / "d" / "sub").mkdir()
    store.write_bytes("d/sub/z.json", b"{}")
    assert store.list_files("d") == ["d/x.json"]
    assert store.list_files("d", recursive=True) == ["d/sub/z.json", "d/x.json"]
    assert store.list_files("d", recursive=True, suffix=".parquet") == []
    assert store.list_dirs("d") == ["sub"]
    assert store.list_files("no/such/dir") == []


def test_writes_leave_no_temporary_files(tmp_path):
    store = Store(tmp_path)
    for i in range(5):
        store.write_json(f"a/b/r{i}.json", {"i": i})
        store.write_table(f"a/t{i}.parquet", table(0, 3))
    leftovers = [p for p in tmp_path.rglob("*") if p.name.startswith(TMP_PREFIX)]
    assert leftovers == []
    assert store.read_json("a/b/r3.json") == {"i": 3}
    # overwriting replaces the whole file (rename), it does not append
    store.write_json("a/b/r3.json", {"i": 33})
    assert store.read_json("a/b/r3.json") == {"i": 33}


def test_parquet_writer_publishes_only_on_clean_exit(tmp_path):
    store = Store(tmp_path)
    schema = pa.schema([("n", pa.int64())])
    with pytest.raises(RuntimeError):
        with store.parquet_writer("out/p.parquet", schema) as w:
            w.write_table(pa.table({"n": [1, 2]}, schema=schema))
            raise RuntimeError("crash mid-write")
    assert not store.exists("out/p.parquet")
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    with store.parquet_writer("out/p.parquet", schema) as w:
        assert not store.exists("out/p.parquet")  # invisible while being written
        w.write_table(pa.table({"n": [1, 2]}, schema=schema))
        w.write_table(pa.table({"n": [3]}, schema=schema))
    assert store.read_part("out/p.parquet").column("n").to_pylist() == [1, 2, 3]


def test_a_table_written_to_disk_is_the_bytes_an_object_store_gets_and_a_failed_write_leaves_nothing(tmp_path):
    """On local disk ``write_table`` encodes straight into its temporary file; an object store gets the file encoded
    in memory (``parquet_bytes``). Both are the same bytes. An encode that fails midway leaves neither the file nor
    its temporary name, and an earlier file under that name stays as it was."""
    store = Store(tmp_path)
    data = table(0, 1000)
    store.write_table("t/a.parquet", data, compression="zstd", compression_level=1)
    assert store.read_bytes("t/a.parquet") == parquet_bytes(data, compression="zstd", compression_level=1).to_pybytes()
    with pytest.raises(pa.ArrowException):  # an unknown codec fails inside the encode, after the file was opened
        store.write_table("t/a.parquet", table(5, 5), compression="no-such-codec")
    with pytest.raises(pa.ArrowException):
        store.write_table("t/b.parquet", data, compression="no-such-codec")
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["a.parquet"]
    assert store.read_part("t/a.parquet").column("n").to_pylist() == list(range(1000))


def test_torn_json_record_reads_as_none_with_a_warning(tmp_path, caplog):
    store = Store(tmp_path)
    store.write_json("rec.json", {"a": 1, "b": [1, 2, 3]})
    data = store.read_bytes("rec.json")
    store.local_path("torn.json").write_bytes(data[: len(data) // 2])
    with caplog.at_level(logging.WARNING, logger="batch_pipeline.core.store"):
        assert store.read_json("torn.json") is None
    assert any("torn" in r.getMessage() for r in caplog.records)
    assert store.read_json("absent.json") is None
    assert store.read_json("rec.json") == {"a": 1, "b": [1, 2, 3]}


def test_create_json_exclusive_succeeds_once(tmp_path):
    store = Store(tmp_path)
    assert store.create_json_exclusive("leases/s1.json", {"owner": "a"}) is True
    assert store.create_json_exclusive("leases/s1.json", {"owner": "b"}) is False
    assert store.read_json("leases/s1.json") == {"owner": "a"}
    store.delete("leases/s1.json")
    assert store.create_json_exclusive("leases/s1.json", {"owner": "c"}) is True
    assert store.read_json("leases/s1.json") == {"owner": "c"}


def test_create_json_exclusive_has_one_winner_under_contention(tmp_path):
    store = Store(tmp_path)
    n = 16
    barrier = threading.Barrier(n)

    def claim(i: int) -> bool:
        barrier.wait()
        return Store(tmp_path).create_json_exclusive("leases/hot.json", {"owner": i})

    with ThreadPoolExecutor(n) as pool:
        won = list(pool.map(claim, range(n)))
    assert won.count(True) == 1
    assert store.read_json("leases/hot.json") == {"owner": won.index(True)}


def test_store_paths_stay_under_the_root(tmp_path):
    store = Store(tmp_path / "root")
    store.write_bytes("x/y.bin", b"abc")
    assert (tmp_path / "root" / "x" / "y.bin").read_bytes() == b"abc"
    assert store.exists("x/y.bin") and not store.exists("x/z.bin")
    assert store.uri("x/y.bin") == str((tmp_path / "root" / "x" / "y.bin").resolve())


def test_read_head_gives_the_first_rows_and_the_count_without_the_rest(tmp_path):
    import pyarrow as pa

    from batch_pipeline.core.store import Store

    store = Store(tmp_path)
    store.write_table(
        "t.parquet", pa.table({"n": list(range(1000)), "s": [str(i) for i in range(1000)]}), row_group_size=100
    )
    head, rows = store.read_head("t.parquet", 10)
    assert rows == 1000 and head.column("n").to_pylist() == list(range(10)) and head.column_names == ["n", "s"]
    head, _ = store.read_head("t.parquet", 250, ["s"])  # past the first row group (100 rows), one column
    assert head.column_names == ["s"] and head.column("s").to_pylist() == [str(i) for i in range(250)]
    store.write_table("e.parquet", pa.table({"n": pa.array([], pa.int64())}))
    head, rows = store.read_head("e.parquet")
    assert rows == 0 and head.num_rows == 0 and head.schema.field("n").type == pa.int64()


def test_shared_background_writes_reuse_long_lived_threads_and_wait_for_their_own_writes_only():
    from batch_pipeline.core.store import BackgroundWrites, shared_writers

    threads: set[threading.Thread] = set()
    release = threading.Event()
    with BackgroundWrites(depth=4, workers=2, shared=True) as other:
        slow = other.submit(release.wait, 10)  # another ingest's write, holding one of the pool's two workers
        for _ in range(3):
            done: list[int] = []
            writes = BackgroundWrites(depth=4, workers=2, shared=True)
            with writes:
                payload = writes.submit(lambda d=done: (threads.add(threading.current_thread()), d.append(1)))
                writes.submit(lambda p=payload, d=done: (p.result(), d.append(2)))  # lands after its payload
            assert done == [1, 2]  # every write of this instance finished on leaving the block
        assert not slow.done()  # ... and only those: the other instance's write is still running
        release.set()
    assert len(threads) <= 2  # the pool's own two threads, not two new ones per instance
    assert all(t.name.startswith("store-write") for t in threads)
    assert shared_writers(2) is shared_writers(2) and shared_writers(2).submit(lambda: 7).result() == 7  # still open
    with pytest.raises(RuntimeError, match="boom"), BackgroundWrites(workers=2, shared=True) as failing:
        failing.submit(lambda: (_ for _ in ()).throw(RuntimeError("boom")))
