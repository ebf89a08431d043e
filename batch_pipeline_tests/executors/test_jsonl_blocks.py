"""Block sizing of downloaded result files: a file of known size gives every parse worker a block."""

import pyarrow as pa

from batch_pipeline.executors.jsonl_blocks import (
    MIN_BLOCK_BYTES,
    RESULT_BLOCK_BYTES,
    block_bytes_for,
    iter_blocks,
    join_tables,
    parse_stream,
)


def test_a_known_size_is_cut_into_one_block_per_worker_within_the_bounds():
    assert block_bytes_for(8_500_000, 2) == 4_250_000  # a 10k-line shard's file: one block per worker
    assert block_bytes_for(4_250_000, 2) == RESULT_BLOCK_BYTES  # a 5k-line shard's: whole, one query's fixed cost
    assert block_bytes_for(2 * MIN_BLOCK_BYTES, 2) == MIN_BLOCK_BYTES  # the smallest file that is cut
    assert block_bytes_for(2 * MIN_BLOCK_BYTES - 1, 2) == RESULT_BLOCK_BYTES
    assert block_bytes_for(None, 2) == RESULT_BLOCK_BYTES  # size unknown: the cap
    assert block_bytes_for(1 << 30, 4) == RESULT_BLOCK_BYTES  # a big file: the cap
    assert block_bytes_for(300_000, 2) == RESULT_BLOCK_BYTES  # a tiny file: not cut into slivers
    assert block_bytes_for(4_250_000, 1) == RESULT_BLOCK_BYTES  # one worker: nothing to balance


def test_parse_stream_gives_each_worker_a_block_and_keeps_every_line_in_order():
    lines = [b'{"n": %d, "pad": "%s"}' % (i, b"x" * 400) for i in range(20_000)]  # ~8.5 MB
    data = b"\n".join(lines) + b"\n"
    chunks = [data[i : i + (1 << 20)] for i in range(0, len(data), 1 << 20)]
    assert len(list(iter_blocks(iter(chunks)))) == 1  # the 16 MB cut: one block for the whole file
    parsed = []

    def parse(block: bytes) -> pa.Table:
        parsed.append(len(block))
        return pa.table({"line": [ln for ln in block.split(b"\n") if ln]})

    tables = list(parse_stream(parse, iter(chunks), workers=2, total_bytes=len(data)))
    assert len(parsed) >= 2  # every worker had a block to parse
    assert len(tables) == 1  # joined again: one flush, as the file is within one block's bytes
    assert [ln for t in tables for ln in t.column("line").to_pylist()] == lines


def test_tables_are_joined_in_order_within_the_limit_and_by_schema():
    def table(n: int, start: int, kind: pa.DataType | None = None) -> pa.Table:
        return pa.table({"v": pa.array(range(start, start + n), kind or pa.int64())})  # int64: 8 bytes a row

    small = [table(100, 100 * i) for i in range(5)]  # 800 bytes each
    joined = list(join_tables(small, limit=2_000))
    assert [t.num_rows for t in joined] == [200, 200, 100]
    assert [v for t in joined for v in t.column("v").to_pylist()] == list(range(500))
    big = [table(130, 0), table(10, 130)]  # 1,040 bytes: half the limit or more, so it goes at once
    assert [t.num_rows for t in join_tables(big, limit=2_000)] == [130, 10]
    mixed = [table(10, 0), table(10, 10, pa.int32()), table(10, 20, pa.int32())]
    assert [t.num_rows for t in join_tables(mixed, limit=2_000)] == [10, 20]  # another schema starts a group
    assert list(join_tables([], limit=2_000)) == []


def test_extract_reruns_its_cached_query_over_each_new_block():
    import duckdb

    from batch_pipeline.executors.jsonl_blocks import extract, lines_array

    sql = "SELECT json_extract_string(line, '$.n') AS n, length(line) AS size FROM lines"

    def fresh(lines: pa.StringArray) -> pa.Table:
        con = duckdb.connect()
        con.register("lines", pa.table({"line": lines}))
        return con.sql(sql).to_arrow_table()

    blocks = [
        b'{"n": "a"}\n',
        b"".join(b'{"n": "%d", "pad": "%s"}\n' % (i, b"y" * (i % 7)) for i in range(3000)),
        b'{"n": "after"}\n{not json}\n',  # refused: DuckDB raises, the cached query stays usable
        '{"n": "ünïcode"}\n{"n": null}\n'.encode(),
        b'{"n": "last"}\n',
    ]
    for block in blocks:
        lines = lines_array(block)
        assert lines is not None
        got = extract(lines, sql)
        if b"not json" in block:
            assert got is None
        else:
            assert got is not None and got.equals(fresh(lines))
