"""The answer journal on a real store: an append returns once the answer is on disk, many workers share group
commits, a torn last line is skipped on replay, and discarding removes it."""

import threading

import pyarrow as pa

from batch_pipeline.core.ledger.executor import RAW_RESULT_SCHEMA
from batch_pipeline.core.run.journal import AnswerJournal, discard, journal_rel, replay
from batch_pipeline.core.store import Store


def row(i: int, vector: list[float] | None = None) -> tuple:
    base = (f"req-{i:04d}", 200, '{"label":"bug"}', "stop", 100, 0, 3, None, None, f"rid-{i}", '{"id": "x"}')
    return base if vector is None else (*base, vector)


def test_every_appended_answer_is_on_disk_when_append_returns(tmp_path):
    store = Store(tmp_path)
    journal = AnswerJournal(store, "j", "s00001", 1)
    journal.append(row(0))
    # read back while the journal is still open: the answer is already durable
    table = replay(store, "j", "s00001", 1)
    assert table is not None and table.column("request_id").to_pylist() == ["req-0000"]
    journal.close()


def test_workers_share_group_commits_and_nothing_is_lost(tmp_path):
    store = Store(tmp_path)
    journal = AnswerJournal(store, "j", "s00001", 2)

    def work(start: int) -> None:
        for i in range(start, start + 50):
            journal.append(row(i))

    threads = [threading.Thread(target=work, args=(w * 50,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    journal.close()
    table = replay(store, "j", "s00001", 2)
    assert table.num_rows == 400 and len(set(table.column("request_id").to_pylist())) == 400
    assert table.schema == RAW_RESULT_SCHEMA
    assert journal.commits < 400  # answers that finished together went in one fsync


def test_a_torn_last_line_is_skipped_and_the_rest_replayed(tmp_path):
    store = Store(tmp_path)
    with AnswerJournal(store, "j", "s00001", 3) as journal:
        journal.append(row(1))
        journal.append(row(2))
    path = store.local_path(journal_rel("j", "s00001", 3) + ".jsonl")
    with open(path, "ab") as f:
        f.write(b'["req-0003",200,"{\\"lab')  # the process died mid-write
    table = replay(store, "j", "s00001", 3)
    assert table.column("request_id").to_pylist() == ["req-0001", "req-0002"]


def test_embedding_rows_keep_their_vectors_and_discard_removes_the_journal(tmp_path):
    store = Store(tmp_path)
    with AnswerJournal(store, "j", "s00002", 1) as journal:
        journal.append(row(1, [0.5, -1.0]))
        journal.append(row(2))
    table = replay(store, "j", "s00002", 1)
    assert table.column("embedding").to_pylist() == [[0.5, -1.0], None]
    assert table.schema.field("embedding").type == pa.list_(pa.float32())
    discard(store, "j", "s00002", 1)
    assert replay(store, "j", "s00002", 1) is None
    assert replay(store, "j", "s00009", 1) is None  # no journal at all
