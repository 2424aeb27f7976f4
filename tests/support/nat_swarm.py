"""A public swarm through real NAT, on one machine. ``tests/integration/test_nat.py`` runs

    unshare -rn python -m tests.support.nat_swarm

inside a user and network namespace of its own, which plays the internet ("wan",
198.18.0.0/16: these tests use 198.18.0.0/15, the range reserved for them, and nothing
else). It makes, and removes with itself:

    wan       pub1 198.18.0.1, pub2 198.18.0.2 (two public nodes, addresses on lo)
      |-- r1 (198.18.1.2) nftables masquerade, ports kept (a home router)
      |     home1: h1 198.19.1.2 (listening on 0.0.0.0, as by default)
      |            h3 198.19.1.3:4142, the router forwarding 198.18.1.2:4142 to it,
      |               started with --announce /ip4/198.18.1.2/tcp/4142
      |-- r2 (198.18.2.2) nftables masquerade fully-random (a symmetric NAT)
      |     home2: h2 198.19.2.2 (listening on 0.0.0.0)
      |-- r3 (198.18.3.2) nftables masquerade, ports kept (another home router)
            home3: h4 198.19.3.2 (listening on 0.0.0.0)

The home LANs are in 198.19.0.0/16, which every member is given as ``net.lan_ranges``
(LAN_RANGES), so that it counts as LAN there as 192.168/16 does at home: the members
judge their reachability, and what to hide and hold, as behind a real home router.

Each router drops what comes from the wan unasked, as home routers do: routers that
answered it with a reset (Linux's default) spoiled every punch, 0 of 2 runs.

Each member is a real network process (``Libp2pTransport``, the node's own) started in
its namespace, h4 last, alone. It checks, in order: every member's reachability; the
home nodes h1 and h2 exchange messages (through the public nodes: nothing else connects
them), then h1 and h4; h1 and h2 reach each other through a relay; h1 and h4 (both
behind NATs that keep ports) punch a hole (DCUtR) and end with a direct connection
only, while h2 (symmetric NAT) stays relayed to both; the public nodes' DHTs hold no
LAN address, and their routing tables only the public members; a peer on the wan dials
h3 through its forwarded port; with pub1 gone, h1 and h2 still exchange through pub2;
with pub2 gone too, h1 and h4 exchange over their direct connection alone. It prints
one JSON line (each check, timings, ``error``) and exits 0 if every check passed, 1 if
not, 3 if not in a fresh namespace.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from sapo_node.config import NetSection, PoolSection
from sapo_node.net.process import Libp2pTransport
from tests.support.mdns_pair import CLONE_NEWNET, _check, _libc, lo_up, wait_for
from tests.support.namespaces import script_main

REPO = Path(__file__).resolve().parents[2]
VALID = REPO / "protocol" / "vectors" / "valid"
# The home LANs behind the routers (198.19.i.0/24), counted as LAN by every member.
LAN_RANGES = ["198.19.0.0/16"]
RELAY_GRACE_S = 3.0  # a punched pair's relayed connection closes this long after (10 s)


class Member(Libp2pTransport):
    """The node's network process, closing a relayed connection RELAY_GRACE_S after a
    hole punch replaced it (net/reachability.py, ``SwarmDCUtR``): the check that it
    closes waits that long."""

    def _spawn(self) -> None:
        self.settings["relay_grace_s"] = RELAY_GRACE_S
        super()._spawn()


class Netns:
    """Fresh network namespaces beside this thread's own; :meth:`inside` moves this
    thread into one for a while (processes started meanwhile stay there)."""

    def __init__(self, names: list[str]) -> None:
        self.home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        self.fds: dict[str, int] = {}
        for name in names:
            _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
            self.fds[name] = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            _check(_libc.setns(self.home, CLONE_NEWNET), "setns")

    def path(self, name: str) -> str:
        return f"/proc/{os.getpid()}/fd/{self.fds[name]}"

    @contextlib.contextmanager
    def inside(self, name: str | None) -> Iterator[None]:
        if name is None:
            yield
            return
        _check(_libc.setns(self.fds[name], CLONE_NEWNET), "setns")
        try:
            yield
        finally:
            _check(_libc.setns(self.home, CLONE_NEWNET), "setns")

    def run(self, name: str | None, *command: str, stdin: str | None = None) -> None:
        with self.inside(name):
            proc = subprocess.run(
                command,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=30,
                pass_fds=tuple(self.fds.values()),
            )
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} in {name or 'wan'}: {proc.stderr.strip()}")

    def link(self, a: str | None, a_if: str, a_ip: str, b: str, b_if: str, b_ip: str) -> None:
        """A veth pair: ``a_if`` in ``a`` (None: this namespace), ``b_if`` in ``b``."""
        with self.inside(a):
            self.run(
                None,
                "ip",
                "link",
                "add",
                a_if,
                "type",
                "veth",
                "peer",
                "name",
                b_if,
                "netns",
                self.path(b),
            )
        self.run(a, "ip", "addr", "add", a_ip, "dev", a_if)
        self.run(a, "ip", "link", "set", a_if, "up")
        self.run(b, "ip", "addr", "add", b_ip, "dev", b_if)
        self.run(b, "ip", "link", "set", b_if, "up")


def nat(ports_kept: bool, forward: tuple[int, str] | None) -> str:
    """The router's nftables ruleset: masquerade out of ``wan0``; ``fully-random`` makes
    it a symmetric NAT; ``forward`` = (port, LAN ip) forwards that TCP port. New
    connections from the wan to the router itself are dropped, not reset."""
    masquerade = "masquerade" if ports_kept else "masquerade fully-random"
    pre = ""
    if forward is not None:
        port, ip = forward
        pre = f'iifname "wan0" tcp dport {port} dnat to {ip}:{port}'
    return f"""
table ip nat {{
  chain pre {{
    type nat hook prerouting priority -100;
    {pre}
  }}
  chain post {{
    type nat hook postrouting priority 100;
    oifname "wan0" {masquerade}
  }}
}}
table ip filter {{
  chain in {{
    type filter hook input priority 0;
    iifname "wan0" ct state new drop
  }}
}}
"""


def add_home(ns: Netns, i: int, rules: str) -> None:
    """Home network i behind router r{i}: the router's WAN end 198.18.{i}.2/24 on the wan
    (whose end is .1), its LAN 198.19.{i}.1/24, the home's host 198.19.{i}.2, forwarding
    on and the router's nftables ``rules``."""
    router, home = f"r{i}", f"home{i}"
    for name in (router, home):
        with ns.inside(name):
            lo_up()
    ns.link(None, f"r{i}w", f"198.18.{i}.1/24", router, "wan0", f"198.18.{i}.2/24")
    ns.link(router, "lan0", f"198.19.{i}.1/24", home, "eth0", f"198.19.{i}.2/24")
    ns.run(router, "ip", "route", "add", "default", "via", f"198.18.{i}.1")
    ns.run(home, "ip", "route", "add", "default", "via", f"198.19.{i}.1")
    ns.run(router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
    ns.run(router, "nft", "-f", "-", stdin=rules)


def build(ns: Netns) -> None:
    lo_up()
    for ip in ("198.18.0.1/32", "198.18.0.2/32"):
        ns.run(None, "ip", "addr", "add", ip, "dev", "lo")
    add_home(ns, 1, nat(True, (4142, "198.19.1.3")))
    add_home(ns, 2, nat(False, None))
    if "r3" in ns.fds:
        add_home(ns, 3, nat(True, None))
    ns.run("home1", "ip", "addr", "add", "198.19.1.3/24", "dev", "eth0")
    ns.run(None, "sysctl", "-qw", "net.ipv4.ip_forward=1")


def run(deliver_s: float) -> dict[str, object]:
    result: dict[str, object] = {"ok": False, "checks": {}}
    checks: dict[str, object] = result["checks"]  # type: ignore[assignment]
    ns = Netns(["r1", "home1", "r2", "home2", "r3", "home3"])
    build(ns)
    vectors = sorted(VALID.glob("*.msgpack"))
    members: dict[str, Libp2pTransport] = {}
    pool = PoolSection()

    def start(name: str, where: str | None, listen: str, boot: list[str], **net) -> None:
        section = NetSection(
            swarm="nat-test",
            listen=[listen],
            bootstrap=boot,
            redial_s=1.0,
            lan_ranges=LAN_RANGES,
            **net,
        )
        with ns.inside(where):
            members[name] = Member(section, pool, Path(tmp) / name)

    def addr(name: str) -> str:
        t = members[name]
        return f"{t.addrs[0]}/p2p/{t.peer_id}" if "/p2p/" not in t.addrs[0] else t.addrs[0]

    def stat(name: str, key: str) -> object:
        return members[name].child_stats.get(key)

    def link(a: str, b: str) -> list[int]:
        """a's connections to b: [direct, relayed]."""
        links = stat(a, "links") or {}
        return list(links.get(members[b].peer_id, [0, 0]))  # type: ignore[union-attr]

    def exchange(a: str, b: str, k: int) -> bool:
        """a and b each publish a message; True when each has the other's."""
        sent = {
            a: vectors[k % len(vectors)].read_bytes(),
            b: vectors[(k + 1) % len(vectors)].read_bytes(),
        }
        got: dict[str, set[tuple[bytes, str]]] = {a: set(), b: set()}
        members[a].publish(sent[a])
        members[b].publish(sent[b])

        def arrived() -> bool:
            for n in (a, b):
                got[n] |= {(m.data, m.author) for m in members[n].received()}
            return all((sent[x], members[x].peer_id) in got[y] for x, y in ((a, b), (b, a)))

        return wait_for(arrived, deliver_s)

    def one_way(a: str, b: str, k: int) -> bool:
        """a publishes a message, b not; True when b has it."""
        sent, got = vectors[k % len(vectors)].read_bytes(), set()
        members[a].publish(sent)

        def arrived() -> bool:
            got.update((m.data, m.author) for m in members[b].received())
            return (sent, members[a].peer_id) in got

        return wait_for(arrived, deliver_s)

    with tempfile.TemporaryDirectory(prefix="nat-swarm-") as tmp:
        try:
            t0 = time.monotonic()
            start("pub1", None, "/ip4/198.18.0.1/tcp/4001", [])
            start("pub2", None, "/ip4/198.18.0.2/tcp/4001", [addr("pub1")])
            boot = [addr("pub1"), addr("pub2")]
            # no UPnP router here (nat_upnp.py has one): not asking saves 2 s a start
            start("h1", "home1", "/ip4/0.0.0.0/tcp/4141", boot, mdns=False, upnp=False)
            h2_started = time.monotonic()
            start("h2", "home2", "/ip4/0.0.0.0/tcp/4141", boot, mdns=False, upnp=False)
            start(
                "h3",
                "home1",
                "/ip4/198.19.1.3/tcp/4142",
                boot,
                mdns=False,
                announce=["/ip4/198.18.1.2/tcp/4142"],
            )
            result["started_s"] = round(time.monotonic() - t0, 1)
            wait_for(lambda: all(stat(n, "reachability") for n in members), 10)
            checks["reachability"] = {n: stat(n, "reachability") for n in members}
            want = {
                "pub1": "public",
                "pub2": "public",
                "h1": "private",
                "h2": "private",
                "h3": "public",
            }
            if checks["reachability"] != want:
                result["error"] = f"reachability {checks['reachability']}, expected {want}"
                return result
            if not wait_for(lambda: all((stat(n, "mesh") or 0) >= 1 for n in ("h1", "h2")), 60):
                result["error"] = "home nodes found no mesh peer in 60 s"
                return result
            t = time.monotonic()
            checks["home_exchange"] = exchange("h1", "h2", 0)
            checks["home_exchange_s"] = round(time.monotonic() - t, 1)
            # a new home node (h2, behind the symmetric NAT): from its start to h1's group
            checks["first_group_s"] = round(time.monotonic() - h2_started, 1)
            # another (h4, behind a NAT that keeps ports), started alone: the same
            h4_started = time.monotonic()
            start("h4", "home3", "/ip4/0.0.0.0/tcp/4141", boot, mdns=False, upnp=False)
            wait_for(lambda: stat("h4", "reachability"), 10)
            checks["reachability"]["h4"] = stat("h4", "reachability")
            wait_for(lambda: (stat("h4", "mesh") or 0) >= 1, 60)
            checks["h4_exchange"] = exchange("h1", "h4", 6)
            checks["first_group_h4_s"] = round(time.monotonic() - h4_started, 1)
            # each home node reserves on a public one and announces its relayed address
            # in the DHT; the other dials it there: a connection of their own, relayed
            t = time.monotonic()
            checks["relayed_home_link"] = wait_for(
                lambda: all((stat(n, "connections_relayed") or 0) >= 1 for n in ("h1", "h2")), 45
            )
            checks["relayed_home_link_s"] = round(time.monotonic() - t, 1)
            checks["relays"] = {n: stat(n, "relays") for n in ("h1", "h2")}
            checks["connections"] = {
                n: (stat(n, "connections_direct"), stat(n, "connections_relayed"))
                for n in ("h1", "h2")
            }
            # DCUtR: h1 and h4 (NATs that keep ports) punch a hole and drop the relayed
            # connection; h2 (symmetric NAT) stays relayed to both
            t, times = time.monotonic(), {}

            def upgraded() -> bool:
                ends = [link("h1", "h4"), link("h4", "h1")]
                for name, ok in (
                    ("relayed_s", all(r >= 1 for _, r in ends)),
                    ("direct_s", all(d >= 1 for d, _ in ends)),
                    ("direct_only_s", all(e == [1, 0] for e in ends)),
                ):
                    if ok and name not in times:
                        times[name] = round(time.monotonic() - t, 1)
                symmetric = [link("h2", b) for b in ("h1", "h4")]
                return "direct_only_s" in times and all(r >= 1 for _, r in symmetric)

            checks["punched"] = wait_for(upgraded, 60)
            checks.update(times)
            checks["punched_since_h4_started_s"] = round(time.monotonic() - h4_started, 1)
            checks["hole_punch_s"] = {n: stat(n, "hole_punch_s") for n in ("h1", "h4")}
            checks["hole_punches"] = {
                n: [stat(n, "hole_punches"), stat(n, "hole_punches_failed")]
                for n in ("h1", "h2", "h4")
            }
            pairs = (("h1", "h4"), ("h4", "h1"), ("h2", "h1"), ("h2", "h4"))
            checks["links"] = {f"{a}-{b}": link(a, b) for a, b in pairs}
            # Discovery passes run every second; a few let any LAN address spread.
            wait_for(lambda: (stat("pub1", "routing_table") or 0) >= 2, 30)
            time.sleep(3)
            checks["routing_table"] = {n: stat(n, "routing_table") for n in ("pub1", "pub2")}
            checks["dht_lan_addrs"] = {n: stat(n, "dht_lan_addrs") for n in ("pub1", "pub2")}
            start(
                "dialer",
                None,
                "/ip4/198.18.0.1/tcp/4002",
                [f"/ip4/198.18.1.2/tcp/4142/p2p/{members['h3'].peer_id}"],
                dht=False,
                mdns=False,  # its only way to a peer is h3's forwarded port
            )
            checks["forwarded_port_dialled"] = wait_for(
                lambda: (stat("dialer", "connected") or 0) >= 1, 30
            )
            members.pop("dialer").close()
            members.pop("pub1").close()
            t = time.monotonic()
            checks["exchange_without_pub1"] = exchange("h1", "h2", 2)
            checks["exchange_without_pub1_s"] = round(time.monotonic() - t, 1)
            # h2 never got a direct connection (its punches fail through the symmetric NAT)
            checks["symmetric_links"] = {f"h2-{b}": link("h2", b) for b in ("h1", "h4")}
            checks["symmetric_stays_relayed"] = all(
                d == 0 for d, _ in checks["symmetric_links"].values()
            )
            # with both public nodes gone, only the punched connection joins h1 and h4
            members.pop("pub2").close()
            t = time.monotonic()
            # one way first: a peer that only listens must get it too
            checks["exchange_direct_only"] = one_way("h1", "h4", 4) and one_way("h4", "h1", 5)
            checks["exchange_direct_only_s"] = round(time.monotonic() - t, 1)
            checks["links_at_end"] = {f"h1-{b}": link("h1", b) for b in ("h4", "h2")}
            checks["hole_punches_at_end"] = {
                n: [stat(n, "hole_punches"), stat(n, "hole_punches_failed")]
                for n in ("h1", "h2", "h4")
            }
            failed = [
                name
                for name, ok in (
                    ("home_exchange", checks["home_exchange"]),
                    ("h4_exchange", checks["h4_exchange"]),
                    ("h4_private", checks["reachability"]["h4"] == "private"),
                    ("relayed_home_link", checks["relayed_home_link"]),
                    ("routing_table", checks["routing_table"] == {"pub1": 2, "pub2": 2}),
                    ("dht_lan_addrs", checks["dht_lan_addrs"] == {"pub1": 0, "pub2": 0}),
                    ("forwarded_port_dialled", checks["forwarded_port_dialled"]),
                    ("exchange_without_pub1", checks["exchange_without_pub1"]),
                    ("punched", checks["punched"]),
                    ("symmetric_stays_relayed", checks["symmetric_stays_relayed"]),
                    ("exchange_direct_only", checks["exchange_direct_only"]),
                )
                if not ok
            ]
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
    parser.add_argument("--deliver-s", type=float, default=30.0)
    args = parser.parse_args()
    return script_main(lambda: run(args.deliver_s))


if __name__ == "__main__":
    sys.exit(main())
