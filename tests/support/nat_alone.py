"""A swarm with a single public node and two nodes whose addresses look dialable but are
not, on one machine. ``tests/integration/test_nat.py`` runs

    unshare -rn python -m tests.support.nat_alone

inside a user and network namespace of its own, which plays the internet ("wan",
198.18.0.0/15, the range reserved for such tests). It makes, and removes with itself:

    wan       pub 198.18.0.1 (the swarm's one public node, its address on lo)
      |-- vps1: fw1 198.18.4.2, an address outside the LAN ranges, and nftables dropping
      |         new connections from outside to its port (a security group, a home
      |         router's IPv6 firewall)
      |-- vps2: fw2 198.18.5.2, the same

Both firewalled nodes read public at start (reason ``address``); each has one AutoNAT
server to ask, pub, whose dial-back fails, and nobody dials in (net/autonat.py, ALONE_S:
here a few seconds, ``autonat_alone_s``). It checks, in order: each turns private
(reason ``autonat``) on pub's answer alone; each reserves a slot on pub's relay; pub's
DHT routing table drops both (they no longer serve the DHT); fw1 and fw2, which cannot
dial each other, exchange messages (through pub) and connect to each other through
pub's relay, found at the relayed addresses they announce instead; then fw1's
firewall is lifted and its next check (``autonat_recheck_private_s``) finds it public
again (reason ``address``), back in pub's routing table. It prints one JSON line (each
check, timings, ``error``) and exits 0 if every check passed, 1 if not, 3 if not in a
fresh namespace.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from sapo_node.config import NetSection, PoolSection
from sapo_node.net.process import Libp2pTransport
from tests.support.mdns_pair import first_readings, lo_up, wait_for
from tests.support.namespaces import conclude, script_main
from tests.support.nat_autonat import FIREWALL
from tests.support.nat_swarm import VALID, Netns

ALONE_S = 3.0  # the firewalled nodes' wait for a peer dialling in (120 s by default)
RECHECK_S = 5.0  # their checks while private (600 s by default)
CONNECT_S = 2.0  # pub's dial-back connect, dropped by a firewall (5 s by default); a
# connect that is answered takes well under a millisecond between these namespaces


class Quick(Libp2pTransport):
    """A network process whose AutoNAT waits, checks again and asks a server that gave
    no answer again in seconds, and whose server (pub) takes a peer's request every
    second instead of every minute (and still 30 a minute in all) and gives up a
    dial-back's connect sooner."""

    def _spawn(self) -> None:
        self.settings["autonat_connect_s"] = CONNECT_S
        self.settings["autonat_alone_s"] = ALONE_S
        self.settings["autonat_recheck_private_s"] = RECHECK_S
        self.settings["autonat_peer_every_s"] = 1.0
        self.settings["autonat_retry_s"] = 2.0
        super()._spawn()


def build(ns: Netns) -> None:
    lo_up()
    ns.run(None, "ip", "addr", "add", "198.18.0.1/32", "dev", "lo")
    for i, name in ((4, "vps1"), (5, "vps2")):
        with ns.inside(name):
            lo_up()
        ns.link(None, f"v{i}w", f"198.18.{i}.1/24", name, "wan0", f"198.18.{i}.2/24")
        ns.run(name, "ip", "route", "add", "default", "via", f"198.18.{i}.1")
        ns.run(name, "nft", "-f", "-", stdin=FIREWALL)
    ns.run(None, "sysctl", "-qw", "net.ipv4.ip_forward=1")


def run(within: float) -> dict[str, object]:
    result: dict[str, object] = {"ok": False, "checks": {}}
    checks: dict[str, object] = result["checks"]  # type: ignore[assignment]
    ns = Netns(["vps1", "vps2"])
    build(ns)
    members: dict[str, Libp2pTransport] = {}
    vectors = sorted(VALID.glob("*.msgpack"))
    firewalled = ("fw1", "fw2")

    def start(name: str, where: str | None, listen: str, boot: list[str]) -> None:
        section = NetSection(
            swarm="alone-test",
            listen=[listen],
            bootstrap=boot,
            redial_s=1.0,
            mdns=False,
            upnp=False,
        )
        with ns.inside(where):
            members[name] = Quick(section, PoolSection(), Path(tmp) / name)

    def addr(name: str) -> str:
        t = members[name]
        return f"{t.addrs[0]}/p2p/{t.peer_id}" if "/p2p/" not in t.addrs[0] else t.addrs[0]

    def stat(name: str, key: str) -> object:
        return members[name].child_stats.get(key)

    def reads(name: str) -> list[object]:
        return [stat(name, "reachability"), stat(name, "reachability_reason")]

    with tempfile.TemporaryDirectory(prefix="nat-alone-") as tmp:
        try:
            start("pub", None, "/ip4/198.18.0.1/tcp/4001", [])
            t0 = time.monotonic()
            start("fw1", "vps1", "/ip4/198.18.4.2/tcp/4141", [addr("pub")])
            start("fw2", "vps2", "/ip4/198.18.5.2/tcp/4141", [addr("pub")])
            first = first_readings(members, lambda n: stat(n, "reachability"), reads, 10)
            checks["at_start"] = {n: first.get(n) for n in firewalled}
            private = wait_for(
                lambda: all(reads(n) == ["private", "autonat"] for n in firewalled), within
            )
            checks["private_s"] = round(time.monotonic() - t0, 1)
            checks["reachability"] = {n: reads(n) for n in firewalled}
            checks["answers"] = {n: stat(n, "autonat_answers") for n in firewalled}
            if not private:
                result["error"] = f"not private in {within:.0f} s: {checks}"
                return result
            checks["relay_reserved"] = wait_for(
                lambda: all((stat(n, "relays") or 0) >= 1 for n in firewalled), within
            )
            checks["routing_table_dropped"] = wait_for(
                lambda: stat("pub", "routing_table") == 0, within
            )
            sent = {n: vectors[i].read_bytes() for i, n in enumerate(firewalled)}
            got: dict[str, set] = {n: set() for n in firewalled}
            for n in firewalled:
                members[n].publish(sent[n])

            def arrived() -> bool:
                for n in firewalled:
                    got[n] |= {(m.data, m.author) for m in members[n].received()}
                return all(
                    (sent[a], members[a].peer_id) in got[b]
                    for a, b in (("fw1", "fw2"), ("fw2", "fw1"))
                )

            checks["exchange"] = wait_for(arrived, within)
            checks["exchange_s"] = round(time.monotonic() - t0, 1)

            def link() -> list[int]:  # fw1's connections to fw2: [direct, relayed]
                links = stat("fw1", "links") or {}
                return list(links.get(members["fw2"].peer_id, [0, 0]))  # type: ignore[union-attr]

            # each finds the other's relayed addresses in pub's DHT (what it announces
            # instead of its own) and connects through the relay, then perhaps directly,
            # if a hole punch gets through both firewalls
            checks["met"] = wait_for(lambda: sum(link()) > 0, within)
            checks["met_s"] = round(time.monotonic() - t0, 1)
            checks["fw1_fw2_link"] = link()
            checks["hole_punches"] = {n: stat(n, "hole_punches") for n in firewalled}

            # the firewall lifted: fw1's next check finds pub dialling it back
            ns.run("vps1", "nft", "flush", "ruleset")
            t1 = time.monotonic()
            checks["public_again"] = wait_for(lambda: reads("fw1") == ["public", "address"], within)
            checks["public_again_s"] = round(time.monotonic() - t1, 1)
            checks["back_in_routing_table"] = wait_for(
                lambda: stat("pub", "routing_table") == 1, within
            )
            checks["fw2_still_private"] = reads("fw2") == ["private", "autonat"]
            return conclude(
                result,
                {
                    "at_start": all(
                        r == ["public", "address"] for r in checks["at_start"].values()
                    ),
                    "only_pub_answered": all(
                        set(a) <= {"198.18.0.1"} for a in checks["answers"].values()
                    ),
                    "relay_reserved": checks["relay_reserved"],
                    "routing_table_dropped": checks["routing_table_dropped"],
                    "exchange": checks["exchange"],
                    "met": checks["met"],
                    "public_again": checks["public_again"],
                    "back_in_routing_table": checks["back_in_routing_table"],
                    "fw2_still_private": checks["fw2_still_private"],
                },
            )
        finally:
            for t in members.values():
                t.close()


def main() -> int:
    return script_main(lambda: run(45.0))


if __name__ == "__main__":
    sys.exit(main())
