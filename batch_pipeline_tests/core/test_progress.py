"""Progress meters: counts, rate and ETA; a part's counts reach the whole and the sinks."""

from batch_pipeline.core import progress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """A sink that keeps what it was shown."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, int, int | None]] = []
        self.closed: list[str] = []

    def update(self, meter: progress.Meter) -> None:
        self.updates.append((meter.task, meter.done, meter.total))

    def close(self, meter: progress.Meter) -> None:
        self.closed.append(meter.task)


def test_rate_and_eta_from_counts_and_time():
    clock = Clock()
    m = progress.Meter("submit", total=20, unit="shards", clock=clock)
    assert m.figures().eta_s is None  # no rate yet
    clock.now += 2.0
    m.advance(10)
    f = m.figures()
    assert (f.done, f.total, f.rate_per_s, f.eta_s) == (10, 20, 5.0, 2.0)
    m.set(25)  # past the total: no negative ETA
    assert m.figures().eta_s == 0.0
    assert progress.Meter("rows", clock=clock).figures().eta_s is None  # no total: no ETA
    assert f.as_dict()["unit"] == "shards"


def test_parts_count_towards_the_open_whole_and_only_the_whole_is_shown():
    sink = Recorder()
    with progress.reporting(sink):
        with progress.opened("collect", 5, "shards") as whole:
            for _ in range(2):  # two range runs of the same pass
                part = progress.meter("collect", total=3, unit="shards")
                part.advance()
                part.advance()
            assert (whole.done, part.done) == (4, 2)
        loose = progress.meter("collect", total=1)  # no whole open any more: it shows itself
        loose.advance()
    assert sink.updates[0:4] == [("collect", n, 5) for n in (1, 2, 3, 4)]  # shown from its first count on
    assert sink.updates[-1] == ("collect", 1, 1) and sink.closed == ["collect"]
    progress.meter("collect").advance()  # after the block the sink hears nothing
    assert len(sink.updates) == 5


def test_a_step_with_nothing_to_do_shows_no_bar():
    sink = Recorder()
    with progress.reporting(sink):
        with progress.opened("manifest", None, "bytes"):
            progress.meter("manifest", unit="bytes").set(0)  # a run with nothing new: no count, no bar
        with progress.opened("submit", 3, "shards"):
            pass
    assert sink.updates == [] and sink.closed == []  # never "0/0 0.0 rows/s"


def test_a_whole_without_a_total_takes_its_parts_totals_and_work_that_turns_up():
    sink = Recorder()
    with progress.reporting(sink):
        with progress.opened("manifest", None, "bytes") as whole:
            part = progress.meter("manifest", total=4000, unit="bytes")  # what the build will read
            part.set(1000)
            part.describe("12 rows")
            part.set(4000)
        assert (whole.done, whole.total) == (4000, 4000) and whole.figures().note == "12 rows"
        with progress.opened("collect", 1, "shards") as collect:
            progress.expect("collect")  # a batch submitted in this pass: one more to collect
            progress.meter("collect", total=2).advance(2)
        assert (collect.done, collect.total) == (2, 2)
    assert sink.updates[:2] == [("manifest", 1000, 4000), ("manifest", 4000, 4000)]
    assert sink.updates[-1] == ("collect", 2, 2) and sink.closed == ["manifest", "collect"]
