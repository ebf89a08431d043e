"""Where each kind of record of a job lives under the store root (one place, so layouts never drift)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class JobPaths:
    job: str

    @property
    def root(self) -> str:
        return f"jobs/{self.job}"

    # manifest: items are one file per shard, rows and rejects one snapshot per generation
    @property
    def generations(self) -> str:
        return f"{self.root}/manifest/generations"

    def generation(self, gen: int) -> str:
        return f"{self.generations}/gen-{gen:06d}.json"

    def shard_items(self, shard_id: str) -> str:
        return f"{self.root}/manifest/items/{shard_id}.parquet"

    def rows(self, gen: int) -> str:
        return f"{self.root}/manifest/rows/gen-{gen:06d}.parquet"

    def rejects(self, gen: int) -> str:
        return f"{self.root}/manifest/rejects/gen-{gen:06d}.parquet"

    def id_index(self, gen: int) -> str:
        """The sorted request IDs generation ``gen`` added (the manifest's on-disk dedup index)."""
        return f"{self.root}/manifest/index/gen-{gen:06d}.parquet"

    def file_part(self, key: str, suffix: str) -> str:
        """One input file read, normalised and hashed on its own (``.parquet`` blocks, ``.json`` record)."""
        return f"{self.root}/manifest/file_parts/{key}{suffix}"

    # results: append-only parts per (shard, attempt, flush)
    @property
    def results(self) -> str:
        return f"{self.root}/results"

    def result_part(self, shard_id: str, attempt: int, flush: int, token: str) -> str:
        return f"{self.results}/{shard_id}/attempt-{attempt:04d}-flush-{flush:05d}-{token}.parquet"

    # raw provider payloads: one part beside each result part (same shard and name), read only when asked for
    @property
    def payloads(self) -> str:
        return f"{self.root}/payloads"

    def payload_part(self, result_part: str) -> str:
        return self.payloads + result_part.removeprefix(self.results)

    # attempts: one immutable JSON record per event (intent, submitted, collected)
    def attempts(self, shard_id: str) -> str:
        return f"{self.root}/attempts/{shard_id}"

    def attempt_event(self, shard_id: str, attempt: int, event: str) -> str:
        return f"{self.attempts(shard_id)}/attempt-{attempt:04d}.{event}.json"

    # state: one summary per shard (core/run/summary.py), job-wide flags
    def shard_summary(self, shard_id: str) -> str:
        return f"{self.root}/state/shards/{shard_id}.json"

    def shard_route(self, shard_id: str) -> str:
        """The router's choice for the shard (``backend: auto``, core/route/)."""
        return f"{self.root}/state/routes/{shard_id}.json"

    @property
    def replays(self) -> str:
        return f"{self.root}/replays"

    @property
    def pause(self) -> str:
        return f"{self.root}/control/pause.json"

    @property
    def stop(self) -> str:
        return f"{self.root}/control/stop.json"

    @property
    def canary_verdict(self) -> str:
        return f"{self.root}/golden/canary.json"

    def lease(self, shard_id: str) -> str:
        return f"{self.root}/leases/{shard_id}.json"

    # derived outputs: staged by `results`, promoted to validated/ only when every blocking check passed
    @property
    def staged(self) -> str:
        return f"{self.root}/staged/{self.job}.parquet"

    @property
    def staged_dead_letters(self) -> str:
        return f"{self.root}/staged/dead_letters.parquet"

    @property
    def validated(self) -> str:
        return f"{self.root}/validated/{self.job}.parquet"

    @property
    def dead_letters(self) -> str:
        return f"{self.root}/validated/dead_letters.parquet"

    @property
    def quote(self) -> str:
        return f"{self.root}/quote.json"

    @property
    def report(self) -> str:
        return f"{self.root}/report.json"

    @property
    def report_png(self) -> str:
        return f"{self.root}/report.png"

    @property
    def spec_source(self) -> str:
        """Where the spec of the job's last run lives, so later commands find it by the job's name."""
        return f"{self.root}/spec_source.json"

    @property
    def duckdb(self) -> str:
        return f"{self.root}/{self.job}.duckdb"
