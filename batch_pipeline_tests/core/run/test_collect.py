"""The ingest's count of an attempt's IDs left without a result (``collect._unanswered``)."""

import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from batch_pipeline.core.run.collect import _unanswered


def _by_distinct_counts(expected: pa.Array, stored: list[str | None]) -> int:
    """The count as the ingest took it before: distinct IDs asked minus distinct IDs stored (all of them asked)."""
    seen = pa.array(stored, pa.string())
    return pc.count_distinct(expected).as_py() - pc.count_distinct(seen).as_py()


def _positions(expected: pa.Array, blocks: list[list[str | None]]) -> tuple[list[np.ndarray], list[str | None]]:
    """What the ingest keeps per block: the stored rows' positions in ``expected`` (rows of other IDs dropped)."""
    answered, stored = [], []
    for block in blocks:
        where = pc.index_in(pa.chunked_array([pa.array(block, pa.string())]), value_set=expected)
        answered.append(where.drop_null().to_numpy())
        stored += [rid for rid, w in zip(block, where.to_pylist()) if w is not None]
    return answered, stored


@pytest.mark.parametrize("seed", range(40))
def test_unanswered_equals_the_distinct_count_difference(seed):
    rng = random.Random(seed)
    ids = [f"r{i}" for i in range(rng.randint(0, 30))]
    asked = ids + rng.sample(ids, k=min(len(ids), rng.randint(0, 5)))  # an ID asked twice counts once
    if rng.random() < 0.2:
        asked.append(None)  # a null ID is no request (the distinct count skips it)
    rng.shuffle(asked)
    expected = pa.array(asked, pa.string())
    rows = [rid for rid in ids if rng.random() < 0.8] + rng.choices(ids or ["x"], k=rng.randint(0, 4))
    rows += ["stranger", None][: rng.randint(0, 2)]  # not the attempt's: filtered out before storing
    rng.shuffle(rows)
    cut = rng.randint(0, len(rows))
    answered, stored = _positions(expected, [rows[:cut], rows[cut:]])
    stored = [rid for rid in stored if rid is not None]
    assert _unanswered(expected, answered) == _by_distinct_counts(expected, stored)


def test_unanswered_edge_cases():
    expected = pa.array(["a", "b", "a", "c"], pa.string())
    assert _unanswered(expected, [np.array([0, 1, 3])]) == 0  # the repeated "a" needs no second row
    assert _unanswered(expected, [np.array([1]), np.array([], np.int32)]) == 2  # "a" and "c"
    assert _unanswered(expected, []) == 3
    assert _unanswered(pa.array([], pa.string()), []) == 0
