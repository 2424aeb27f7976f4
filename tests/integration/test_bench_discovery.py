"""scripts/bench_discovery.py still runs: one dead peer, both arms, in its own namespace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sapo_node.net.discovery import DIAL_PASS_S, DIAL_TIMEOUT_S
from tests.support.namespaces import need_namespaces, unshare_problem

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_the_discovery_benchmark_runs() -> None:
    need_namespaces(unshare_problem("ip", "link", "set", "lo", "up"))
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_discovery.py"), "--peers", "1"],
        capture_output=True, text=True, timeout=100, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # the dead peer's dial waits out its timeout in both arms; the pass is bounded
    assert DIAL_TIMEOUT_S - 0.5 <= result["baseline_pass_s"] <= DIAL_TIMEOUT_S + 2
    assert result["current_pass_s"] <= DIAL_PASS_S + 2
