"""The provider SDK clients share one TLS context per process (``executors/tls.py``), and it still verifies: a
loopback HTTPS server whose certificate a throwaway CA signed is reached when ``$SSL_CERT_FILE`` names that CA,
and refused when it does not."""

import datetime
import gc
import ipaddress
import json
import ssl
import threading
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from batch_pipeline.core.ledger.executor import RequestPlan
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.executors.anthropic.batch import AnthropicBatchExecutor, AnthropicBatchSettings
from batch_pipeline.executors.google.gemini_batch import GeminiBatchExecutor, GeminiBatchSettings
from batch_pipeline.executors.google.vertex_batch import VertexBatchExecutor, VertexBatchSettings
from batch_pipeline.executors.online.transport import BodyBuilder, SdkTransport
from batch_pipeline.executors.openai.azure import AzureOpenAIBatchExecutor, AzureOpenAIBatchSettings
from batch_pipeline.executors.openai.batch import OpenAIBatchExecutor, OpenAIBatchSettings
from batch_pipeline.executors.tls import shared_tls_context
from batch_pipeline_tests.core.helpers import base_spec_dict


def _reachable_tls_contexts(root: object, limit: int = 200_000) -> set[int]:
    """The ids of every ``ssl.SSLContext`` an object holds, directly or through its attributes and containers
    (modules, classes and functions are not followed: they lead to everything)."""
    skip = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
    seen: set[int] = set()
    found: set[int] = set()
    todo = [root]
    while todo and len(seen) < limit:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        if isinstance(obj, ssl.SSLContext):
            found.add(id(obj))
        todo.extend(gc.get_referents(obj))
    return found


def test_every_sdk_client_holds_the_one_shared_context(monkeypatch):
    for env in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "AZURE_OPENAI_API_KEY"):
        monkeypatch.setenv(env, "not-a-key")
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", "https://example-resource.openai.azure.com")
    shared = {id(shared_tls_context())}
    url = "https://api.example.invalid"
    clients = [
        OpenAIBatchExecutor(OpenAIBatchSettings(base_url=f"{url}/v1")),
        OpenAIBatchExecutor(OpenAIBatchSettings(base_url=f"{url}/v1")),
        AzureOpenAIBatchExecutor(AzureOpenAIBatchSettings()),
        AnthropicBatchExecutor(AnthropicBatchSettings(base_url=url)),
        GeminiBatchExecutor(GeminiBatchSettings(base_url=url)),
        SdkTransport(f"{url}/v1", "not-a-key", 5.0, 4, BodyBuilder(_plan(), None)),
    ]
    for client in clients:
        assert _reachable_tls_contexts(client) == shared, type(client).__name__


def test_vertex_shares_the_context_on_the_sandbox_and_builds_its_own_against_google(
    vertex_sandbox, tmp_path, monkeypatch
):
    """On the loopback sandbox no client certificate applies, so the client takes the shared context. Against
    Vertex itself the SDK builds its own (one that carries Google's default client certificate when mTLS is
    configured), so the shared one is nowhere in it."""
    shared = id(shared_tls_context())
    on_sandbox = VertexBatchExecutor(VertexBatchSettings(sandbox=True))
    assert _reachable_tls_contexts(on_sandbox.client) == {shared}
    adc = tmp_path / "adc.json"  # application default credentials that load without a network call
    adc.write_text(
        json.dumps({"type": "authorized_user", "client_id": "c", "client_secret": "s", "refresh_token": "r"})
    )
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    against_google = VertexBatchExecutor(
        VertexBatchSettings(sandbox=False, project="p", bucket="b", base_url="https://vertex.example.invalid")
    )
    contexts = _reachable_tls_contexts(against_google.client)
    assert contexts and shared not in contexts


def _plan() -> RequestPlan:
    return RequestPlan.from_spec(JobSpec.model_validate(base_spec_dict("in.jsonl")))


def _certificates(where: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate for 127.0.0.1 it signed: (CA certificate, server certificate, server key)."""
    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder(issuer_name=name("test CA"), subject_name=name("test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )  # digital signature, certificate and CRL signing
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    server = (
        x509.CertificateBuilder(issuer_name=ca.subject, subject_name=name("127.0.0.1"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = where / "ca.pem", where / "server.pem", where / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


class _Files(BaseHTTPRequestHandler):
    """``GET /v1/files``: an empty list, as the Files API answers it."""

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        body = json.dumps({"object": "list", "data": [], "has_more": False}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def https_server(tmp_path) -> Iterator[tuple[str, Path]]:
    """A loopback HTTPS server on a free port: (its URL, the CA that signed its certificate)."""
    ca, cert, key = _certificates(tmp_path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/v1", ca
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_the_shared_context_verifies_against_ssl_cert_file(https_server, monkeypatch):
    url, ca = https_server
    monkeypatch.setenv("OPENAI_API_KEY", "not-a-key")
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    trusted = OpenAIBatchExecutor(OpenAIBatchSettings(base_url=url, max_retries=0))
    assert list(trusted.client.files.list()) == []
    monkeypatch.delenv("SSL_CERT_FILE")  # the system's store does not know the throwaway CA
    untrusted = OpenAIBatchExecutor(OpenAIBatchSettings(base_url=url, max_retries=0))
    with pytest.raises(openai.APIConnectionError) as refused:
        untrusted.client.files.list()
    assert "CERTIFICATE_VERIFY_FAILED" in repr(refused.value.__cause__) or "certificate verify failed" in str(
        refused.value.__cause__
    )
