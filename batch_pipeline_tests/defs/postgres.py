"""Debian's PostgreSQL as a real server for the tests: ``initdb`` in a temp dir, ``postgres`` on a free loopback
port, stopped by its PID; and a DAGSTER_HOME whose dagster.yaml keeps the instance in it, as the Helm chart does.

Run as root (CI, ``scripts/setup.sh`` installs the package), the server runs as the ``postgres`` system user, which
``initdb`` requires. The password reaches Dagster only through ``$DAGSTER_PG_PASSWORD`` (the chart's variable).
"""

import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import yaml
from dagster_postgres.utils import get_conn_string

REPO = Path(__file__).resolve().parents[2]
PASSWORD_ENV = "DAGSTER_PG_PASSWORD"
USER = "dagster"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
# SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3; dagster-postgres ships psycopg2 (the chart's
# postgresql.postgresqlScheme must say the same)
SCHEME = "postgresql+psycopg2"


@dataclass(frozen=True)
class PostgresServer:
    pid: int
    port: int
    password: str

    def url(self, db: str) -> str:
        return get_conn_string(USER, self.password, "127.0.0.1", db, str(self.port), scheme=SCHEME)

    def connect(self, db: str = "postgres"):
        return psycopg2.connect(host="127.0.0.1", port=self.port, user=USER, password=self.password, dbname=db)

    def create_database(self, db: str) -> str:
        conn = self.connect()
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{db}"')
        conn.close()
        return db


def _bin(name: str) -> str:
    """The newest installed server binary (Debian keeps them under /usr/lib/postgresql/<version>/bin)."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    path = found[-1] if found else shutil.which(name)
    if path is None:
        raise RuntimeError(
            f"PostgreSQL's {name} is not installed: run scripts/setup.sh as root (apt-get install postgresql)"
        )
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def postgres_server(durable: bool = False) -> Iterator[PostgresServer]:
    """``durable``: commits wait for the disk, as a production server's do (tests run without it)."""
    as_root = os.geteuid() == 0
    owner = pwd.getpwnam("postgres") if as_root else None
    root = Path(tempfile.mkdtemp(prefix="bp_postgres_"))  # not under pytest's 0700 root-owned tmp: postgres reads it
    data, pwfile = root / "data", root / "pw"
    password = secrets.token_hex(12)
    pwfile.write_text(password)
    if owner is not None:
        for path in (root, pwfile):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    user = {"user": owner.pw_uid, "group": owner.pw_gid} if owner is not None else {}
    subprocess.run(
        [
            _bin("initdb"),
            "-D",
            str(data),
            "-U",
            USER,
            "--auth=scram-sha-256",
            f"--pwfile={pwfile}",
            "-E",
            "UTF8",
            "--no-sync",
        ],
        check=True,
        capture_output=True,
        **user,
    )
    port = _free_port()
    log = (root / "server.log").open("wb")
    fast = [] if durable else ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
    proc = subprocess.Popen(
        [
            _bin("postgres"),
            "-D",
            str(data),
            "-p",
            str(port),
            "-h",
            "127.0.0.1",
            "-k",
            str(root),
            *fast,
            "-c",
            "max_connections=200",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        **user,
    )
    server = PostgresServer(proc.pid, port, password)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {proc.returncode}:\n{(root / 'server.log').read_text()}")
            try:
                server.connect().close()
                break
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield server
    finally:
        proc.send_signal(signal.SIGINT)  # "fast" shutdown: sessions are closed, the server exits
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def postgres_dagster_home(home: Path, server: PostgresServer, db: str) -> Path:
    """A DAGSTER_HOME whose dagster.yaml (the one there, else the repo's) keeps runs, events and schedules in
    Postgres database ``db``."""
    home.mkdir(parents=True, exist_ok=True)
    existing = home / "dagster.yaml"
    config = yaml.safe_load((existing if existing.exists() else REPO / "dagster.yaml").read_text())
    config["storage"] = {
        "postgres": {
            "postgres_db": {  # the shape the chart renders (its postgresql values)
                "username": USER,
                "password": {"env": PASSWORD_ENV},
                "hostname": "127.0.0.1",
                "db_name": db,
                "port": server.port,
                "params": {},
                "scheme": SCHEME,
            }
        }
    }
    (home / "dagster.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return home
