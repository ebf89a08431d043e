"""Child processes of ``batch-pipeline dev``: started in their own session, stopped by PID, tree and all.

``dagster dev`` (headless) does not exit within 30 s of a SIGTERM or SIGINT to its process group, and its webserver,
daemon and code server outlive it. So the command starts it in a new session, and on its own SIGTERM or Ctrl-C
signals every process of that tree (found through ``/proc``: the descendants, and anything left in the session)
by PID, then kills what is still there after a grace period.
"""

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PROC = Path("/proc")


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, session id) of a live process, None when it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp session ...
    return int(fields[1]), int(fields[3])


def _all_pids() -> list[int]:
    return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()]


def tree(leader: int) -> set[int]:
    """The processes ``leader`` started (its descendants), and any left in its session (started with setsid)."""
    stats = {pid: st for pid in _all_pids() if (st := _stat(pid)) is not None}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [leader]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    found |= {pid for pid, (_, sid) in stats.items() if sid == leader and pid != leader}
    return found


def _alive(pid: int) -> bool:
    return _stat(pid) is not None and not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2 :].split()[0] == "Z"


def _signal(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop_tree(proc: subprocess.Popen, grace_s: float = 10.0) -> int:
    """SIGTERM the process and everything it started, by PID; SIGKILL whatever is left after ``grace_s``."""
    pids = tree(proc.pid) | {proc.pid}
    _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()  # reap our own child so it does not stay a zombie
        pids = {p for p in pids | tree(proc.pid) if _alive(p)}
        if not pids:
            break
        time.sleep(0.1)
    else:
        _signal(pids, signal.SIGKILL)
    try:
        return proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def start_in_session(argv: list[str], **kwargs) -> subprocess.Popen:
    """Start a child in a session of its own: a terminal's Ctrl-C reaches only us, and we stop it by PID."""
    return subprocess.Popen(argv, start_new_session=True, **kwargs)


@contextmanager
def term_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt in the main thread, so Ctrl-C and a supervisor's stop end alike."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
