"""A swarm cut in two by a partition that kills its connections, and healed, in network
namespaces this test creates: ``tests/support/partition.py`` says what it builds and
checks. Skipped, with the reason, where namespaces or nftables are missing; `.ci/run`
installs nftables."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.test_mdns import REPO
from tests.integration.test_nat import _nft_problem

RUN_S = 150  # ~35 s quiet


@pytest.mark.timeout(RUN_S + 30)
def test_a_partition_heals_without_restarts_or_bans() -> None:
    problem = _nft_problem()
    if problem:
        pytest.skip(problem)
    try:
        proc = subprocess.run(
            ["unshare", "-rn", sys.executable, "-m", "tests.support.partition", "--mode", "reset"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=RUN_S,
        )
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-3000:]
        pytest.fail(f"partition did not finish in {RUN_S} s; its log ends:\n{tail!r}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no result line (exit {proc.returncode}); log:\n{proc.stderr[-3000:]}"
    result = json.loads(lines[-1])
    assert proc.returncode == 0 and result["ok"], (
        f"exit {proc.returncode}: {result}\nlog:\n{proc.stderr[-3000:]}"
    )
    checks = result["checks"]
    assert checks["left_half_while_cut"] and checks["right_half_while_cut"]
    assert checks["nothing_crosses_while_cut"] and checks["crosses_after_heal"]
    assert set(checks["restarts"].values()) == {0} and set(checks["banned"].values()) == {0}
