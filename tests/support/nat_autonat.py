"""AutoNAT through a real firewall, on one machine. ``tests/integration/test_nat.py`` runs

    unshare -rn python -m tests.support.nat_autonat

inside a user and network namespace of its own, which plays the internet ("wan",
198.18.0.0/15, the range reserved for such tests). It makes, and removes with itself:

    wan       pub1 198.18.0.1, pub2 198.18.2.1 (two public nodes in two /24s, on lo)
      |-- vps1: fw 198.18.4.2, an address outside the LAN ranges, and nftables dropping
      |         new connections from outside to its port (a firewall, a security group)
      |-- vps2: open 198.18.5.2, the same without the firewall

Both VPS nodes read public at start (reason ``address``) and ask the others to dial
them back (net/autonat.py). It checks, in order: fw turns private (reason ``autonat``)
and open is confirmed public; fw reserves a slot on a relay and announces its address
through it; the public nodes' DHT routing tables drop fw (it told them by identify push
that it no longer serves the DHT) and keep open; fw and open still exchange messages.
It prints one JSON line (each check, timings, ``error``) and exits 0 if every check
passed, 1 if not, 3 if not in a fresh namespace.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from sapo_node.config import NetSection, PoolSection
from sapo_node.net.process import Libp2pTransport
from tests.support.mdns_pair import lo_up, wait_for
from tests.support.namespaces import conclude, script_main
from tests.support.nat_swarm import VALID, Netns

CONNECT_S = 2.0  # a server's dial-back connect, dropped by fw's firewall (5 s by default);
# one that is answered (open's) takes well under a millisecond between these namespaces


class QuickDialBack(Libp2pTransport):
    """A network process whose AutoNAT server gives up a dial-back's connect sooner."""

    def _spawn(self) -> None:
        self.settings["autonat_connect_s"] = CONNECT_S
        super()._spawn()


FIREWALL = """
table ip filter {
  chain in {
    type filter hook input priority 0;
    iifname "wan0" tcp dport 4141 ct state new drop
  }
}
"""


def build(ns: Netns) -> None:
    lo_up()
    for ip in ("198.18.0.1/32", "198.18.2.1/32"):
        ns.run(None, "ip", "addr", "add", ip, "dev", "lo")
    for i, name in ((4, "vps1"), (5, "vps2")):
        with ns.inside(name):
            lo_up()
        ns.link(None, f"v{i}w", f"198.18.{i}.1/24", name, "wan0", f"198.18.{i}.2/24")
        ns.run(name, "ip", "route", "add", "default", "via", f"198.18.{i}.1")
    ns.run("vps1", "nft", "-f", "-", stdin=FIREWALL)
    ns.run(None, "sysctl", "-qw", "net.ipv4.ip_forward=1")


def run(within: float) -> dict[str, object]:
    result: dict[str, object] = {"ok": False, "checks": {}}
    checks: dict[str, object] = result["checks"]  # type: ignore[assignment]
    ns = Netns(["vps1", "vps2"])
    build(ns)
    members: dict[str, Libp2pTransport] = {}
    vectors = sorted(VALID.glob("*.msgpack"))

    def start(name: str, where: str | None, listen: str, boot: list[str]) -> None:
        section = NetSection(
            swarm="autonat-test",
            listen=[listen],
            bootstrap=boot,
            redial_s=1.0,
            mdns=False,
            upnp=False,
        )
        with ns.inside(where):
            members[name] = QuickDialBack(section, PoolSection(), Path(tmp) / name)

    def addr(name: str) -> str:
        t = members[name]
        return f"{t.addrs[0]}/p2p/{t.peer_id}" if "/p2p/" not in t.addrs[0] else t.addrs[0]

    def stat(name: str, key: str) -> object:
        return members[name].child_stats.get(key)

    with tempfile.TemporaryDirectory(prefix="nat-autonat-") as tmp:
        try:
            start("pub1", None, "/ip4/198.18.0.1/tcp/4001", [])
            start("pub2", None, "/ip4/198.18.2.1/tcp/4001", [addr("pub1")])
            boot = [addr("pub1"), addr("pub2")]
            t0 = time.monotonic()
            start("fw", "vps1", "/ip4/198.18.4.2/tcp/4141", boot)
            start("open", "vps2", "/ip4/198.18.5.2/tcp/4141", boot)
            wait_for(lambda: all(stat(n, "reachability") for n in members), 10)
            checks["at_start"] = {n: stat(n, "reachability_reason") for n in ("fw", "open")}
            decided = wait_for(
                lambda: stat("fw", "autonat") is not None and stat("open", "autonat") is not None,
                within,
            )
            checks["decided_s"] = round(time.monotonic() - t0, 1)
            checks["verdict"] = {n: stat(n, "autonat") for n in ("fw", "open")}
            checks["reachability"] = {
                n: [stat(n, "reachability"), stat(n, "reachability_reason")] for n in ("fw", "open")
            }
            checks["answers"] = {n: stat(n, "autonat_answers") for n in ("fw", "open")}
            if not decided:
                result["error"] = f"no AutoNAT verdict in {within:.0f} s: {checks}"
                return result
            checks["relay_reserved"] = wait_for(lambda: (stat("fw", "relays") or 0) >= 1, within)
            # pub1, pub2 and open serve the DHT: each public node's table holds the other two
            checks["routing_table_dropped_fw"] = wait_for(
                lambda: all(stat(n, "routing_table") == 2 for n in ("pub1", "pub2")), within
            )
            checks["routing_table"] = {n: stat(n, "routing_table") for n in ("pub1", "pub2")}
            checks["served"] = {n: stat(n, "autonat_served") for n in ("pub1", "pub2", "open")}
            sent = {"fw": vectors[0].read_bytes(), "open": vectors[1].read_bytes()}
            got: dict[str, set] = {"fw": set(), "open": set()}
            members["fw"].publish(sent["fw"])
            members["open"].publish(sent["open"])

            def arrived() -> bool:
                for n in got:
                    got[n] |= {(m.data, m.author) for m in members[n].received()}
                return (sent["fw"], members["fw"].peer_id) in got["open"] and (
                    sent["open"],
                    members["open"].peer_id,
                ) in got["fw"]

            checks["exchange"] = wait_for(arrived, within)
            return conclude(
                result,
                {
                    # read at its first report: fw may have heard both networks by then
                    "at_start": checks["at_start"]["open"] == "address"
                    and checks["at_start"]["fw"] in ("address", "autonat"),
                    "verdict": checks["verdict"] == {"fw": "private", "open": "public"},
                    "reachability": checks["reachability"]
                    == {"fw": ["private", "autonat"], "open": ["public", "address"]},
                    "relay_reserved": checks["relay_reserved"],
                    "routing_table_dropped_fw": checks["routing_table_dropped_fw"],
                    "exchange": checks["exchange"],
                },
            )
        finally:
            for t in members.values():
                t.close()


def main() -> int:
    return script_main(lambda: run(45.0))


if __name__ == "__main__":
    sys.exit(main())
