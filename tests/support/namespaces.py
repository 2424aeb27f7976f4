"""Running a check script inside a user and network namespace of its own, and reading
its one-line JSON result: the test side (:func:`run_unshared`) and the script side
(:func:`script_main`) of ``tests/support/{mdns_pair,nat_swarm,nat_nodes,partition}.py``, and why a
machine cannot run them: the tests skip, saying so, unless ``SAPO_REQUIRE_NAMESPACES=1``
(``.ci/run`` sets it), where they fail instead (:func:`need_namespaces`)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REQUIRE = "SAPO_REQUIRE_NAMESPACES"  # "1": a namespace test that cannot run fails


def need_namespaces(problem: str | None) -> None:
    """Go on if ``problem`` is None; else skip the test, saying why, or, where
    ``SAPO_REQUIRE_NAMESPACES=1`` (CI), fail it: there a skip would pass unseen."""
    if problem is None:
        return
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{problem} ({REQUIRE}=1: the namespace tests must run here)")
    pytest.skip(problem)


def run_unshared(module: str, *args: str, timeout: float) -> tuple[int, dict, str]:
    """``unshare -rn python -m MODULE ARGS``: its exit code, its last result line and its
    log; the test fails, with the log's end, if it overruns or prints no result."""
    try:
        proc = subprocess.run(
            ["unshare", "-rn", sys.executable, "-m", module, *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-3000:]
        pytest.fail(f"{module} did not finish in {timeout:.0f} s; its log ends:\n{tail!r}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no result line (exit {proc.returncode}); log:\n{proc.stderr[-3000:]}"
    return proc.returncode, json.loads(lines[-1]), proc.stderr[-3000:]


def script_main(run: Callable[[], dict[str, object]]) -> int:
    """Refuse (exit 3) unless this is a fresh network namespace, run, print the result
    line (an exception becomes its ``error``); exit 0 if it is ``ok``, else 1."""
    names = sorted(name for _, name in socket.if_nameindex())
    if names != ["lo"]:
        error = (
            f"refusing to run: interfaces {names} mean this is not a fresh network namespace "
            "(run under `unshare -rn`)"
        )
        print(json.dumps({"ok": False, "error": error}), flush=True)
        return 3
    try:
        result = run()
    except Exception as exc:  # reported as a result line, for the test to show
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result, default=str), flush=True)
    return 0 if result["ok"] else 1


def conclude(result: dict[str, object], passed: dict[str, object]) -> dict[str, object]:
    """``result`` with ``ok`` set when every named check in ``passed`` holds, else its
    ``error`` naming the checks that failed."""
    failed = [name for name, ok in passed.items() if not ok]
    if failed:
        result["error"] = f"failed: {failed}"
    else:
        result["ok"] = True
    return result


def unshare_problem(*command: str) -> str | None:
    """Why ``unshare -rn COMMAND`` cannot run here, or None if it can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if shutil.which("unshare") is None:
        return "no `unshare` command (util-linux)"
    try:
        proc = subprocess.run(
            ["unshare", "-rn", *command], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`unshare -rn {' '.join(command)}` failed: {exc}"
    if proc.returncode != 0:
        return (
            f"`unshare -rn {' '.join(command)}` is not permitted here (unprivileged user "
            f"namespaces off?): {proc.stderr.strip()[:300]}"
        )
    return None


def veth_problem() -> str | None:
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) to make a veth pair"
    return unshare_problem("ip", "link", "add", "t0", "type", "veth", "peer", "name", "t1")


def nft_problem() -> str | None:
    if shutil.which("nft") is None:
        return "no `nft` command (Debian: apt-get install nftables)"
    return veth_problem()
