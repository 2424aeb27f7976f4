"""A public swarm through real NAT, built in network namespaces this test creates (a wan,
two home routers doing nftables masquerade, one of them symmetric) and removes when its
user namespace ends: ``tests/support/nat_swarm.py`` says what it builds and checks.

Nothing leaves the namespaces: their addresses are 198.18.0.0/15 and 10.0.0.0/8, inside
a network namespace of their own. Where namespaces or nftables are missing the test is
skipped with the reason; `.ci/run` installs nftables, so CI runs it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_mdns import REPO, _veth_problem

RUN_S = 150  # ~25 s quiet (five network processes start one after another)


def _nft_problem() -> str | None:
    if shutil.which("nft") is None:
        return "no `nft` command (Debian: apt-get install nftables)"
    return _veth_problem()


@pytest.mark.timeout(RUN_S + 30)
def test_home_nodes_behind_nat_join_through_public_nodes_and_leak_no_lan_address() -> None:
    problem = _nft_problem()
    if problem:
        pytest.skip(problem)
    try:
        proc = subprocess.run(
            ["unshare", "-rn", sys.executable, "-m", "tests.support.nat_swarm"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=RUN_S,
        )
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-3000:]
        pytest.fail(f"nat_swarm did not finish in {RUN_S} s; its log ends:\n{tail!r}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no result line (exit {proc.returncode}); log:\n{proc.stderr[-3000:]}"
    result = json.loads(lines[-1])
    assert proc.returncode == 0 and result["ok"], (
        f"exit {proc.returncode}: {result}\nlog:\n{proc.stderr[-3000:]}"
    )
    checks = result["checks"]
    assert checks["reachability"] == {
        "pub1": "public",
        "pub2": "public",
        "h1": "private",
        "h2": "private",
        "h3": "public",
    }
    # the public nodes' DHTs: each other and the home node with a forwarded port, only
    assert checks["routing_table"] == {"pub1": 2, "pub2": 2}
    assert checks["dht_lan_addrs"] == {"pub1": 0, "pub2": 0}
    assert checks["home_exchange"] and checks["exchange_without_pub1"]
    # the two home nodes reach each other through a public node's relay (circuit v2)
    assert checks["relayed_home_link"]
    assert all(relayed >= 1 for _, relayed in checks["connections"].values())
    assert checks["forwarded_port_dialled"]


@pytest.mark.timeout(RUN_S + 60)
def test_whole_nodes_behind_nat_take_each_others_groups(tiny_model_dir: Path) -> None:
    """The same NAT, with real `sapo-node start` processes: two relays (--no-train) on
    the wan and a tiny-model trainer in each home (tests/support/nat_nodes.py)."""
    problem = _nft_problem()
    if problem:
        pytest.skip(problem)
    command = ["unshare", "-rn", sys.executable, "-m", "tests.support.nat_nodes"]
    try:
        proc = subprocess.run(
            [*command, "--model", str(tiny_model_dir)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=RUN_S + 30,
        )
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-3000:]
        pytest.fail(f"nat_nodes did not finish; its log ends:\n{tail!r}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no result line (exit {proc.returncode}); log:\n{proc.stderr[-3000:]}"
    result = json.loads(lines[-1])
    assert proc.returncode == 0 and result["ok"], f"exit {proc.returncode}: {result}"
    checks = result["checks"]
    assert checks["each_takes_the_others_groups"]
    assert checks["reachability"] == {"h1": "private", "h2": "private"}
    assert set(checks["exit_codes"].values()) == {0}  # every node stopped cleanly
