"""A home router with UPnP, on one machine. ``tests/integration/test_nat.py`` runs

    unshare -rn python -m tests.support.nat_upnp

inside a user and network namespace of its own ("wan"). It makes, and removes with
itself:

    wan       pub 198.18.0.1 (a public node, address on lo)
      |-- r1 (198.18.1.2) nftables masquerade, and a UPnP IGD (tests/support/igd.py)
      |     home1: up  198.19.1.2:4141, net.upnp on
      |            off 198.19.1.3:4142, net.upnp off
      |-- r2 (198.18.2.2) nftables masquerade, no UPnP
            home2: none 198.19.2.2:4141, net.upnp on

The IGD is a small Python one, run in r1's namespace: it answers the node's SSDP search
on the LAN, serves its description and SOAP actions to the node's miniupnpc, and maps a
port as a real nftables DNAT rule on r1 (tests/support/igd.py). Not miniupnpd: Debian's
(2.3.1) maps nothing for a router whose WAN address is reserved, 198.18/15 included, and
these tests may use only 198.18.0.0/15: 198.18/16 as the internet, 198.19/16 for the
homes' LANs behind the routers, which every member counts as LAN (``net.lan_ranges``,
nat_swarm.LAN_RANGES).

Each member is a real network process (``Libp2pTransport``, the node's own) started in
its namespace. It checks: ``up`` reads public, reason upnp, and announces r1's WAN
address with its port; the router holds the mapping; ``pub``, given only that address,
dials ``up`` directly (no relay) through the router; ``off`` and ``none`` read private
(reason nat; ``none`` asked, and nobody answered); when ``up`` stops, the mapping is gone
from the router; only ``up`` asked the IGD (its search reaches r1's lan0 by the home's
default route; then GetStatusInfo, GetExternalIPAddress, AddPortMapping and, on stop,
DeletePortMapping). The members start together, in threads (the start-up bound is
tests/unit/test_upnp.py's). It prints one JSON line and exits 0 if every check
passed, 1 if not, 3 if not in a fresh namespace.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from sapo_node.config import NetSection, PoolSection
from sapo_node.net import identity
from sapo_node.net.process import Libp2pTransport
from tests.support.mdns_pair import lo_up, wait_for
from tests.support.namespaces import REPO, script_main
from tests.support.nat_swarm import LAN_RANGES, Netns, add_home, nat

UPNP_WAN = "198.18.1"  # r1's WAN /24
MAPPED = 'iifname "wan0" tcp dport 4141 dnat to 198.19.1.2:4141'  # the rule the IGD adds
# what up's miniupnpc asks: discovery, then selectigd (status, address), map, unmap
IGD_ACTIONS = [
    "AddPortMapping",
    "DeletePortMapping",
    "GetExternalIPAddress",
    "GetStatusInfo",
    "M-SEARCH",
]
IGD_MAX_S = 150  # the IGD ends by itself after this long (the test's bound is 120 s)


def build(ns: Netns) -> None:
    lo_up()
    ns.run(None, "ip", "addr", "add", "198.18.0.1/32", "dev", "lo")
    for i in (1, 2):
        add_home(ns, i, nat(True, None))
    ns.run("home1", "ip", "addr", "add", "198.19.1.3/24", "dev", "eth0")
    ns.run(None, "sysctl", "-qw", "net.ipv4.ip_forward=1")


def igd_asked_by(log: str) -> dict[str, list[str]]:
    """What each LAN client asked the IGD (its log's ``ssdp``/``soap`` lines)."""
    asked: dict[str, set[str]] = {}
    for line in log.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "ssdp":
            asked.setdefault(rest.split(":")[0], set()).add("M-SEARCH")
        elif kind == "soap":
            client, action = rest.split()[:2]
            asked.setdefault(client, set()).add(action)
    return {client: sorted(actions) for client, actions in sorted(asked.items())}


def mapped_ports(ns: Netns) -> str:
    """The DNAT rules in r1's prerouting chain (where the IGD adds its mappings)."""
    with ns.inside("r1"):
        out = subprocess.run(
            ["nft", "list", "chain", "ip", "nat", "pre"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    return out.stdout


def run() -> dict[str, object]:
    result: dict[str, object] = {"ok": False, "checks": {}}
    checks: dict[str, object] = result["checks"]  # type: ignore[assignment]
    ns = Netns(["r1", "home1", "r2", "home2"])
    build(ns)
    members: dict[str, Libp2pTransport] = {}
    pool = PoolSection()
    daemon: subprocess.Popen | None = None

    start_s: dict[str, float] = {}
    failures: dict[str, str] = {}

    def start(name: str, where: str | None, listen: str, net: dict) -> None:
        section = NetSection(
            swarm="nat-upnp",
            listen=[listen],
            redial_s=1.0,
            mdns=False,
            lan_ranges=LAN_RANGES,
            **net,
        )
        t = time.monotonic()
        try:
            with ns.inside(where):  # this thread only
                members[name] = Libp2pTransport(section, pool, Path(tmp) / name)
        except Exception as exc:
            failures[name] = f"{type(exc).__name__}: {exc}"
        start_s[name] = round(time.monotonic() - t, 1)

    def start_all(specs: dict[str, tuple[str | None, str, dict]]) -> None:
        """Start the members at once (a start is mostly imports: on 2 cores, together
        they take about half as long as one after another)."""
        threads = [threading.Thread(target=start, args=(n, *spec)) for n, spec in specs.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        if failures:
            raise RuntimeError(f"members did not start: {failures}")

    def stat(name: str, key: str) -> object:
        return members[name].child_stats.get(key)

    with tempfile.TemporaryDirectory(prefix="nat-upnp-") as tmp:
        log = Path(tmp) / "igd.log"
        try:
            with ns.inside("r1"), log.open("wb") as out:
                daemon = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tests.support.igd",
                        "--lan-ip",
                        "198.19.1.1",
                        "--wan-ip",
                        f"{UPNP_WAN}.2",
                        "--max-s",
                        str(IGD_MAX_S),
                        "--die-with-parent",
                    ],
                    cwd=REPO,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            if not wait_for(lambda: b"ready " in log.read_bytes(), 15):
                result["error"] = f"the IGD did not start: {log.read_text()[-1500:]}"
                return result
            t0 = time.monotonic()
            # a peer on the wan that knows only the address the router is to map
            up_id = identity.peer_id(identity.load_or_create(Path(tmp) / "up"))
            announced = f"/ip4/{UPNP_WAN}.2/tcp/4141/p2p/{up_id}"
            start_all(
                {
                    "up": ("home1", "/ip4/0.0.0.0/tcp/4141", {}),
                    "off": ("home1", "/ip4/198.19.1.3/tcp/4142", {"upnp": False}),
                    "none": ("home2", "/ip4/0.0.0.0/tcp/4141", {}),
                    "pub": (
                        None,
                        "/ip4/198.18.0.1/tcp/4001",
                        {"bootstrap": [announced], "dht": False},
                    ),
                }
            )
            checks["start_s"] = start_s
            wait_for(lambda: all(stat(n, "reachability") for n in members), 10)
            checks["reachability"] = {
                n: [stat(n, "reachability"), stat(n, "reachability_reason")]
                for n in ("up", "off", "none")
            }
            checks["announced"] = [a.split("/p2p/")[0] for a in members["up"].addrs]
            checks["router_maps_4141"] = MAPPED in mapped_ports(ns)
            checks["pub_dialled_up"] = wait_for(lambda: (stat("pub", "connected") or 0) >= 1, 20)
            checks["pub_connections"] = [
                stat("pub", "connections_direct"),
                stat("pub", "connections_relayed"),
            ]
            members.pop("up").close()
            checks["mapping_deleted"] = wait_for(lambda: "dport 4141" not in mapped_ports(ns), 5)
            checks["seconds"] = round(time.monotonic() - t0, 1)
            checks["igd_asked_by"] = igd_asked_by(log.read_text(errors="replace"))
            want = {
                "reachability": {
                    "up": ["public", "upnp"],
                    "off": ["private", "nat"],
                    "none": ["private", "nat"],
                },
                "announced": [f"/ip4/{UPNP_WAN}.2/tcp/4141"],
                "router_maps_4141": True,
                "pub_dialled_up": True,
                "pub_connections": [1, 0],
                "mapping_deleted": True,
                "igd_asked_by": {"198.19.1.2": IGD_ACTIONS},  # not by `off` (198.19.1.3)
            }
            failed = [k for k, v in want.items() if checks[k] != v]
            if failed:
                result["error"] = f"failed: {failed}"
                result["igd_log"] = log.read_text(errors="replace")[-1500:]
                return result
            result["ok"] = True
            return result
        finally:
            for t in members.values():
                t.close()
            if daemon is not None:
                daemon.terminate()
                try:
                    daemon.wait(5)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait(5)


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    sys.exit(main())
