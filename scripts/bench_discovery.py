"""How long a public node's discovery pass takes when its peerstore holds peers whose
addresses lead nowhere: the LAN addresses of nodes behind NAT, as they spread before
issue 30. Baseline: the loop as it was (one dial at a time, no bound on the pass);
current: the shipped bound (DIAL_CONCURRENCY at once, DIAL_PASS_S a pass in all, at most
half of it for bootstrap peers, which these are).

    python scripts/bench_discovery.py [--peers 20]

It runs in a network namespace of its own (it re-runs itself under ``unshare -rn``),
where 198.18.99.0/24 (in 198.18.0.0/15, the range reserved for such tests) is routed into
``lo`` and answers nothing: each dial waits out its 5 s timeout, as a dial to a
stranger's 192.168.x address does. One real network process
per arm, its bootstrap list the dead peers (dialled every pass, as the peers a DHT
hands out are until they back off); the pass time is the one the process reports.
Prints one JSON line; figures in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sapo_node.config import NetSection, PoolSection  # noqa: E402
from sapo_node.net import identity  # noqa: E402
from sapo_node.net.discovery import DIAL_CONCURRENCY, DIAL_PASS_S  # noqa: E402
from sapo_node.net.process import Libp2pTransport  # noqa: E402


def dead_peers(n: int, tmp: Path) -> list[str]:
    """n peers with real ids at addresses that never answer."""
    out = []
    for i in range(n):
        key = identity.load_or_create(tmp / f"dead-{i}")
        out.append(f"/ip4/198.18.99.{i + 1}/tcp/4141/p2p/{identity.peer_id(key)}")
    return out


class Tuned(Libp2pTransport):
    """The node's own network process, with the dial settings of one arm."""

    dial: dict[str, object] = {}

    def _spawn(self) -> None:
        self.settings.update(self.dial)
        super()._spawn()


def pass_time(boot: list[str], data_dir: Path, dial: dict[str, object]) -> float:
    """Seconds of the first discovery pass of a node whose bootstrap peers are ``boot``."""
    net = NetSection(
        swarm="bench-discovery",
        listen=["/ip4/127.0.0.1/tcp/0"],
        bootstrap=boot,
        mdns=False,
    )
    Tuned.dial = dial
    t = Tuned(net, PoolSection(), data_dir)
    try:
        deadline = time.monotonic() + 30 + 10 * len(boot)
        while not t.child_stats.get("discovery_pass_s"):
            if time.monotonic() > deadline:
                raise TimeoutError("no discovery pass finished")
            time.sleep(0.05)
        return float(t.child_stats["discovery_pass_s"])
    finally:
        t.close()


def run(peers: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="bench-discovery-") as tmp:
        boot = dead_peers(peers, Path(tmp))
        baseline = pass_time(
            boot, Path(tmp) / "baseline", {"dial_concurrency": 1, "dial_pass_s": None}
        )
        current = pass_time(boot, Path(tmp) / "current", {})
    return {
        "dead_peers": peers,
        "baseline_pass_s": round(baseline, 2),
        "current_pass_s": round(current, 2),
        "speedup": round(baseline / current, 2),
        "bound_s": DIAL_PASS_S,
        "concurrency": DIAL_CONCURRENCY,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=20)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.inside:
        command = [
            "unshare",
            "-rn",
            sys.executable,
            __file__,
            "--inside",
            "--peers",
            str(args.peers),
        ]
        return subprocess.run(command).returncode
    names = sorted(name for _, name in socket.if_nameindex())
    if names != ["lo"]:
        print(f"interfaces {names}: not a fresh namespace", file=sys.stderr)
        return 3
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "route", "add", "198.18.99.0/24", "dev", "lo"], check=True)
    print(json.dumps(run(args.peers)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
