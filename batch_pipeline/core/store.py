"""One storage root for everything a job writes: local disk or ``s3://bucket/prefix``, same code.

Writes go to a temporary name and are renamed into place (one PUT on S3), so a reader sees a part
either whole or not at all; a part torn by something else (a truncated copy, a crashed writer on a
filesystem without atomic rename) fails to parse and is skipped with a warning. Nothing is rewritten
in place except derived snapshots (the validated table), which are replaced atomically.
"""

import json
import logging
import os
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from batch_pipeline.core.settings import DEFAULT_LEASE_TTL, Settings

if TYPE_CHECKING:
    import pyarrow.dataset as ds

log = logging.getLogger(__name__)

TMP_PREFIX = ".tmp-"


class Store:
    """Files under one root, addressed by relative paths with forward slashes.

    ``lease_ttl`` is how long a lease or capacity hold written here stays valid without a renewal: every process
    sharing a root must agree on it, so it travels with the root."""

    def __init__(self, root: str | os.PathLike[str], lease_ttl: timedelta = DEFAULT_LEASE_TTL):
        root = str(root)
        self.lease_ttl = lease_ttl
        if "://" in root:
            self.fs, base = pafs.FileSystem.from_uri(root)
            self.scheme = root.split("://", 1)[0]
            self.is_local = False
        else:
            self.fs = pafs.LocalFileSystem()
            base = str(Path(root).resolve())
            Path(base).mkdir(parents=True, exist_ok=True)
            self.scheme = "file"
            self.is_local = True
        self.root = root
        self.base = base.rstrip("/")

    @classmethod
    def of(cls, settings: Settings) -> "Store":
        """The storage root the settings name, with their lease ttl."""
        return cls(settings.home, lease_ttl=settings.lease_ttl)

    def __repr__(self) -> str:
        return f"Store({self.root!r})"

    # -- paths -----------------------------------------------------------------
    def full(self, rel: str) -> str:
        return f"{self.base}/{rel}" if rel else self.base

    def local_path(self, rel: str) -> Path | None:
        """The OS path of ``rel`` when the store is on local disk (DuckDB views need it)."""
        return Path(self.full(rel)) if self.is_local else None

    def uri(self, rel: str) -> str:
        return str(self.local_path(rel)) if self.is_local else f"{self.scheme}://{self.full(rel)}"

    def dataset(self, rels: str | list[str], schema: pa.Schema | None = None) -> "ds.Dataset":
        """An Arrow dataset over Parquet file(s) of the store, for DuckDB to scan without reading them whole.

        ``pyarrow.dataset`` is imported here: it brings pandas (~0.2 s), which a code location's load, a sensor
        tick or a quote run never needs."""
        import pyarrow.dataset as ds

        paths = self.full(rels) if isinstance(rels, str) else [self.full(r) for r in rels]
        return ds.dataset(paths, schema=schema, format="parquet", filesystem=self.fs)

    def exists(self, rel: str) -> bool:
        return self.fs.get_file_info(self.full(rel)).type != pafs.FileType.NotFound

    def _complete_files(self, rel_dir: str, recursive: bool) -> Iterator[pafs.FileInfo]:
        """Every complete file under ``rel_dir`` (temporary names excluded), from one listing."""
        selector = pafs.FileSelector(self.full(rel_dir), allow_not_found=True, recursive=recursive)
        for info in self.fs.get_file_info(selector):
            if info.type == pafs.FileType.File and not info.base_name.startswith(TMP_PREFIX):
                yield info

    def list_files(self, rel_dir: str, *, recursive: bool = False, suffix: str = "") -> list[str]:
        """Relative paths of complete files under ``rel_dir`` (temporary names excluded), sorted."""
        infos = self._complete_files(rel_dir, recursive)
        return sorted(i.path[len(self.base) + 1 :] for i in infos if i.base_name.endswith(suffix))

    def file_stats(self, rel_dir: str) -> list[tuple[str, int, int | None]]:
        """``(relative path, size, mtime in ns)`` of every complete file under ``rel_dir``, recursively, sorted: one
        listing, no file opened (what changed under a folder, cheaply; mtime is None where the store has none)."""
        infos = self._complete_files(rel_dir, recursive=True)
        return sorted((i.path[len(self.base) + 1 :], i.size, i.mtime_ns) for i in infos)

    def mtime_ns(self, rel: str) -> int | None:
        """When ``rel`` was last written (None: no such file, or a store that does not say)."""
        info = self.fs.get_file_info(self.full(rel))
        return info.mtime_ns if info.type == pafs.FileType.File else None

    def list_dirs(self, rel_dir: str) -> list[str]:
        selector = pafs.FileSelector(self.full(rel_dir), allow_not_found=True)
        return sorted(i.base_name for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.Directory)

    def _mkdir_for(self, rel: str) -> None:
        parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
        self.fs.create_dir(self.full(parent), recursive=True)

    def _tmp_name(self, rel: str) -> str:
        head, _, name = rel.rpartition("/")
        tmp = f"{TMP_PREFIX}{uuid.uuid4().hex[:12]}-{name}"
        return f"{head}/{tmp}" if head else tmp

    # -- bytes -----------------------------------------------------------------
    def write_bytes(self, rel: str, data: bytes | pa.Buffer) -> None:
        self._mkdir_for(rel)
        if not self.is_local:  # one PUT is atomic on object stores
            with self.fs.open_output_stream(self.full(rel)) as out:
                out.write(data)
            return
        tmp = self._tmp_name(rel)
        with self.fs.open_output_stream(self.full(tmp)) as out:
            out.write(data)
        self.fs.move(self.full(tmp), self.full(rel))

    def copy(self, src: str, dst: str) -> None:
        """``src`` to ``dst`` byte for byte without holding it in memory; ``dst`` appears whole or not at all (a
        temporary name renamed on local disk, one server-side copy on an object store)."""
        self._mkdir_for(dst)
        if not self.is_local:
            self.fs.copy_file(self.full(src), self.full(dst))
            return
        tmp = self._tmp_name(dst)
        self.fs.copy_file(self.full(src), self.full(tmp))
        self.fs.move(self.full(tmp), self.full(dst))

    def read_bytes(self, rel: str) -> bytes:
        with self.fs.open_input_stream(self.full(rel)) as f:
            return f.read()

    def delete(self, rel: str) -> None:
        try:
            self.fs.delete_file(self.full(rel))
        except FileNotFoundError:
            pass

    # -- JSON records (intents, attempts, summaries) ----------------------------
    def write_json(self, rel: str, obj: Any) -> None:
        self.write_bytes(rel, json.dumps(obj, indent=1, sort_keys=True, default=str).encode())

    def read_json(self, rel: str) -> Any | None:
        try:
            return json.loads(self.read_bytes(rel))
        except FileNotFoundError:
            return None
        except json.JSONDecodeError:
            log.warning("ignoring torn JSON record %s", self.uri(rel))
            return None

    def create_json_exclusive(self, rel: str, obj: Any) -> bool:
        """Write ``rel`` only if it does not exist yet; True if this call created it."""
        data = json.dumps(obj, sort_keys=True, default=str).encode()
        if self.is_local:
            path = self.local_path(rel)
            assert path is not None
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return True
        if self.scheme == "s3":
            return self._s3_put_if_absent(rel, data)
        if self.exists(rel):  # other object stores: best effort (check, then write)
            return False
        self.write_bytes(rel, data)
        return True

    def _s3_put_if_absent(self, rel: str, data: bytes) -> bool:
        """A conditional PUT (``If-None-Match: *``): S3 itself decides who created the object first."""
        import boto3

        query = dict(part.split("=", 1) for part in self.root.partition("?")[2].split("&") if "=" in part)
        endpoint = query.get("endpoint_override")
        client = boto3.client(
            "s3",
            region_name=query.get("region"),
            endpoint_url=f"{query.get('scheme', 'https')}://{endpoint}" if endpoint else None,
        )
        bucket, _, prefix = self.base.partition("/")
        key = f"{prefix}/{rel}" if prefix else rel
        try:
            client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except client.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False
            raise
        return True

    # -- Parquet ---------------------------------------------------------------
    def write_table(self, rel: str, table: pa.Table, **kwargs: Any) -> None:
        """``table`` as Parquet at ``rel`` (zstd unless told otherwise), whole or not at all. On local disk it is
        encoded straight into its temporary file (``parquet_writer``): a file in memory first grew by doubling, and
        its copies and fresh pages cost 6-13% of a 50,000-prompt shard's write (``benchmarks/README.md``). An object
        store gets the bytes encoded in memory, in one PUT."""
        if not self.is_local:
            self.write_bytes(rel, parquet_bytes(table, **kwargs))
            return
        row_group_size = kwargs.pop("row_group_size", None)  # ``pq.write_table``'s own, not the writer's
        with self.parquet_writer(rel, table.schema, **kwargs) as writer:
            writer.write_table(table, row_group_size=row_group_size)

    @contextmanager
    def parquet_writer(self, rel: str, schema: pa.Schema, **kwargs: Any) -> Iterator[pq.ParquetWriter]:
        """Stream row groups into ``rel``; it appears under its name only when the block exits cleanly."""
        self._mkdir_for(rel)
        target = rel if not self.is_local else self._tmp_name(rel)
        sink = self.fs.open_output_stream(self.full(target))
        writer: pq.ParquetWriter | None = None
        try:
            writer = pq.ParquetWriter(sink, schema, compression=kwargs.pop("compression", "zstd"), **kwargs)
            yield writer
        except BaseException:
            if writer is not None:
                writer.close()
            sink.close()
            self.delete(target)  # also when the writer could not be built (an unknown codec): no temporary left
            raise
        writer.close()
        sink.close()
        if target != rel:
            self.fs.move(self.full(target), self.full(rel))

    @contextmanager
    def local_target(self, rel: str) -> Iterator[Path]:
        """A local path to write ``rel`` at (e.g. by DuckDB's ``COPY``): a temporary name, renamed into place when
        the block exits cleanly, deleted when it raises. Local stores only."""
        assert self.is_local
        self._mkdir_for(rel)
        tmp = self._tmp_name(rel)
        path = self.local_path(tmp)
        assert path is not None
        try:
            yield path
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        self.fs.move(self.full(tmp), self.full(rel))

    def read_part(self, rel: str, columns: list[str] | None = None) -> pa.Table | None:
        """One part, or None (with a warning) when it is torn or lacks a column asked for.

        Read as one ``ParquetFile``: ``pq.read_table`` builds a dataset around the single file, 2-2.5x the CPU of
        a small part (~0.7 against ~0.3 ms at 500 rows), and the control plane reads thousands of small parts."""
        try:
            with self.fs.open_input_file(self.full(rel)) as f:
                parquet = pq.ParquetFile(f)
                if columns is not None and (missing := set(columns).difference(parquet.schema_arrow.names)):
                    raise pa.ArrowInvalid(f"no column {sorted(missing)} in the part")  # as read_table says it
                return parquet.read(columns=columns)
        except (pa.ArrowInvalid, OSError) as exc:
            if isinstance(exc, FileNotFoundError):
                return None
            log.warning("ignoring torn part %s: %s", self.uri(rel), exc)
            return None

    def read_head(self, rel: str, rows: int = 10, columns: list[str] | None = None) -> tuple[pa.Table, int]:
        """The first ``rows`` rows of a Parquet file (``columns`` of them) and its row count, from its footer and
        first batch: a preview of a 10M-row table without reading it whole (the pages after the batch are not
        decompressed)."""
        with self.fs.open_input_file(self.full(rel)) as f:
            parquet = pq.ParquetFile(f)
            total = parquet.metadata.num_rows
            batch = next(parquet.iter_batches(batch_size=max(rows, 1), columns=columns), None)
            schema = (
                parquet.schema_arrow if columns is None else pa.schema([parquet.schema_arrow.field(c) for c in columns])
            )
            head = pa.Table.from_batches([batch] if batch is not None else [], schema=schema)
            return head.slice(0, rows), total

    def read_parts(self, rel_dir: str, columns: list[str] | None = None, recursive: bool = True) -> pa.Table | None:
        """The union of every complete Parquet part under ``rel_dir``; None if there are none."""
        tables = []
        for rel in self.list_files(rel_dir, recursive=recursive, suffix=".parquet"):
            t = self.read_part(rel, columns)
            if t is not None and t.num_rows:
                tables.append(t)
        if not tables:
            return None
        return pa.concat_tables(tables, promote_options="permissive")


def empty_table(schema: pa.Schema) -> pa.Table:
    """A table of no rows (``Schema.empty_table`` imports pandas, ~0.2 s, into a process that may never need it)."""
    return pa.Table.from_batches([], schema=schema)


def parquet_bytes(table: pa.Table, **kwargs: Any) -> pa.Buffer:
    """``table`` as a Parquet file in memory (zstd unless told otherwise)."""
    buf = pa.BufferOutputStream()  # no copy out of it, unlike io.BytesIO.getvalue()
    pq.write_table(table, buf, compression=kwargs.pop("compression", "zstd"), **kwargs)
    return buf.getvalue()


_writers: dict[tuple[int, int], ThreadPoolExecutor] = {}  # by (process, size): a forked child starts its own
_writers_lock = threading.Lock()


def shared_writers(workers: int) -> ThreadPoolExecutor:
    """One long-lived write pool per size, for callers that open a ``BackgroundWrites`` per small unit of work (a
    5,000-line shard's ingest): two threads started and joined per shard cost more than its writes' waits under
    load. Safe to share: a worker runs writes in the order submitted, so a write that waits on an earlier one
    (a result part on its payload) only ever waits on one already running or done."""
    key = (os.getpid(), workers)  # a pool inherited through fork has no threads behind it
    with _writers_lock:
        pool = _writers.get(key)
        if pool is None:
            pool = _writers[key] = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="store-write")
        return pool


class BackgroundWrites:
    """Writes run on worker threads, with at most ``depth`` submitted and not yet finished.

    Parquet encoding and zstd release the GIL, so a write runs on another core while the caller goes on with
    the next block. With one worker (the default) writes run in the order submitted, e.g. the row groups of
    one ``ParquetWriter``; with more, writes of separate files run side by side, and one that must land after
    another waits on the earlier one's future (``submit`` returns it). A failed write
    is raised by the next ``submit`` or by ``wait``. Leaving the ``with`` block waits for every pending write;
    it raises the first failure unless an exception is already on its way out. ``shared``: the writes run on the
    long-lived pool of ``shared_writers(workers)`` (no threads started or joined here); leaving the block still
    waits for this instance's writes, and only those.
    """

    def __init__(self, depth: int = 2, workers: int = 1, shared: bool = False):
        self.depth = max(1, depth)
        self._shared = shared  # a long-lived pool of ``workers`` threads, not shut down here (``shared_writers``)
        self._pool = (
            shared_writers(workers)
            if shared
            else ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="store-write")
        )
        self._pending: deque[Future] = deque()

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        """Queue ``fn(*args, **kwargs)``; its future, which a later write may wait on (writes start in the order
        submitted, so waiting on an earlier one never deadlocks)."""
        while self._pending and (len(self._pending) >= self.depth or self._pending[0].done()):
            self._pending.popleft().result()
        future = self._pool.submit(fn, *args, **kwargs)
        self._pending.append(future)
        return future

    def wait(self) -> None:
        """Block until every submitted write is done; raise the first failure."""
        first: BaseException | None = None
        while self._pending:
            try:
                self._pending.popleft().result()
            except BaseException as exc:  # noqa: BLE001 - wait for the rest, then raise the first
                first = first or exc
        if first is not None:
            raise first

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if not self._shared:
                self._pool.shutdown(wait=True)

    def __enter__(self) -> "BackgroundWrites":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except BaseException as failure:  # noqa: BLE001 - the exception already leaving wins
            log.warning("a background write failed while another error was raised: %s", failure)
