"""`batch-pipeline status | pause | replay`: read and steer a job's state machine from the command line.

``status`` reads the per-shard summaries and the driver's plan (fast on 10,000 shards); ``--check`` also runs the
full reconciliation over every result row. ``pause`` holds the job for a deploy; ``resume`` (or ``run``) lifts it.
``replay`` gives matching dead letters a fresh budget after a fix.
"""

import argparse

from rich.console import Console
from rich.table import Table

from batch_pipeline.cli_stops import ExitCode, advice, fix_line
from batch_pipeline.core.spec.job import JobSpec

COUNTS = ("expected", "valid", "invalid", "missing", "dead_lettered")


def _store(args: argparse.Namespace):
    from batch_pipeline.cli_jobs import store_for

    return store_for(args.settings)


def status(spec: JobSpec, args: argparse.Namespace, console: Console) -> int:
    from batch_pipeline.core.manifest.shards import Manifest
    from batch_pipeline.core.publish.tables import JobState
    from batch_pipeline.core.state.view import load_view
    from batch_pipeline.executors.registry import batch_minimums, capacity_ledgers

    store = _store(args)
    if not Manifest(spec.name, store).shard_ids():
        console.print(
            f"job {spec.name}: no manifest in {store.root} yet; run it first "
            f"(`batch-pipeline run {spec.source_path or spec.name}`)"
        )
        return ExitCode.BAD_INPUT
    ledgers = capacity_ledgers(store, spec.backend, spec.model)
    view = load_view(spec, store, **batch_minimums(spec), capacity=ledgers)
    plan = view.plan()
    table = _shard_table(spec, store, view, plan, args.all)
    console.print(table)
    _spend_bound_line(view, console)
    _queue_lines(spec, view, ledgers, store, console)
    _control_lines(spec, store, console)
    done = published(spec, store, view.summaries) if plan.publish else None
    console.print(done or f"next: {plan.describe()}", markup=False, highlight=False)
    if args.check:  # the full reconciliation from independent sets (reads every result row)
        counts = JobState.load(spec, store).check()
        console.print(f"reconciliation over every result row: {counts.as_dict()} balanced={counts.balanced}")
    return 0


def _shard_table(spec: JobSpec, store, view, plan, show_all: bool) -> Table:
    """Every shard not settled (every shard with --all: a 10,000-shard table takes seconds to draw), its counts,
    spend and next step, and the totals."""
    from batch_pipeline.core.ledger.control import JobControl
    from batch_pipeline.core.ledger.machine import ShardState

    by_state: dict[str, int] = {}
    for state in plan.states.values():
        by_state[state.value] = by_state.get(state.value, 0) + 1
    shown = [s for s in view.summaries if show_all or plan.states[s.shard_id] != ShardState.SETTLED]
    table = Table(
        title=f"job {spec.name}: {len(view.summaries)} shards ({store.root}): "
        + ", ".join(f"{n} {state}" for state, n in sorted(by_state.items()))
    )
    for col in ("shard", "state", *COUNTS, "attempts", "spend ($)", "balanced", "next"):
        table.add_column(col, justify="right")
    totals = dict.fromkeys(COUNTS, 0)
    for s in view.summaries:
        for c in COUNTS:
            totals[c] += getattr(s, c)
    steps = {step.shard_id: step.action.value for step in plan.steps if step.shard_id}
    stopped = JobControl(store, spec.name).current() is not None
    waiting = {
        k: "job stopped (below)" if stopped and w.startswith("job stopped") else w for k, w in plan.waiting.items()
    }
    for s in shown:
        table.add_row(
            s.shard_id,
            plan.states[s.shard_id].value,
            *[str(getattr(s, c)) for c in COUNTS],
            str(s.attempts),
            f"{s.spend_usd:.6f}",
            str(s.balanced),
            steps.get(s.shard_id) or waiting.get(s.shard_id, ""),
        )
    if len(shown) < len(view.summaries):
        table.add_row(f"({len(view.summaries) - len(shown)} settled shards: --all shows them)", *[""] * 10)
    balanced = totals["expected"] == sum(totals[c] for c in COUNTS[1:])
    table.add_row(
        "total",
        "",
        *[str(totals[c]) for c in COUNTS],
        "",
        f"{sum(s.spend_usd for s in view.summaries):.6f}",
        str(balanced),
        "",
        style="bold",
    )
    return table


def _spend_bound_line(view, console: Console) -> None:
    bound = sum(s.possibly_billed_usd for s in view.summaries)
    if bound:  # a hard kill left requests in flight: billed, maybe, with no answer stored
        recorded = sum(s.spend_usd for s in view.summaries)
        console.print(
            f"spend: ${recorded:.6f} recorded, up to ${recorded + bound:.6f} with ${bound:.6f} possibly "
            "billed for requests in flight at a kill (sent, no answer stored)",
            markup=False,
        )


def _control_lines(spec: JobSpec, store, console: Console) -> None:
    """Why the job stopped or paused, what that means, and the command that continues it."""
    from batch_pipeline.core.ledger.control import JobControl

    control = JobControl(store, spec.name)
    stop, held = control.current(), control.paused()
    if stop:  # why it stopped, what that means, and the command that fixes it
        console.print(f"[red]job stopped at {stop.at} ({stop.code or 'stop'}): {stop.reason}[/red]")
        console.print(f"means: {advice(stop.code).means}")
        console.print(fix_line(stop.code, spec.name, spec.source_path or spec.name), markup=False)
    if held:
        console.print(f"[yellow]job paused at {held.at}: {held.reason}[/yellow]")
        console.print(fix_line("paused", spec.name, spec.source_path or spec.name), markup=False)


def published(spec: JobSpec, store, summaries) -> str | None:
    """``done: published at ...`` when the last publish (its report) is newer than every shard's summary and was
    made from the latest manifest; None while there is something it has not published yet."""
    from datetime import datetime

    from batch_pipeline.core.manifest.shards import Manifest
    from batch_pipeline.core.spec.paths import JobPaths

    report = store.read_json(JobPaths(spec.name).report) or {}
    at = report.get("published_at")
    if not at or report.get("manifest_generation") != Manifest(spec.name, store).last_generation():
        return None
    when = datetime.fromisoformat(at)
    if any(datetime.fromisoformat(s.updated_at) > when for s in summaries):
        return None
    table = (report.get("outputs") or {}).get("validated") or "the validated table"
    return (
        f"done: published at {when.isoformat(timespec='seconds')}: {report.get('succeeded', 0)} answered, "
        f"{report.get('dead_lettered', 0)} dead-lettered, in {table}; nothing left to send"
    )


def _queue_lines(spec: JobSpec, view, ledgers, store, console: Console) -> None:
    """The account queues (what is held, the limit and where it came from), every open batch's age against its
    provider's window and retention (warnings while there is time), and the shards held for a human."""
    from batch_pipeline.core.ledger.ceilings import open_batch_ages
    from batch_pipeline.core.ledger.control import JobControl
    from batch_pipeline.executors.registry import batch_ceilings

    for ledger in ledgers:
        snapshot = ledger.snapshot()
        if snapshot.limits.any or snapshot.holdings:
            console.print(f"queue: {snapshot.describe()}", markup=False)
    opened = [(s.shard_id, s.open.submitted) for s in view.summaries if s.open and s.open.submitted]
    ages = open_batch_ages(opened, batch_ceilings(spec.backend), spec.source_path or spec.name)
    if ages:
        oldest = ages[0]
        console.print(
            f"open batches: {len(ages)}, the oldest {oldest.batch_id} ({oldest.shard_id}) "
            f"{oldest.age.total_seconds() / 3600:.1f} h old",
            markup=False,
        )
    for age in ages:
        if age.warning:
            console.print(f"[yellow]warning: {age.warning}[/yellow]")
    for shard_id, reason in JobControl(store, spec.name).shard_holds().items():
        console.print(f"shard {shard_id} held: {reason}", style="red", markup=False)


def pause(spec: JobSpec, args: argparse.Namespace, console: Console) -> int:
    from batch_pipeline.core.ledger.control import JobControl

    JobControl(_store(args), spec.name).pause(args.reason)
    console.print(
        f"job {spec.name} paused: running stream shards store what finished and return, open provider "
        f"batches keep running, sensors launch nothing. Continue with `batch-pipeline resume {spec.name}`."
    )
    return 0


def replay(spec: JobSpec, args: argparse.Namespace, console: Console) -> int:
    from batch_pipeline.core.ledger.replay import Replays, select_dead_letters
    from batch_pipeline.core.publish.tables import JobState, dead_letters
    from batch_pipeline.core.run.summary import ShardSummaries

    store = _store(args)
    state = JobState.load(spec, store)
    chosen = select_dead_letters(state.states.filter(state.states["state"] == "dead_lettered"), args.code, args.kind)
    if chosen.height == 0:
        known = dead_letters(state)["last_error_code"].value_counts().rows()
        console.print(
            f"job {spec.name}: no dead letters match (code={args.code}, kind={args.kind}); "
            f"dead letters by code: {dict(known) or 'none'}"
        )
        return ExitCode.BAD_INPUT
    record = Replays(store, spec.name).record(chosen, args.code, args.kind, args.max_tokens)
    summaries = ShardSummaries(spec, store)
    for shard in record.shards:
        summaries.refresh(shard)
    console.print(
        f"job {spec.name}: replay {record.number}: {record.items} dead letter(s) in {len(record.shards)} "
        f"shard(s) have a fresh budget; `batch-pipeline run {spec.source_path or spec.name}` sends them"
    )
    return 0


def add_commands(sub, resolve, console: Console) -> None:
    """Register the commands on the CLI's subparsers; ``resolve(job, settings)`` turns a job name or spec path into
    a JobSpec."""

    def wrap(fn):
        return lambda args: fn(resolve(args.job, args.settings), args, console)

    p = sub.add_parser("status", help="per-shard state, counts and spend, and what happens next")
    p.add_argument("job", help="job name or spec path")
    p.add_argument("--home")
    p.add_argument("--check", action="store_true", help="also reconcile over every result row (slower)")
    p.add_argument("--all", action="store_true", help="a row for every shard, settled ones included")
    p.set_defaults(fn=wrap(status))
    p = sub.add_parser("pause", help="hold a job (deploys): nothing new is sent until `resume`")
    p.add_argument("job", help="job name or spec path")
    p.add_argument("--reason", default="paused by a user")
    p.add_argument("--home")
    p.set_defaults(fn=wrap(pause))
    p = sub.add_parser("replay", help="give matching dead letters a fresh budget (after a fix), then run")
    p.add_argument("job", help="job name or spec path")
    p.add_argument("--code", help="only dead letters whose last error code is this (e.g. truncated)")
    p.add_argument("--kind", help="only dead letters of this error class (invalid_output, poison, transient)")
    p.add_argument("--max-tokens", type=int, help="let the replayed shards answer at this length (truncated items)")
    p.add_argument("--home")
    p.set_defaults(fn=wrap(replay))
