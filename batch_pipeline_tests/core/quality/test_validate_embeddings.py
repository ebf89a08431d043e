"""The embedding gate: dimension, finite values, non-zero norm; unanswered rows keep their error class."""

import math

import pyarrow as pa

from batch_pipeline.core.ledger.executor import raw_table
from batch_pipeline.core.quality.validate import validate
from batch_pipeline.core.spec.job import OutputSpec

OUTPUT = OutputSpec(embedding={"dimensions": 3})


def _raw(statuses: list[int | None]) -> pa.Table:
    return raw_table(
        [
            (
                f"r{i}",
                s,
                None,
                None,
                5,
                0,
                0,
                None if s == 200 else "server_error",
                None if s == 200 else "boom",
                None,
                "{}",
            )
            for i, s in enumerate(statuses)
        ]
    )


def test_each_bad_vector_is_invalid_with_its_reason_and_a_good_one_succeeds():
    vectors = [
        [0.6, 0.8, 0.0],
        [1.0, 0.0],
        [1.0, math.nan, 0.0],
        [math.inf, 0.0, 0.0],
        [0.0, 0.0, 0.0],
        None,
        [1.0, 2.0, 2.0],
    ]
    verdicts = validate(_raw([200] * len(vectors)), OUTPUT, pa.array(vectors, pa.list_(pa.float32())))
    assert verdicts.status.to_pylist() == [
        "succeeded",
        "invalid",
        "invalid",
        "invalid",
        "invalid",
        "invalid",
        "succeeded",
    ]
    messages = verdicts.error_message.to_pylist()
    assert "2 dimensions" in messages[1] and "non-finite" in messages[2] and "non-finite" in messages[3]
    assert "norm 0" in messages[4] and "no embedding" in messages[5]
    assert set(verdicts.error_class.to_pylist()[1:6]) == {"invalid_output"}
    assert verdicts.parsed_output.to_pylist()[6] == '{"dimensions":3,"norm":3}'


def test_an_unanswered_row_is_errored_not_invalid():
    verdicts = validate(_raw([200, 500]), OUTPUT, pa.array([[0.0, 1.0, 0.0], None], pa.list_(pa.float32())))
    assert verdicts.status.to_pylist() == ["succeeded", "errored"]
    assert verdicts.error_code.to_pylist()[1] == "server_error"


def test_a_fixed_size_column_is_read_too():
    column = pa.array([[0.0, 0.0, 1.0]], pa.list_(pa.float32(), 3))
    assert validate(_raw([200]), OUTPUT, column).status.to_pylist() == ["succeeded"]
