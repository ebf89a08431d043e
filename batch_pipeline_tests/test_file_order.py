"""The suite's file order: longest measured files first, each file's tests kept together and in order."""

import json
from types import SimpleNamespace

from batch_pipeline_tests import file_order


def items(*nodeids: str) -> list:
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def test_files_run_longest_first_with_their_tests_together_and_in_order():
    collected = items("a.py::t1", "b.py::t1", "a.py::t2", "c.py::t1", "d.py::t1", "b.py::t2")
    seconds = {"a.py": 2.0, "b.py": 60.0, "c.py": 30.0}  # d.py is new: UNKNOWN_FILE_S (5 s), so before a.py
    ordered = [i.nodeid for i in file_order.longest_files_first(collected, seconds)]
    assert ordered == ["b.py::t1", "b.py::t2", "c.py::t1", "d.py::t1", "a.py::t1", "a.py::t2"]


def test_equal_files_keep_their_collection_order():
    ordered = file_order.longest_files_first(items("x.py::t", "y.py::t", "z.py::t"), {})
    assert [i.nodeid for i in ordered] == ["x.py::t", "y.py::t", "z.py::t"]


def test_the_recorder_sums_each_files_phases_and_writes_them_longest_first(tmp_path, monkeypatch):
    target = tmp_path / "seconds.json"
    monkeypatch.setenv(file_order.RECORD_ENV, str(target))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    recorder = file_order.recorder()
    assert recorder is not None
    for nodeid, duration in [("a.py::t", 1.04), ("a.py::t", 2.0), ("b.py::u", 9.0), ("a.py::v", 0.5)]:
        recorder.add(SimpleNamespace(nodeid=nodeid, duration=duration))
    recorder.write()
    assert list(json.loads(target.read_text()).items()) == [("b.py", 9.0), ("a.py", 3.5)]
    assert file_order.known_seconds(target) == {"b.py": 9.0, "a.py": 3.5}


def test_a_worker_records_nothing_and_a_missing_or_broken_list_orders_by_collection(tmp_path, monkeypatch):
    monkeypatch.setenv(file_order.RECORD_ENV, str(tmp_path / "s.json"))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert file_order.recorder() is None
    assert file_order.known_seconds(tmp_path / "absent.json") == {}
    (tmp_path / "broken.json").write_text("[1, 2")
    assert file_order.known_seconds(tmp_path / "broken.json") == {}


def test_the_shipped_list_names_files_that_exist():
    seconds = file_order.known_seconds()
    root = file_order.SECONDS_FILE.parents[1]
    assert len(seconds) > 50
    missing = [name for name in seconds if not (root / name).is_file()]
    assert len(missing) <= len(seconds) // 10, f"file_seconds.json is stale: {missing[:5]}"
