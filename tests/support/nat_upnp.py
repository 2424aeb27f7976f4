"""A home router with UPnP, on one machine. ``tests/integration/test_nat.py`` runs

    unshare -rn python -m tests.support.nat_upnp

inside a user and network namespace of its own ("wan"). It makes, and removes with
itself:

    wan       pub 198.18.0.1 (a public node, address on lo)
      |-- r1 (11.18.1.2) nftables masquerade, and miniupnpd (a real UPnP IGD)
      |     home1: up  10.1.0.2:4141, net.upnp on
      |            off 10.1.0.3:4142, net.upnp off
      |-- r2 (198.18.2.2) nftables masquerade, no UPnP
            home2: none 10.2.0.2:4141, net.upnp on

r1's WAN address is the one outside 198.18.0.0/15: miniupnpd 2.3.1 (Debian 12) maps
nothing for a router whose WAN address is reserved, 198.18/15 included ("private/reserved
address ... is not suitable for external IP"; its ext_ip= option refuses such an address
too, and it has no option to allow one). The namespaces have no way out, so no packet
can reach the real 11.18.1.0/24.

Each member is a real network process (``Libp2pTransport``, the node's own) started in
its namespace. It checks: ``up`` reads public, reason upnp, and announces r1's WAN
address with its port; the router holds the mapping; ``pub``, given only that address,
dials ``up`` directly (no relay) through the router; ``off`` and ``none`` read private
(reason nat; ``none`` asked, and nobody answered); when ``up`` stops, the mapping is gone
from the router. The members start together, in threads (the start-up bound is
tests/unit/test_upnp.py's). It prints one JSON line and exits 0 if every check
passed, 1 if not, 3 if not in a fresh namespace.
"""

from __future__ import annotations

import ctypes
import signal
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
from tests.support.namespaces import script_main
from tests.support.nat_swarm import Netns, nat

UPNP_WAN = "11.18.1"  # r1's WAN /24 (see above)
MINIUPNPD = "/usr/sbin/miniupnpd"

# The chains miniupnpd adds its rules to (Debian's nft_init.sh makes the same, with a
# forward policy of drop: here accept, as the router's only job is the NAT).
UPNP_TABLES = """
table inet miniupnpd {
  chain forward { type filter hook forward priority 0; policy accept; jump miniupnpd; }
  chain miniupnpd { }
  chain prerouting {
    type nat hook prerouting priority -100; policy accept; jump prerouting_miniupnpd;
  }
  chain postrouting {
    type nat hook postrouting priority 100; policy accept; jump postrouting_miniupnpd;
  }
  chain prerouting_miniupnpd { }
  chain postrouting_miniupnpd { }
}
"""


def miniupnpd_conf(tmp: Path) -> str:
    return f"""
ext_ifname=wan0
listening_ip=lan0
http_port=0
enable_upnp=yes
enable_natpmp=no
secure_mode=yes
system_uptime=no
lease_file={tmp}/upnp.leases
uuid=5a905a90-0000-4000-8000-000000000030
upnp_table_name=miniupnpd
upnp_nat_table_name=miniupnpd
upnp_forward_chain=miniupnpd
upnp_nat_chain=prerouting_miniupnpd
upnp_nat_postrouting_chain=postrouting_miniupnpd
allow 1024-65535 10.1.0.0/24 1024-65535
deny 0-65535 0.0.0.0/0 0-65535
"""


def build(ns: Netns) -> None:
    lo_up()
    ns.run(None, "ip", "addr", "add", "198.18.0.1/32", "dev", "lo")
    for i, wan in ((1, UPNP_WAN), (2, "198.18.2")):
        router, home = f"r{i}", f"home{i}"
        for name in (router, home):
            with ns.inside(name):
                lo_up()
        ns.link(None, f"r{i}w", f"{wan}.1/24", router, "wan0", f"{wan}.2/24")
        ns.link(router, "lan0", f"10.{i}.0.1/24", home, "eth0", f"10.{i}.0.2/24")
        ns.run(router, "ip", "route", "add", "default", "via", f"{wan}.1")
        ns.run(home, "ip", "route", "add", "default", "via", f"10.{i}.0.1")
        ns.run(router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        ns.run(router, "nft", "-f", "-", stdin=nat(True, None))
    ns.run("r1", "nft", "-f", "-", stdin=UPNP_TABLES)
    ns.run("home1", "ip", "addr", "add", "10.1.0.3/24", "dev", "eth0")
    ns.run(None, "sysctl", "-qw", "net.ipv4.ip_forward=1")


def _die_with_parent() -> None:
    """In the child before exec: killed when this script ends, however it ends."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def mapped_ports(ns: Netns) -> str:
    with ns.inside("r1"):
        out = subprocess.run(
            ["nft", "list", "chain", "inet", "miniupnpd", "prerouting_miniupnpd"],
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
        section = NetSection(swarm="nat-upnp", listen=[listen], redial_s=1.0, mdns=False, **net)
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
        conf, log = Path(tmp) / "miniupnpd.conf", Path(tmp) / "miniupnpd.log"
        conf.write_text(miniupnpd_conf(Path(tmp)))
        try:
            with ns.inside("r1"), log.open("wb") as out:
                daemon = subprocess.Popen(
                    [MINIUPNPD, "-d", "-f", str(conf), "-P", f"{tmp}/miniupnpd.pid"],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent,
                )
            if not wait_for(lambda: b"HTTP listening" in log.read_bytes(), 10):
                result["error"] = f"miniupnpd did not start: {log.read_text()[-1500:]}"
                return result
            t0 = time.monotonic()
            # a peer on the wan that knows only the address the router is to map
            up_id = identity.peer_id(identity.load_or_create(Path(tmp) / "up"))
            announced = f"/ip4/{UPNP_WAN}.2/tcp/4141/p2p/{up_id}"
            start_all(
                {
                    "up": ("home1", "/ip4/0.0.0.0/tcp/4141", {}),
                    "off": ("home1", "/ip4/10.1.0.3/tcp/4142", {"upnp": False}),
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
            checks["router_maps_4141"] = "dport 4141" in mapped_ports(ns)
            checks["pub_dialled_up"] = wait_for(lambda: (stat("pub", "connected") or 0) >= 1, 20)
            checks["pub_connections"] = [
                stat("pub", "connections_direct"),
                stat("pub", "connections_relayed"),
            ]
            members.pop("up").close()
            checks["mapping_deleted"] = wait_for(lambda: "dport 4141" not in mapped_ports(ns), 5)
            checks["seconds"] = round(time.monotonic() - t0, 1)
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
            }
            failed = [k for k, v in want.items() if checks[k] != v]
            if failed:
                result["error"] = f"failed: {failed}"
                result["miniupnpd_log"] = log.read_text(errors="replace")[-1500:]
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
