"""Dagster at 10,000 shards: adding the partitions, a shard-sensor tick, ``status`` and the UI's asset page.

The job store is ``driver_bench``'s synthetic one (``--shards`` shards of ``--items`` items, every shard state;
built once and reused from ``--home``), with the spec's backend switched to the online sandbox backend so that a
tick asks no provider about batches that exist only on paper (the real tick polls at most 200 open batches, 8 at a
time; timed in ``driver_bench``'s notes, not here). For each storage in ``--storage`` (``sqlite``: the repo's
dagster.yaml in a fresh DAGSTER_HOME; ``postgres``: Debian's PostgreSQL started as the tests start it, the chart's
``storage: postgres``), on a fresh instance:

1. ``add_partitions``: the manifest asset's call, ``add_dynamic_partitions`` of every shard at once; against the
   reference in the same run, one call per shard over the first ``--reference-keys`` shards (projected to all);
   then ``get_dynamic_partitions`` (what every tick and range lookup reads);
2. history: the runs a sensor-driven job of this size leaves, as ``--shards / shards_per_run`` ranged submit and
   collect runs (``add_run`` with the range and shard tags, succeeded), 20 ranged runs in flight, and a
   materialization of ``submissions`` for the first ``--materialized`` shards, written by ranged runs of a stand-in
   asset with the same key (``materialize`` over ``--materialize-span`` partitions per run; timed per shard);
3. ``tick``: the real shard sensor (``build_shard_sensor``) through ``build_sensor_context`` on that instance
   and store: run queries, the plan, the ranges and their run keys (best of ``--repeat``);
4. ``status``: ``batch-pipeline status`` (``cli_state.status`` rendered into a string; it reads the store only);
5. ``asset_page``: ``dagster-webserver`` on a free loopback port over this DAGSTER_HOME and the job's real
   definitions; the GraphQL the asset page of ``<job>/submissions`` needs (the partition keys, the partition
   statuses and counts, the latest materialization), first call and best of ``--repeat``; and the asset list.

    python benchmarks/dagster_scale_bench.py [--shards 10000] [--items 200000] [--storage sqlite,postgres]
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks import driver_bench  # noqa: E402
from benchmarks._harness import OUT, load, maxrss_mb  # noqa: E402

ASSET_PAGE = """
query AssetPage($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) {
    __typename
    ... on AssetNode {
      id
      partitionKeysByDimension { name partitionKeys }
      partitionStats { numMaterialized numMaterializing numFailed numPartitions }
      assetPartitionStatuses {
        __typename
        ... on DefaultPartitionStatuses { materializedPartitions materializingPartitions failedPartitions }
      }
    }
  }
  assetOrError(assetKey: $key) {
    __typename
    ... on Asset { assetMaterializations(limit: 1) { runId partition timestamp } }
  }
}
"""
ASSET_LIST = "{ assetNodes { id assetKey { path } isPartitioned } }"
IN_FLIGHT_RUNS = 20


def _spec(home: str) -> str:
    """driver_bench's job spec on the online sandbox backend (no provider polls in a tick)."""
    text = driver_bench.SPEC_YAML.format(
        job=driver_bench.JOB, home=home, budget=driver_bench.BUDGET, canary=driver_bench.CANARY_SIZE
    )
    text = text.replace("backend:\n  name: openai_batch\n", "backend:\n  name: online\n  settings: {sandbox: true}\n")
    path = Path(home) / "scale_job.yaml"
    path.write_text(text)
    return str(path)


def ensure_store(home: str, shards: int, items: int, seed: int = 7) -> str:
    meta_path = Path(home) / "dagster_scale_build.json"
    params = {"shards": shards, "items": items, "seed": seed}
    Path(home).mkdir(parents=True, exist_ok=True)
    spec_path = _spec(home)
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else None
    if meta is None or meta.get("params") != params:
        shutil.rmtree(Path(home) / "jobs" / driver_bench.JOB, ignore_errors=True)
        print(f"building {shards:,} shards / {items:,} items in {home}", flush=True)
        build = driver_bench.build(home, spec_path, shards, items, seed, 2)
        meta_path.write_text(json.dumps({"params": params, "build": build}))
    return spec_path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _best(fn, repeat: int) -> tuple[float, list[float], object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), times, out


@contextmanager
def instance_for(storage: str, root: Path, pg):
    import dagster as dg

    from batch_pipeline_tests.defs.postgres import PASSWORD_ENV, postgres_dagster_home

    home = root / f"dagster_home_{storage}"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    env: dict[str, str] = {}
    if storage == "postgres":
        postgres_dagster_home(home, pg, pg.create_database(f"scale_{uuid.uuid4().hex[:8]}"))
        env[PASSWORD_ENV] = pg.password
        os.environ[PASSWORD_ENV] = pg.password
    else:
        shutil.copy(HERE.parent / "dagster.yaml", home / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        yield instance, home, env


def add_partitions(instance, spec, shard_ids: list[str], reference_keys: int) -> dict:
    from batch_pipeline.defs.assets import shards_partitions

    name = shards_partitions(spec).name
    t = time.perf_counter()
    instance.add_dynamic_partitions(name, shard_ids)
    ours = time.perf_counter() - t
    ref_keys = shard_ids[:reference_keys]
    t = time.perf_counter()
    for key in ref_keys:
        instance.add_dynamic_partitions(f"{name}_reference", [key])
    ref = time.perf_counter() - t
    got, times, keys = _best(lambda: instance.get_dynamic_partitions(name), 3)
    assert keys == shard_ids
    return {
        "add_all_s": round(ours, 3),
        "reference_one_by_one_s": round(ref, 3),
        "reference_keys": len(ref_keys),
        "reference_projected_s": round(ref * len(shard_ids) / max(1, len(ref_keys)), 1),
        "ratio": round(ref * len(shard_ids) / max(1, len(ref_keys)) / ours, 1),
        "get_dynamic_partitions_s": round(got, 4),
    }


def history(instance, spec, shard_ids: list[str], span: int, materialize_span: int, materialized: int) -> dict:
    """The runs and materializations a sensor-driven job of this size leaves behind."""
    import dagster as dg

    from batch_pipeline.core.state.ranges import shard_ranges
    from batch_pipeline.defs.assets import SHARDS_TAG, asset_key, shards_partitions
    from batch_pipeline.defs.sensors import RANGE_END, RANGE_START

    t = time.perf_counter()
    ranges = shard_ranges(shard_ids, shard_ids, span)
    runs = 0
    for stage in ("submit", "collect"):
        for r in ranges:
            tags = {
                RANGE_START: r.start,
                RANGE_END: r.end,
                SHARDS_TAG: ",".join(r.shards),
                "dagster/run_key": f"{stage}:{r.start}..{r.end}:{r.digest()}",
            }
            instance.add_run(
                dg.DagsterRun(
                    job_name=f"{spec.name}_{stage}",
                    run_id=str(uuid.uuid4()),
                    status=dg.DagsterRunStatus.SUCCESS,
                    tags=tags,
                )
            )
            runs += 1
    for r in ranges[:IN_FLIGHT_RUNS]:
        instance.add_run(
            dg.DagsterRun(
                job_name=f"{spec.name}_collect",
                run_id=str(uuid.uuid4()),
                status=dg.DagsterRunStatus.STARTED,
                tags={RANGE_START: r.start, RANGE_END: r.end, SHARDS_TAG: r.shards[0]},
            )
        )
    runs_s = time.perf_counter() - t
    shards = shards_partitions(spec)

    def standin(name: str) -> dg.AssetsDefinition:
        @dg.asset(key=asset_key(spec, name), partitions_def=shards)
        def _a(context) -> dg.MaterializeResult:
            return dg.MaterializeResult(metadata={"shards": len(context.partition_keys)})

        return _a

    assets = [standin("submissions")]  # a submit run's one asset: a planned and a materialized event per shard
    done = shard_ids[:materialized]
    t = time.perf_counter()
    for r in shard_ranges(done, done, materialize_span):
        result = dg.materialize(
            assets, instance=instance, tags={RANGE_START: r.start, RANGE_END: r.end}, raise_on_error=True
        )
        assert result.success
    seconds = time.perf_counter() - t
    return {
        "runs_added": runs + IN_FLIGHT_RUNS,
        "add_runs_s": round(runs_s, 2),
        "materialized": len(done),
        "materialize_s": round(seconds, 1),
        "per_shard_ms": round(1000 * seconds / max(1, len(done)), 1),
    }


def tick(instance, spec, home: str, repeat: int) -> dict:
    import dagster as dg

    from batch_pipeline.defs.jobs import build_jobs
    from batch_pipeline.defs.resources import StoreResource
    from batch_pipeline.defs.sensors import build_shard_sensor

    sensor = build_shard_sensor(spec, build_jobs(spec))

    def once():
        return sensor(dg.build_sensor_context(instance=instance, resources={"store": StoreResource(root=home)}))

    best, times, out = _best(once, repeat)
    requests = [] if isinstance(out, dg.SkipReason) else list(out)
    moved = sum(len(r.tags.get("batch_pipeline/shards", "").split(",")) if not r.partition_key else 1 for r in requests)
    return {
        "tick_s": round(best, 3),
        "runs": [round(x, 3) for x in times],
        "run_requests": len(requests),
        "shards_moved": moved,
    }


def status(spec, home: str, repeat: int) -> dict:
    from batch_pipeline.core.store import Store

    best, times, _ = _best(lambda: driver_bench.status(spec, Store(home)), repeat)
    return {"status_s": round(best, 3), "runs": [round(x, 3) for x in times]}


@contextmanager
def webserver(dagster_home: Path, spec_path: str, store_home: str, env: dict[str, str]):
    from batch_pipeline_tests.e2e.conftest import GraphQL

    root = dagster_home / "ws"
    root.mkdir(exist_ok=True)
    (root / "location.py").write_text(
        "from batch_pipeline.core.spec.loading import load_spec\nfrom batch_pipeline.defs.build import build_definitions\n"
        f"defs = build_definitions([load_spec({spec_path!r})])\n"
    )
    (root / "workspace.yaml").write_text(
        "load_from:\n  - python_file: {relative_path: location.py, attribute: defs, location_name: scale}\n"
    )
    port = _free_port()
    full_env = {
        **os.environ,
        **env,
        "DAGSTER_HOME": str(dagster_home),
        "BATCH_PIPELINE_HOME": store_home,
        "PYTHONPATH": str(HERE.parent),
        "DAGSTER_DISABLE_TELEMETRY": "1",
    }
    log = (root / "webserver.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dagster_webserver",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-w",
            str(root / "workspace.yaml"),
        ],
        env=full_env,
        cwd=root,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    gql = GraphQL(f"http://127.0.0.1:{port}/graphql", timeout=300)
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"webserver exited: {(root / 'webserver.log').read_text()[-3000:]}")
            try:
                if gql("{ version }").get("version"):
                    break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        yield gql
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()


def asset_page(gql, spec, repeat: int) -> dict:
    key = {"path": [spec.name, "submissions"]}
    t = time.perf_counter()
    first = gql(ASSET_PAGE, key=key)
    cold = time.perf_counter() - t
    node = first["assetNodeOrError"]
    assert node["__typename"] == "AssetNode", first
    best, times, out = _best(lambda: gql(ASSET_PAGE, key=key), repeat)
    stats = out["assetNodeOrError"]["partitionStats"]
    list_best, _, nodes = _best(lambda: gql(ASSET_LIST), repeat)
    return {
        "asset_page_first_s": round(cold, 3),
        "asset_page_s": round(best, 3),
        "runs": [round(x, 3) for x in times],
        "partition_stats": stats,
        "asset_list_s": round(list_best, 3),
        "assets": len(nodes["assetNodes"]),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=10_000)
    ap.add_argument("--items", type=int, default=200_000)
    ap.add_argument("--home", help="store root (kept and reused while shards/items match)")
    ap.add_argument("--storage", default="sqlite,postgres")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--span", type=int, default=50, help="shards per run of the simulated history")
    ap.add_argument("--materialize-span", type=int, default=500)
    ap.add_argument(
        "--materialized",
        type=int,
        default=500,
        help="shards whose submissions get materialized by ranged runs (each costs ~2 event writes)",
    )
    ap.add_argument("--reference-keys", type=int, default=300)
    args = ap.parse_args()

    from batch_pipeline.core.manifest.shards import Manifest
    from batch_pipeline.core.spec.loading import load_spec
    from batch_pipeline.core.store import Store
    from batch_pipeline_tests.defs.postgres import postgres_server

    home = str(Path(args.home or Path(tempfile.gettempdir()) / "dagster_scale_bench").resolve())
    spec_path = ensure_store(home, args.shards, args.items)
    spec = load_spec(spec_path)
    os.environ.setdefault("BATCH_PIPELINE_SANDBOX_URL", "http://127.0.0.1:9")  # never called: no batch polls
    shard_ids = Manifest(spec.name, Store(home)).shard_ids()
    print(f"{len(shard_ids):,} shards, {args.items:,} items; load {load():.1f}", flush=True)
    out: dict = {"params": vars(args), "status": status(spec, home, args.repeat)}
    print(f"status: {out['status']}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="dagster_scale_"))
    storages = [s for s in args.storage.split(",") if s]
    with postgres_server(durable=True) if "postgres" in storages else _nothing() as pg:
        for storage in storages:
            fig: dict = {"load_before": round(load(), 1)}
            with instance_for(storage, root, pg) as (instance, dagster_home, env):
                fig["partitions"] = add_partitions(instance, spec, shard_ids, args.reference_keys)
                print(f"[{storage}] partitions: {fig['partitions']}", flush=True)
                fig["history"] = history(instance, spec, shard_ids, args.span, args.materialize_span, args.materialized)
                print(f"[{storage}] history: {fig['history']}", flush=True)
                fig["tick"] = tick(instance, spec, home, args.repeat)
                print(f"[{storage}] tick: {fig['tick']}", flush=True)
                with webserver(dagster_home, spec_path, home, env) as gql:
                    fig["ui"] = asset_page(gql, spec, args.repeat)
                print(f"[{storage}] ui: {fig['ui']}", flush=True)
            out[storage] = fig
    shutil.rmtree(root, ignore_errors=True)
    out["peak_rss_mb"] = round(maxrss_mb())
    OUT.mkdir(exist_ok=True)
    (OUT / "dagster_scale_bench.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))
    return 0


@contextmanager
def _nothing():
    yield None


if __name__ == "__main__":
    sys.exit(main())
