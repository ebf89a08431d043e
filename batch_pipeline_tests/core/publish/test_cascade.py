"""The cascade merge: one final answer per source row, from the last pass that answered it."""

import duckdb
import pyarrow as pa

from batch_pipeline.core.publish.cascade import cascade_sql


def table(rows: list[tuple[str, int, str, str]]) -> pa.Table:
    source, line, output, rid = zip(*rows) if rows else ((), (), (), ())
    return pa.table(
        {
            "source": pa.array(source, pa.string()),
            "line": pa.array(line, pa.int64()),
            "source_key": pa.array([f"k{n}" for n in line], pa.string()),
            "request_id": pa.array(rid, pa.string()),
            "output": pa.array(output, pa.string()),
            "model": pa.array(["m"] * len(line), pa.string()),
        }
    )


def merged(*passes: pa.Table) -> list[tuple]:
    con = duckdb.connect()
    for i, t in enumerate(passes):
        con.register(f"p_{i}", t)
    sql = cascade_sql([f"p_{i}" for i in range(len(passes))], [f"job{i + 1}" for i in range(len(passes))])
    return con.sql(f"SELECT source, line, output, pass, job FROM ({sql})").fetchall()


def test_the_last_pass_that_answered_wins_and_the_rest_keep_their_earlier_answer():
    first = table([("a", 1, "billing", "r1"), ("a", 2, "other", "r2"), ("a", 3, "other", "r3"), ("b", 1, "bug", "r4")])
    second = table([("a", 2, '{"topic": "x"}', "s2"), ("a", 3, '{"topic": "y"}', "s3")])
    third = table([("a", 3, '{"topic": "z"}', "t3")])  # a review pass over one row of the second
    assert merged(first, second, third) == [
        ("a", 1, "billing", 1, "job1"),
        ("a", 2, '{"topic": "x"}', 2, "job2"),
        ("a", 3, '{"topic": "z"}', 3, "job3"),
        ("b", 1, "bug", 1, "job1"),
    ]


def test_rows_match_on_source_and_line_not_on_line_alone():
    first = table([("a", 1, "other", "r1"), ("b", 1, "other", "r2")])
    second = table([("b", 1, "ok", "s1")])
    assert merged(first, second) == [("a", 1, "other", 1, "job1"), ("b", 1, "ok", 2, "job2")]
