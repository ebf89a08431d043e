"""Input files as a dynamic partition set: each file prepared in its own step (the multiprocess executor, one
process per step), then one merge: the same shards as a one-process build, and an appended file prepared
from its old end in the next round."""

import os
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq

from batch_pipeline.core.manifest.parts import part_key
from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.settings import K8sSettings, Settings
from batch_pipeline.core.spec.loading import load_spec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.assets import asset_key
from batch_pipeline.defs.build import build_job_defs
from batch_pipeline.defs.manifest_parts import (
    build_manifest_parts,
    input_files_partitions,
    register_input_files,
)
from batch_pipeline.defs.resources import PricesResource, StoreResource
from batch_pipeline_tests.core.helpers import base_spec_dict, write_jsonl, write_spec
from batch_pipeline_tests.core.manifest.test_dedup_spill import input_rows

# each step in a process of its own (as each is a pod on k8s), forked from a server that has imported this module
# (Dagster, Polars, the package) once, rather than spawned and importing it all again per step
STEP_PROCESSES = dg.multiprocess_executor.configured(
    {"max_concurrent": 2, "start_method": {"forkserver": {"preload_modules": [__name__]}}}
)


def _definitions(spec_path: str, home: str) -> dg.Definitions:
    spec = load_spec(Path(spec_path))
    assets, jobs = build_manifest_parts(spec)
    return dg.Definitions(
        assets=assets,
        jobs=jobs,
        resources={"store": StoreResource(root=home)},
        executor=STEP_PROCESSES,
    )


def parts_job(spec_path: str, home: str) -> dg.JobDefinition:
    """Module level, so the multiprocess executor's step processes can rebuild it (``step_job``)."""
    return _definitions(spec_path, home).resolve_job_def("t_manifest_file_parts")


def merge_job(spec_path: str, home: str) -> dg.JobDefinition:
    return _definitions(spec_path, home).resolve_job_def("t_manifest_merge")


def step_job(name: str, spec_path: Path, home: Path):
    """Job ``name`` of this module, rebuilt in each step process from its arguments (not from the environment:
    the fork server keeps the environment it started with, which is an earlier test's)."""
    return dg.build_reconstructable_job(
        __name__, name, (str(spec_path), str(home)), reconstructor_working_directory=str(Path(__file__).parents[2])
    )


def default_graph_manifest_job(spec_path: str, home: str) -> dg.JobDefinition:
    """The manifest of the default graph of a location on the k8s executor (per-file steps, then the merge), run
    here by the multiprocess executor: each step a process, as each is a pod there."""
    spec = load_spec(Path(spec_path))
    job_defs = build_job_defs(spec, Settings(k8s=K8sSettings(executor="k8s")))
    return dg.Definitions.merge(
        job_defs,
        dg.Definitions(
            jobs=[dg.define_asset_job("t_manifest_only", selection=[asset_key(spec, "manifest")])],
            resources={"store": StoreResource(root=home), "prices": PricesResource()},
            executor=STEP_PROCESSES,
        ),
    ).resolve_job_def("t_manifest_only")


def shards_of(store: Store) -> dict:
    m = Manifest("t", store)
    return {
        s: [
            {**r, "source": r["source"].rsplit("/", 1)[1]}
            for r in pq.read_table(store.local_path(JobPaths("t").shard_items(s))).to_pylist()
        ]
        for s in m.shard_ids()
    }


def make_inputs(data: Path) -> None:
    write_jsonl(data / "a.jsonl", input_rows(1, 0, 600))
    write_jsonl(data / "b.jsonl", input_rows(2, 600, 500) + input_rows(1, 0, 40))
    write_jsonl(data / "c.jsonl", input_rows(3, 1100, 400))


def run_round(instance, spec, store, spec_path: Path, home: Path) -> list:
    """Register the pending files, run one step per file (each its own process), then the merge."""
    keys = register_input_files(instance, spec, store)
    runs = []
    for key in keys:
        job = step_job("parts_job", spec_path, home)
        result = dg.execute_job(job, instance=instance, tags={"dagster/partition": key})
        assert result.success
        runs.append(result)
    merge = dg.execute_job(step_job("merge_job", spec_path, home), instance=instance)
    assert merge.success
    return [*runs, merge]


def step_pids(instance, run_id: str) -> set[int]:
    records = instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_START)
    return {r.dagster_event.pid for r in records if r.dagster_event is not None}


def test_file_parts_as_partitions_merge_to_the_one_process_shards(tmp_path):
    data = tmp_path / "in"
    make_inputs(data)
    spec_dict = base_spec_dict(str(data / "*.jsonl"), shards={"max_requests": 120})
    spec = write_spec(tmp_path / "jobs", spec_dict)
    home, spec_path = tmp_path / "home", tmp_path / "jobs" / "job.yaml"
    store = Store(home)

    # the reference: one process, same inputs in another folder of the same names
    ref_data = tmp_path / "ref" / "in"
    make_inputs(ref_data)
    ref_spec = write_spec(
        tmp_path / "ref" / "jobs", base_spec_dict(str(ref_data / "*.jsonl"), shards={"max_requests": 120})
    )
    ref_store = Store(tmp_path / "ref" / "home")
    build_manifest(ref_spec, ref_store)

    (tmp_path / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        runs = run_round(instance, spec, store, spec_path, home)
        assert len(runs) == 4  # three file steps and the merge
        assert sorted(instance.get_dynamic_partitions(input_files_partitions(spec).name)) == sorted(
            part_key(str(data / n)) for n in ("a.jsonl", "b.jsonl", "c.jsonl")
        )
        pids = [step_pids(instance, r.run_id) for r in runs]
        assert all(p and os.getpid() not in p for p in pids)  # every step ran in a process of its own
        assert len(set().union(*pids)) == 4
        merge_meta = runs[-1].asset_materializations_for_node("t__manifest_merge")[0].metadata
        assert len(merge_meta["files_from_parts"].value) == 3  # the merge read no file itself
        assert shards_of(store) == shards_of(ref_store)
        assert not list((home / "jobs" / "t" / "manifest" / "file_parts").glob("*.json"))  # consumed parts removed

        # next round: a grows; only its new lines are prepared, in one step
        write_jsonl(data / "a.jsonl", input_rows(4, 3000, 150), mode="ab")
        write_jsonl(ref_data / "a.jsonl", input_rows(4, 3000, 150), mode="ab")
        build_manifest(ref_spec, ref_store)
        runs = run_round(instance, spec, store, spec_path, home)
        assert len(runs) == 2
        part_meta = runs[0].asset_materializations_for_node("t__manifest_file_part")[0].metadata
        assert part_meta["from_byte"].value > 0 and part_meta["rows_read"].value == 150
        assert shards_of(store) == shards_of(ref_store)
        assert Manifest("t", store).latest().files[0].action.value == "appended"


def test_the_default_graph_on_k8s_prepares_each_file_in_its_own_step_then_merges(tmp_path):
    data, ref_data = tmp_path / "in", tmp_path / "ref" / "in"
    make_inputs(data)
    make_inputs(ref_data)
    write_spec(tmp_path / "jobs", base_spec_dict(str(data / "*.jsonl"), shards={"max_requests": 120}))
    ref_spec = write_spec(
        tmp_path / "ref" / "jobs", base_spec_dict(str(ref_data / "*.jsonl"), shards={"max_requests": 120})
    )
    ref_store, store = Store(tmp_path / "ref" / "home"), Store(tmp_path / "home")
    build_manifest(ref_spec, ref_store)
    manifest_job = step_job("default_graph_manifest_job", tmp_path / "jobs" / "job.yaml", tmp_path / "home")
    (tmp_path / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        run = dg.execute_job(manifest_job, instance=instance)
        assert run.success
        steps = [
            r.dagster_event.step_key for r in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_START)
        ]
        assert sorted(s.split(".")[-1].split("[")[0] for s in steps) == [
            "t__manifest_file",
            "t__manifest_file",
            "t__manifest_file",
            "t__manifest_files",
            "t__manifest_merge",
        ]
        assert len(step_pids(instance, run.run_id) - {os.getpid()}) == 5  # every step in a process of its own
        meta = run.asset_materializations_for_node("t__manifest")[0].metadata
        assert len(meta["files_from_parts"].value) == 3 and meta["new_requests"].value > 0
        assert shards_of(store) == shards_of(ref_store)  # the one-process build's shards
        assert instance.get_dynamic_partitions("t_shards") == Manifest("t", store).shard_ids()
        assert store.read_json(JobPaths("t").file_part(part_key(str(data / "a.jsonl")), ".json")) is None  # consumed

        # one file grows: one file pending, so no file step: the merge reads its new lines itself
        write_jsonl(data / "a.jsonl", input_rows(4, 3000, 150), mode="ab")
        write_jsonl(ref_data / "a.jsonl", input_rows(4, 3000, 150), mode="ab")
        build_manifest(ref_spec, ref_store)
        run = dg.execute_job(manifest_job, instance=instance)
        assert run.success
        steps = [
            r.dagster_event.step_key for r in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_START)
        ]
        assert sorted(s.split(".")[-1] for s in steps) == ["t__manifest_files", "t__manifest_merge"]
        assert run.asset_materializations_for_node("t__manifest")[0].metadata["files_from_parts"].value == []
        assert shards_of(store) == shards_of(ref_store)
