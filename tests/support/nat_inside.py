"""Two homes behind NAT whose inside addresses are outside the LAN ranges, and one
public node, on one machine, with the node's default AutoNAT timings (``--alone-s S``:
private S seconds after the failed dial-back instead of autonat.ALONE_S).
``tests/integration/test_nat.py`` runs

    unshare -rn python -m tests.support.nat_inside

inside a user and network namespace of its own, which plays the internet ("wan",
198.18.0.0/15, the range reserved for such tests). It makes, and removes with itself:

    wan       pub 198.18.0.1 (the swarm's one public node, its address on lo)
      |-- r1 (198.18.1.2) nftables masquerade, ports kept, new connections from the wan
      |     dropped (a home router); home1: h1 198.19.1.2
      |-- r2 (198.18.2.2) the same; home2: h2 198.19.2.2

Unlike tests/support/nat_swarm.py, the members are not given 198.19.0.0/16 as
``net.lan_ranges``: h1 and h2 see an inside address outside the LAN ranges and read
public at start (reason ``address``), as a home numbered out of other space does. pub
sees each one's connection come from its router's address, which none of the addresses
it asks to be dialled at is on; pub dials that address at the port it listens on, the
router drops it, and that one failure with nobody dialling in for autonat.ALONE_S makes
each private (net/autonat.py). It checks, in order: each turns private (reason
``autonat``) on pub's failed dial-back alone; each reserves a slot on pub's relay; h1
and h2 exchange messages (through pub) and connect to each other, through pub's relay
or a hole punch. It prints one JSON line (each check, timings, ``error``) and exits 0
if every check passed, 1 if not, 3 if not in a fresh namespace.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sapo_node.config import NetSection, PoolSection
from sapo_node.net import autonat
from sapo_node.net.process import Libp2pTransport
from tests.support.mdns_pair import first_readings, lo_up, wait_for
from tests.support.namespaces import conclude, script_main
from tests.support.nat_swarm import VALID, Netns, add_home, nat

HOMES = ("h1", "h2")
# counts, at each router, packets that leave the home for an inside address (of either home)
COUNT = """
table ip tally {
  chain leaving {
    type filter hook forward priority 0;
    oifname "wan0" ip daddr 198.19.0.0/16 counter
  }
}
"""


def to_inside(ns: Netns) -> int:
    """Packets that left either home for the wan, addressed to an inside address."""
    total = 0
    for router in ("r1", "r2"):
        with ns.inside(router):
            out = subprocess.run(
                ["nft", "list", "table", "ip", "tally"], capture_output=True, text=True, timeout=30
            ).stdout
        total += sum(int(n) for n in re.findall(r"packets (\d+)", out))
    return total


class ShortWait(Libp2pTransport):
    """A network process whose AutoNAT concludes private after ``alone_s`` seconds with
    one failed answer and nobody dialling in, rather than autonat.ALONE_S."""

    alone_s = autonat.ALONE_S

    def _spawn(self) -> None:
        self.settings["autonat_alone_s"] = self.alone_s
        super()._spawn()


def run(within: float, alone_s: float | None = None) -> dict[str, object]:
    result: dict[str, object] = {"ok": False, "checks": {}}
    checks: dict[str, object] = result["checks"]  # type: ignore[assignment]
    ns = Netns(["r1", "home1", "r2", "home2"])
    lo_up()
    ns.run(None, "ip", "addr", "add", "198.18.0.1/32", "dev", "lo")
    for i in (1, 2):
        add_home(ns, i, nat(True, None))
        ns.run(f"r{i}", "nft", "-f", "-", stdin=COUNT)
    ns.run(None, "sysctl", "-qw", "net.ipv4.ip_forward=1")
    members: dict[str, Libp2pTransport] = {}

    def start(name: str, where: str | None, listen: str, boot: list[str]) -> None:
        section = NetSection(
            swarm="inside-test",
            listen=[listen],
            bootstrap=boot,
            redial_s=1.0,
            mdns=False,
            upnp=False,
        )
        kind = Libp2pTransport
        if alone_s is not None:
            kind = type("Waiting", (ShortWait,), {"alone_s": alone_s})
        with ns.inside(where):
            members[name] = kind(section, PoolSection(), Path(tmp) / name)

    def stat(name: str, key: str) -> object:
        return members[name].child_stats.get(key)

    def reads(name: str) -> list[object]:
        return [stat(name, "reachability"), stat(name, "reachability_reason")]

    with tempfile.TemporaryDirectory(prefix="nat-inside-") as tmp:
        try:
            start("pub", None, "/ip4/198.18.0.1/tcp/4001", [])
            boot = [f"/ip4/198.18.0.1/tcp/4001/p2p/{members['pub'].peer_id}"]
            t0 = time.monotonic()
            start("h1", "home1", "/ip4/0.0.0.0/tcp/4141", boot)
            start("h2", "home2", "/ip4/0.0.0.0/tcp/4141", boot)
            first = first_readings(members, lambda n: stat(n, "reachability"), reads, 10)
            checks["at_start"] = {n: first.get(n) for n in HOMES}
            # pub's failed dial-back, then ALONE_S with nobody dialling in
            private = wait_for(
                lambda: all(reads(n) == ["private", "autonat"] for n in HOMES), within
            )
            checks["private_s"] = round(time.monotonic() - t0, 1)
            checks["reachability"] = {n: reads(n) for n in HOMES}
            checks["answers"] = {n: stat(n, "autonat_answers") for n in HOMES}
            checks["pub_served"] = stat("pub", "autonat_served")
            checks["to_inside_addrs"] = {"until_private": to_inside(ns)}
            if not private:
                result["error"] = f"not private in {within:.0f} s: {checks}"
                return result
            checks["relay_reserved"] = wait_for(
                lambda: all((stat(n, "relays") or 0) >= 1 for n in HOMES), 30
            )
            vectors = sorted(VALID.glob("*.msgpack"))
            sent = {n: vectors[i].read_bytes() for i, n in enumerate(HOMES)}
            got: dict[str, set] = {n: set() for n in HOMES}
            for n in HOMES:
                members[n].publish(sent[n])

            def arrived() -> bool:
                for n in HOMES:
                    got[n] |= {(m.data, m.author) for m in members[n].received()}
                return all((sent[a], members[a].peer_id) in got[b] for a, b in (HOMES, HOMES[::-1]))

            checks["exchange"] = wait_for(arrived, 30)

            def link() -> list[int]:  # h1's connections to h2: [direct, relayed]
                links = stat("h1", "links") or {}
                return list(links.get(members["h2"].peer_id, [0, 0]))  # type: ignore[union-attr]

            checks["met"] = wait_for(lambda: sum(link()) > 0, 60)
            checks["met_s"] = round(time.monotonic() - t0, 1)
            checks["h1_h2_link"] = link()
            checks["hole_punches"] = {n: stat(n, "hole_punches") for n in HOMES}
            checks["to_inside_addrs"]["until_met"] = to_inside(ns)
            return conclude(
                result,
                {
                    "at_start": all(
                        r == ["public", "address"] for r in checks["at_start"].values()
                    ),
                    "failed_by_pub": all(
                        a == {"198.18.0.1": autonat.FAILED} for a in checks["answers"].values()
                    ),
                    "relay_reserved": checks["relay_reserved"],
                    "exchange": checks["exchange"],
                    "met": checks["met"],
                },
            )
        finally:
            for t in members.values():
                t.close()


def main(argv: list[str] | None = None) -> int:
    """``--alone-s S``: conclude private S seconds after the failed dial-back (the test
    suite's short run); without it, the node's default timings."""
    args = sys.argv[1:] if argv is None else argv
    alone_s = float(args[args.index("--alone-s") + 1]) if "--alone-s" in args else None
    wait = autonat.ALONE_S if alone_s is None else alone_s
    # pub's dial-back times out (CONNECT_S), then the wait with nobody dialling in
    return script_main(lambda: run(autonat.CONNECT_S + wait + 60.0, alone_s))


if __name__ == "__main__":
    sys.exit(main())
