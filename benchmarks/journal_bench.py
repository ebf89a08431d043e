"""The answer journal's format, measured (core/run/journal.py): JSON lines against Arrow IPC, as the online executor
uses it: W worker threads each appending one answer and waiting for its group commit (write + fsync) before the
next. Prints answers/s and bytes per answer for each format, and the ratio; the same process runs both, alternating.

    python benchmarks/journal_bench.py [--answers 20000] [--workers 16] [--repeat 3]
"""

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa

from batch_pipeline.core.ledger.executor import RAW_RESULT_SCHEMA
from batch_pipeline.core.run.journal import AnswerJournal
from batch_pipeline.core.store import Store

PAYLOAD = json.dumps(
    {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "model": "gpt-4o-mini",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": '{"label":"billing"}'}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 230, "completion_tokens": 6, "total_tokens": 236},
    }
)


def row(i: int) -> tuple:
    return (f"req-{i:012d}", 200, '{"label":"billing"}', "stop", 230, 0, 6, None, None, f"rid-{i}", PAYLOAD)


class IpcJournal:
    """The alternative: each group commit one Arrow IPC record batch on a stream file, fsynced."""

    def __init__(self, path: Path):
        self.sink = open(path, "wb")  # noqa: SIM115
        self.writer = pa.ipc.new_stream(self.sink, RAW_RESULT_SCHEMA)
        self.cond = threading.Condition()
        self.pending: list[tuple] = []
        self.appended = self.committed = 0
        self.closed = False
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def append(self, r: tuple) -> None:
        with self.cond:
            self.pending.append(r)
            self.appended += 1
            mine = self.appended
            self.cond.notify_all()
            while self.committed < mine:
                self.cond.wait()

    def loop(self) -> None:
        while True:
            with self.cond:
                while not self.pending and not self.closed:
                    self.cond.wait()
                if not self.pending:
                    return
                group, self.pending = self.pending, []
            cols = list(zip(*group, strict=True))
            batch = pa.RecordBatch.from_arrays(
                [pa.array(c, type=f.type) for c, f in zip(cols, RAW_RESULT_SCHEMA, strict=True)],
                schema=RAW_RESULT_SCHEMA,
            )
            self.writer.write_batch(batch)
            self.sink.flush()
            os.fsync(self.sink.fileno())
            with self.cond:
                self.committed += len(group)
                self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.thread.join()
        self.writer.close()
        self.sink.close()


def drive(journal, answers: int, workers: int) -> float:
    counter = iter(range(answers))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            journal.append(row(i))

    started = time.perf_counter()
    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--answers", type=int, default=20000)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    best = {"jsonl": float("inf"), "ipc": float("inf")}
    size = {}
    for _ in range(args.repeat):
        for name in ("jsonl", "ipc"):
            with tempfile.TemporaryDirectory() as tmp:
                if name == "jsonl":
                    store = Store(tmp)
                    journal = AnswerJournal(store, "bench", "s00001", 1)
                    wall = drive(journal, args.answers, args.workers)
                    journal.close()
                    size[name] = journal.local.stat().st_size
                else:
                    path = Path(tmp) / "journal.arrows"
                    journal = IpcJournal(path)
                    wall = drive(journal, args.answers, args.workers)
                    journal.close()
                    size[name] = path.stat().st_size
                best[name] = min(best[name], wall)
    for name in ("jsonl", "ipc"):
        print(
            f"{name:6s} {args.answers / best[name]:>10,.0f} answers/s   {size[name] / args.answers:>6.0f} B/answer   "
            f"(best of {args.repeat}, {args.workers} workers, an fsync per group commit)"
        )
    print(f"jsonl / ipc throughput: {best['ipc'] / best['jsonl']:.2f}x")


if __name__ == "__main__":
    main()
