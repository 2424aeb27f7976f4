"""Processes a script starts, and the JSON log lines they write."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def child_setup(niceness: int) -> None:
    """In the child before exec: lower its priority (the machine may be shared), and
    SIGKILL it when the script that started it dies (Linux)."""
    os.nice(niceness)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def killpg(pid: int, sig: int) -> None:
    """Signal the process group led by ``pid``, if it is still there."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def json_events(path: Path) -> list[dict]:
    """The JSON log lines of one process (other lines, e.g. a traceback, are skipped)."""
    out = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
    return out


def log_tail(path: Path, n: int = 15) -> list[str]:
    """The last ``n`` lines of a log (none if it is not there)."""
    with contextlib.suppress(FileNotFoundError):
        return path.read_text(errors="replace").splitlines()[-n:]
    return []


def event_time(event: dict) -> float | None:
    """A JSON log line's timestamp, in seconds since the epoch (by its writer's clock)."""
    with contextlib.suppress(KeyError, TypeError, ValueError):
        return datetime.fromisoformat(event["timestamp"]).timestamp()
    return None


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """This process's standard error (file descriptor 2, so the network processes' too)
    into ``path`` for the block, off the report on stdout; then back."""
    saved = os.dup(2)
    with open(path, "w") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
