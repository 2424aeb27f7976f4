"""mDNS discovery for real: two nodes with no bootstrap address find each other and
exchange a message each way.

mDNS multicasts on every interface it sees, so it runs only inside a user + network
namespace this test creates (``unshare -rn``), where the only interfaces are the ones
``tests/support/mdns_pair.py`` makes: ``lo``, and in the ``veth`` case a veth pair into a
second namespace. Nothing is ever multicast on this machine's own interfaces; where
unprivileged namespaces are not allowed the tests are skipped, with the reason.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN_S = 100  # a pair starts in ~8 s, finds each other ~1 s later; generous for a loaded CI


def _unshare_problem(*command: str) -> str | None:
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


def _veth_problem() -> str | None:
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) to make a veth pair"
    return _unshare_problem("ip", "link", "add", "t0", "type", "veth", "peer", "name", "t1")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["lo", "veth"])
def test_two_nodes_find_each_other_by_mdns_and_exchange_messages(mode: str) -> None:
    """``lo``: both on 127.0.0.1 in one namespace. ``veth``: two namespaces on one link,
    both listening on 0.0.0.0 as the default config does, so only the interface
    addresses mDNS announces can connect them (py-libp2p alone announced 0.0.0.0)."""
    problem = _unshare_problem("true") or (_veth_problem() if mode == "veth" else None)
    if problem:
        pytest.skip(problem)
    try:
        proc = subprocess.run(
            ["unshare", "-rn", sys.executable, "-m", "tests.support.mdns_pair", "--mode", mode],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=RUN_S,
        )
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-3000:]
        pytest.fail(f"mdns_pair did not finish in {RUN_S} s; its log ends:\n{tail!r}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no result line (exit {proc.returncode}); log:\n{proc.stderr[-3000:]}"
    result = json.loads(lines[-1])
    assert proc.returncode == 0 and result["ok"], (
        f"exit {proc.returncode}: {result}\nlog:\n{proc.stderr[-3000:]}"
    )
    assert result["mode"] == mode
    if mode == "veth":  # each node's own address on the link, not 0.0.0.0
        assert result["addrs"]["a"][0].startswith("/ip4/10.77.0.1/tcp/")
        assert result["addrs"]["b"][0].startswith("/ip4/10.77.0.2/tcp/")
