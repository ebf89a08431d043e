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


def test_waiting_files_are_handed_out_one_at_a_time_unless_they_would_end_last():
    seconds = {"w1.py": 100.0, "w2.py": 90.0, "w3.py": 80.0, "c1.py": 70.0, "c2.py": 60.0, "c3.py": 50.0}
    seconds |= {f"s{n}.py": 10.0 for n in range(20)}  # 650 s in all: an even share of 325 s each on two workers
    collected = items(*(f"{name}::t" for name in seconds))
    waiting = {"w1.py", "w2.py", "w3.py"}
    files = [i.nodeid.split("::")[0] for i in file_order.longest_files_first(collected, seconds, waiting, workers=2)]
    # w1 first; w2 only once w1 ended at 100 s (100 + 90 + 80 = 270 s fits in the share); meanwhile the other worker
    # took c1, c2, c3 and, at 180 s, a short file; w3 once w2 ended at 190 s; the other short files after
    assert files[:7] == ["w1.py", "c1.py", "c2.py", "w2.py", "c3.py", "s0.py", "w3.py"], files
    assert set(files[7:]) == {f"s{n}.py" for n in range(1, 20)}
    # the same files on one worker, or with nothing marked, are longest first
    longest = sorted(seconds, key=lambda name: -seconds[name])
    assert [i.nodeid.split("::")[0] for i in file_order.longest_files_first(collected, seconds, waiting)] == longest
    assert [i.nodeid.split("::")[0] for i in file_order.longest_files_first(collected, seconds, set(), 3)] == longest


def test_waiting_files_that_would_end_last_one_after_another_start_together():
    seconds = {"w1.py": 100.0, "w2.py": 100.0, "c1.py": 10.0, "c2.py": 10.0}  # a share of 110 s each on two workers
    collected = items(*(f"{name}::t" for name in seconds))
    files = [i.nodeid.split("::")[0] for i in file_order.longest_files_first(collected, seconds, {"w1.py", "w2.py"}, 2)]
    assert files == ["w1.py", "w2.py", "c1.py", "c2.py"]  # w2 after w1 would end at 200 s: both start at once
