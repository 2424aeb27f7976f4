"""A swarm cut in two and healed, on one machine. ``tests/integration/test_partition.py``
runs

    unshare -rn python -m tests.support.partition

inside a user and network namespace of its own ("left"), beside a second one it makes
("right"), joined by one veth link (198.18.10.1 here, 198.18.10.2 there), and cuts it
(``--mode reset``: nftables answers the other half with TCP resets, so connections die
as after a router's reboot; ``down``: the link goes down, and TCP keeps its connections
through a short cut):

    left:  a (bootstrap of all), b        right:  c, d

Each member is a real network process (``Libp2pTransport``, the node's own). It checks,
in order: a message crosses the link; with the link down, each half still exchanges
within itself and nothing crosses; with the link up again, messages cross both ways
within ``--heal-s``, with no restart of any network process and no ban. It prints one
JSON line (each check, timings, ``error``) and exits 0 if every check passed, 1 if not,
3 if not in a fresh namespace.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from sapo_node.config import NetSection, PoolSection
from sapo_node.net.process import Libp2pTransport
from tests.support.mdns_pair import lo_up, wait_for
from tests.support.namespaces import script_main
from tests.support.nat_swarm import VALID, Netns

REDIAL_S = 2.0
# The "reset" cut: every packet from the other half is answered with a TCP reset (or
# dropped), so the connections across die at once, as after a router's reboot; the
# halves must dial each other again when it heals.
RESET = """
table inet cut {{
  chain input {{
    type filter hook input priority 0;
    ip saddr {other} tcp flags & (syn | ack) != 0 reject with tcp reset
    ip saddr {other} drop
  }}
}}
"""


def run(mode: str, deliver_s: float, cut_s: float, heal_s: float) -> dict[str, object]:
    result: dict[str, object] = {"ok": False, "mode": mode, "checks": {}}
    checks: dict[str, object] = result["checks"]  # type: ignore[assignment]
    ns = Netns(["right"])
    lo_up()
    with ns.inside("right"):
        lo_up()
    ns.link(None, "left0", "198.18.10.1/24", "right", "right0", "198.18.10.2/24")
    vectors = [p.read_bytes() for p in sorted(VALID.glob("*.msgpack"))]
    members: dict[str, Libp2pTransport] = {}
    got: dict[str, set[tuple[bytes, str]]] = {}
    sent = 0

    def start(name: str, where: str | None, listen: str, boot: list[str]) -> None:
        net = NetSection(
            swarm="partition", listen=[listen], bootstrap=boot, redial_s=REDIAL_S, mdns=False
        )
        with ns.inside(where):
            members[name] = Libp2pTransport(net, PoolSection(), Path(tmp) / name)
        got[name] = set()

    def publish(name: str) -> tuple[bytes, str]:
        nonlocal sent
        data = vectors[sent % len(vectors)]
        sent += 1
        # the same bytes twice are one message to the pool, not to GossipSub (new seqno)
        members[name].publish(data)
        return data, members[name].peer_id

    def collect() -> None:
        for name, t in members.items():
            got[name] |= {(m.data, m.author) for m in t.received()}

    def reaches(src: str, dst: list[str], within: float) -> bool:
        for name in members:
            got[name].clear()
        message = publish(src)

        def arrived() -> bool:
            collect()
            return all(message in got[d] for d in dst)

        return wait_for(arrived, within)

    with tempfile.TemporaryDirectory(prefix="partition-") as tmp:
        try:
            start("a", None, "/ip4/198.18.10.1/tcp/4001", [])
            boot = [f"{members['a'].addrs[0]}"]
            start("b", None, "/ip4/198.18.10.1/tcp/4002", boot)
            start("c", "right", "/ip4/198.18.10.2/tcp/4001", boot)
            start("d", "right", "/ip4/198.18.10.2/tcp/4002", boot)
            # Every member a peer of every other before the cut: what each half keeps is
            # then what it had. (When each has two peers, c and d may not know of each
            # other yet, and cannot learn of it while a is out of reach.)
            if not wait_for(lambda: all(t.peers() >= 3 for t in members.values()), 60):
                result["error"] = f"no mesh in 60 s: { {n: t.peers() for n, t in members.items()} }"
                return result
            checks["crosses_before"] = reaches("b", ["c", "d"], deliver_s)
            checks["peers_at_cut"] = {n: t.peers() for n, t in members.items()}
            cut_rules = []
            for where, other in ((None, "198.18.10.2"), ("right", "198.18.10.1")):
                if mode == "down":
                    continue
                rules = RESET.format(other=other)
                ns.run(where, "nft", "-f", "-", stdin=rules)
                cut_rules.append(where)
            if mode == "down":
                ns.run(None, "ip", "link", "set", "left0", "down")
            cut = time.monotonic()
            checks["left_half_while_cut"] = reaches("a", ["b"], deliver_s)
            checks["right_half_while_cut"] = reaches("d", ["c"], deliver_s)
            checks["peers_while_cut"] = {n: t.peers() for n, t in members.items()}
            checks["nothing_crosses_while_cut"] = not reaches("b", ["c"], 3.0)
            time.sleep(max(0.0, cut_s - (time.monotonic() - cut)))
            if mode == "down":
                ns.run(None, "ip", "link", "set", "left0", "up")
            for where in cut_rules:
                ns.run(where, "nft", "delete", "table", "inet", "cut")
            healed = time.monotonic()
            crossed = wait_for(
                lambda: reaches("c", ["a", "b"], 2.0) and reaches("b", ["c", "d"], 2.0), heal_s
            )
            checks["crosses_after_heal"] = crossed
            checks["heal_s"] = round(time.monotonic() - healed, 1)
            checks["restarts"] = {n: t.stats().restarts for n, t in members.items()}
            checks["banned"] = {n: len(t.child_stats.get("banned", {})) for n, t in members.items()}
            failed = [
                name
                for name in (
                    "crosses_before",
                    "left_half_while_cut",
                    "right_half_while_cut",
                    "nothing_crosses_while_cut",
                    "crosses_after_heal",
                )
                if not checks[name]
            ]
            if any(checks["restarts"].values()) or any(checks["banned"].values()):
                failed.append("restarts or bans")
            if failed:
                result["error"] = f"failed: {failed}"
                return result
            result["ok"] = True
            return result
        finally:
            for t in members.values():
                t.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["reset", "down"], default="reset")
    parser.add_argument("--deliver-s", type=float, default=20.0)
    parser.add_argument("--cut-s", type=float, default=8.0)
    parser.add_argument("--heal-s", type=float, default=60.0)
    args = parser.parse_args()
    return script_main(lambda: run(args.mode, args.deliver_s, args.cut_s, args.heal_s))


if __name__ == "__main__":
    sys.exit(main())
