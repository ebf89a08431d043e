"""The CLI run's live display (``cli_progress.RunProgress``): drawn and watched on a terminal, and elsewhere (a
log file, a pipe) drawn once, at the end, with what the run did."""

import io

import pytest
from rich.console import Console

from batch_pipeline.cli_progress import RunProgress
from batch_pipeline.core import progress
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline_tests.core.helpers import base_spec_dict, write_jsonl, write_spec


@pytest.fixture
def job(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": "k1", "body": "a ticket"}])
    return write_spec(tmp_path / "job", base_spec_dict(str(path))), Store(tmp_path / "store")


def _a_result_part(store: Store, name: str) -> None:
    store.write_bytes(f"{JobPaths(name).results}/s00001/part-1.parquet", b"PAR1")


def test_off_a_terminal_nothing_is_drawn_or_watched_until_the_end_which_says_what_the_run_did(job):
    spec, store = job
    out = io.StringIO()
    console = Console(file=out, width=160)
    assert not console.is_terminal
    with RunProgress(spec, store, console) as display:
        display.set_stage("collecting")
        meter = progress.meter("collect", total=4, unit="batches")
        meter.advance(2)
        assert not display._thread.is_alive()  # no status thread listing the store twice a second
        assert not display._bars.live.auto_refresh  # and no redraw of the table ten times a second
        drawn = out.getvalue()
        _a_result_part(store, spec.name)
    assert drawn == "> collecting\n"  # only the stage line before the end
    final = out.getvalue()[len(drawn) :]
    assert "collecting: " in final and "1 result part(s) written" in final  # the status line, made at the end
    assert "2/4 batches" in final


def test_on_a_terminal_the_status_line_is_watched_while_the_run_goes_on(job):
    spec, store = job
    console = Console(file=io.StringIO(), width=160, force_terminal=True)
    with RunProgress(spec, store, console) as display:
        assert display._thread.is_alive() and display._bars.live.auto_refresh
        display.set_stage("collecting")
        _a_result_part(store, spec.name)
        assert display.status_line().endswith("1 result part(s) written")
    assert not display._thread.is_alive()
