"""One TLS context per process for the provider SDKs' HTTP clients.

Each SDK client otherwise builds its own: httpx2 loads the system's CA store for every client (~22 ms), and a
google-genai client builds three. Executors are made per step, so a run paid that per step and backend. The
context is the one httpx2 builds for ``verify=True`` ($SSL_CERT_FILE or $SSL_CERT_DIR when set, else the system's
store), made once per setting of those variables. An ``ssl.SSLContext`` is safe to share between clients and
threads; nothing changes it after it is made.
"""

import os
import ssl
from functools import cache

import httpx2


def shared_tls_context() -> ssl.SSLContext:
    """The process's TLS context for the SDK clients (see the module's docstring)."""
    return _context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@cache
def _context(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    """``cafile`` and ``capath`` key the cache; httpx2 reads them from the environment itself."""
    return httpx2.create_ssl_context()
