"""Gemini Developer API files: uploaded inputs and generated responses files, kept apart from the batches that read
and write them. Their bytes are blobs in the sandbox's spool (``gemini-<id>``: the state directory's ``files/`` when
there is one), never held in memory: a 1M-row job's inputs and responses files were gigabytes."""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from batch_pipeline.sandbox.google.errors import GoogleError
from batch_pipeline.sandbox.ids import new_id
from batch_pipeline.sandbox.spool import CHUNK_BYTES, Spool
from batch_pipeline.sandbox.store import rfc3339

FILE_TTL_S = 48 * 3600
BLOB_PREFIX = "gemini-"


def gemini_id() -> str:
    """Lower-case alphanumerics: the SDK extracts file names from URIs with ``[a-z0-9]+``."""
    return new_id("")[:16]


def file_sha256_hash(path: Path) -> str:
    """A File's ``sha256Hash`` as the Files API writes it: base64 of the *hex* SHA-256 digest of the bytes (88
    characters; not base64 of the raw 32-byte digest that the field's ``bytes`` type would suggest), the file read
    a chunk at a time."""
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(CHUNK_BYTES):
            digest.update(chunk)
    return base64.b64encode(digest.hexdigest().encode("ascii")).decode("ascii")


@dataclass
class GeminiFile:
    """An uploaded (``UPLOADED``) or generated (``GENERATED``, a responses file) file; its bytes are at ``path``."""

    id: str
    display_name: str | None
    mime_type: str
    created_at: float
    size: int
    source: str = "UPLOADED"
    sha256: str = ""  # ``sha256Hash``, set when the bytes are stored (``GeminiFiles.add``)
    path: Path = field(default=Path(), compare=False)  # in the spool; not saved

    def read(self) -> bytes:
        """The bytes whole (a batch's input, parsed when the batch is created)."""
        return self.path.read_bytes()

    def to_api(self, host: str, version: str) -> dict[str, Any]:
        """The ``File`` resource (int64 ``sizeBytes`` as a JSON string, as Google sends it)."""
        body: dict[str, Any] = {
            "name": f"files/{self.id}",
            "mimeType": self.mime_type,
            "sizeBytes": str(self.size),
            "createTime": rfc3339(self.created_at),
            "updateTime": rfc3339(self.created_at),
            "expirationTime": rfc3339(self.created_at + FILE_TTL_S),
            "sha256Hash": self.sha256,
            "uri": f"http://{host}/{version}/files/{self.id}",
            "state": "ACTIVE",
            "source": self.source,
        }
        if self.display_name:
            body["displayName"] = self.display_name
        if self.source == "GENERATED":
            body["downloadUri"] = f"http://{host}/download/{version}/files/{self.id}:download?alt=media"
        return body


@dataclass
class Upload:
    """A resumable upload under way: its bytes appended to a part in the spool as they arrive (the SDK sends 8 MB
    at a time; a 2 GB file held whole until finalized was the sandbox's peak)."""

    file: GeminiFile
    path: Path
    received: int = 0

    def append(self, chunk: bytes) -> None:
        with self.path.open("ab") as out:
            out.write(chunk)
        self.received += len(chunk)


class GeminiFiles:
    """The files of the Gemini API on one sandbox, and its open resumable uploads (callers hold the state lock)."""

    def __init__(self, spool: Spool) -> None:
        self.spool = spool
        self.clear()

    def clear(self) -> None:
        for upload in getattr(self, "uploads", {}).values():
            upload.path.unlink(missing_ok=True)
        self.files: dict[str, GeminiFile] = {}
        self.uploads: dict[str, Upload] = {}  # resumable sessions by id

    def __contains__(self, file_id: str) -> bool:
        return file_id in self.files

    def newest_first(self) -> list[GeminiFile]:
        return list(reversed(self.files.values()))

    def open_upload(self, session_id: str, stored: GeminiFile) -> Upload:
        """A resumable upload of ``stored`` (its declared size) starts."""
        upload = self.uploads[session_id] = Upload(stored, self.spool.path(f"{BLOB_PREFIX}upload-{session_id}.part"))
        upload.path.unlink(missing_ok=True)
        return upload

    def end_upload(self, session_id: str) -> Upload:
        """The session is over (finalized or refused): its part stays for ``add_file`` or goes with ``discard``."""
        return self.uploads.pop(session_id)

    def add_file(self, stored: GeminiFile, source: Path) -> GeminiFile:
        """Keep a file whose bytes were written to ``source`` in the spool (moved into place; no file: empty); its
        size and hash are taken now."""
        stored.path = self.spool.path(BLOB_PREFIX + stored.id)
        if source.exists():
            os.replace(source, stored.path)
        else:
            stored.path.write_bytes(b"")
        stored.size, stored.sha256 = stored.path.stat().st_size, file_sha256_hash(stored.path)
        self.files[stored.id] = stored
        return stored

    def get(self, file_id: str) -> GeminiFile:
        """A file by id (403, as the API answers for a file that is unknown or not the caller's)."""
        if file_id not in self.files:
            raise GoogleError(403, f"You do not have permission to access the File {file_id} or it may not exist.")
        return self.files[file_id]

    def delete(self, file_id: str) -> None:
        self.get(file_id)
        del self.files[file_id]
        self.spool.delete(BLOB_PREFIX + file_id)

    def to_json(self) -> list[dict[str, Any]]:
        """The files without their bytes (those are blobs in the spool)."""
        return [{k: v for k, v in asdict(f).items() if k != "path"} for f in self.files.values()]

    def load(self, saved: list[dict[str, Any]] | None) -> None:
        """Restore files saved by ``to_json``, their bytes in the spool."""
        for item in saved or []:
            stored = GeminiFile(**item, path=self.spool.path(BLOB_PREFIX + item["id"]))
            if not stored.sha256:  # saved before the hash was kept
                stored.sha256 = file_sha256_hash(stored.path)
            self.files[stored.id] = stored
