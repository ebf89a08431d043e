"""``python -m batch_pipeline.sandbox --port N [--host 127.0.0.1] [--state-dir DIR] [--scenario NAME]
[--scenario-params JSON] [--param KEY=VALUE ...] [--verbose] [--s3-url URL]``.

Prints exactly one line ``SANDBOX READY http://127.0.0.1:PORT`` on stdout once it listens.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence

from batch_pipeline.process_exit import no_collection_at_exit
from batch_pipeline.sandbox.bedrock.s3 import S3_URL_ENV
from batch_pipeline.sandbox.http_server import SandboxServer, loopback_host
from batch_pipeline.sandbox.process import READY_PREFIX
from batch_pipeline.sandbox.scenarios import make_scenario

ENV_SCENARIO = "BATCH_PIPELINE_SANDBOX_SCENARIO"
ENV_SCENARIO_PARAMS = "BATCH_PIPELINE_SANDBOX_SCENARIO_PARAMS"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m batch_pipeline.sandbox", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="port to listen on; 0 picks a free one")
    parser.add_argument("--host", default="127.0.0.1", help="127.0.0.1 or localhost (nothing else is allowed)")
    parser.add_argument("--state-dir", default=None, help="persist state here so a restart keeps batches")
    parser.add_argument(
        "--scenario", default=os.environ.get(ENV_SCENARIO), help=f"server-wide scenario (${ENV_SCENARIO})"
    )
    parser.add_argument(
        "--scenario-params",
        default=os.environ.get(ENV_SCENARIO_PARAMS),
        help=f"JSON object of scenario params (${ENV_SCENARIO_PARAMS})",
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a scenario param (repeatable; over --scenario-params), coerced like scenario params, "
        "e.g. --param quota_enqueued_tokens=2000000",
    )
    parser.add_argument("--verbose", action="store_true", help="log every request on stderr")
    parser.add_argument(
        "--s3-url",
        default=None,
        help=f"the S3 endpoint Bedrock jobs use (${S3_URL_ENV}; default: a moto server it starts)",
    )
    return parser


def parse_params(items: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings as scenario params (values stay strings: ``make_scenario`` coerces them)."""
    params: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--param {item!r}: expected KEY=VALUE")
        params[key.strip()] = value
    return params


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sandbox until SIGTERM/SIGINT (served on a thread; the main thread waits for the signal)."""
    no_collection_at_exit()  # a stopped sandbox exits without the interpreter's last full collections
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        loopback_host(args.host)
        params = json.loads(args.scenario_params) if args.scenario_params else {}
        if not isinstance(params, dict):
            raise ValueError("--scenario-params must be a JSON object")
        params.update(parse_params(args.param))
        scenario = make_scenario(args.scenario, params)
    except ValueError as exc:
        parser.error(str(exc))
    if args.s3_url:
        os.environ[S3_URL_ENV] = args.s3_url  # read when the Bedrock jobs' S3 is set up
    # the handlers only set an event, and are in place before the port listens: a signal that comes at any moment
    # (a loaded machine makes the window before serving wide) stops it cleanly, never with a traceback
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = None
    try:
        server = SandboxServer(args.port, args.host, scenario=scenario, state_dir=args.state_dir, verbose=args.verbose)
        server.start()
        print(f"{READY_PREFIX}{server.url}", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
