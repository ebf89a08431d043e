"""Gemini Developer API files: uploaded inputs and generated responses files, bytes in memory (and in the state
directory when there is one), kept apart from the batches that read and write them."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import asdict, dataclass
from typing import Any

from batch_pipeline.sandbox.google.errors import GoogleError
from batch_pipeline.sandbox.ids import new_id
from batch_pipeline.sandbox.persistence import StateDir
from batch_pipeline.sandbox.store import rfc3339

FILE_TTL_S = 48 * 3600
BLOB_PREFIX = "gemini-"


def gemini_id() -> str:
    """Lower-case alphanumerics: the SDK extracts file names from URIs with ``[a-z0-9]+``."""
    return new_id("")[:16]


def sha256_hash(data: bytes) -> str:
    """A File's ``sha256Hash`` as the Files API writes it: base64 of the *hex* SHA-256 digest of the bytes (88
    characters; not base64 of the raw 32-byte digest that the field's ``bytes`` type would suggest)."""
    return base64.b64encode(hashlib.sha256(data).hexdigest().encode("ascii")).decode("ascii")


@dataclass
class GeminiFile:
    """An uploaded (``UPLOADED``) or generated (``GENERATED``, a responses file) file; bytes in memory."""

    id: str
    display_name: str | None
    mime_type: str
    created_at: float
    size: int
    source: str = "UPLOADED"
    data: bytes = b""
    sha256: str = ""  # ``sha256Hash``, set when the bytes are stored (``GeminiFiles.add``)

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


class GeminiFiles:
    """The files of the Gemini API on one sandbox, and its open resumable uploads (callers hold the state lock)."""

    def __init__(self, store: StateDir | None) -> None:
        self.store = store
        self.clear()

    def clear(self) -> None:
        self.files: dict[str, GeminiFile] = {}
        self.uploads: dict[str, dict[str, Any]] = {}  # resumable sessions: {"file": GeminiFile, "data": bytearray}

    def __contains__(self, file_id: str) -> bool:
        return file_id in self.files

    def newest_first(self) -> list[GeminiFile]:
        return list(reversed(self.files.values()))

    def add(self, stored: GeminiFile) -> GeminiFile:
        """Keep a file whose bytes are complete (its hash is taken now)."""
        stored.sha256 = sha256_hash(stored.data)
        self.files[stored.id] = stored
        if self.store is not None:
            self.store.write_blob(BLOB_PREFIX + stored.id, stored.data)
        return stored

    def get(self, file_id: str) -> GeminiFile:
        """A file by id (403, as the API answers for a file that is unknown or not the caller's)."""
        if file_id not in self.files:
            raise GoogleError(403, f"You do not have permission to access the File {file_id} or it may not exist.")
        return self.files[file_id]

    def delete(self, file_id: str) -> None:
        self.get(file_id)
        del self.files[file_id]
        if self.store is not None:
            self.store.delete_blob(BLOB_PREFIX + file_id)

    def to_json(self) -> list[dict[str, Any]]:
        """The files without their bytes (those are blobs in the state directory)."""
        return [{k: v for k, v in asdict(f).items() if k != "data"} for f in self.files.values()]

    def load(self, saved: list[dict[str, Any]] | None) -> None:
        """Restore files saved by ``to_json``, their bytes read back from the state directory."""
        for item in saved or []:
            stored = GeminiFile(**item)
            if self.store is not None:
                stored.data = self.store.read_blob(BLOB_PREFIX + stored.id)
            if not stored.sha256:  # saved before the hash was kept
                stored.sha256 = sha256_hash(stored.data)
            self.files[stored.id] = stored
