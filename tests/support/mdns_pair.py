"""Two libp2p transports with no bootstrap address find each other by mDNS and exchange a
message each way. ``tests/integration/test_mdns.py`` runs it as

    unshare -rn python -m tests.support.mdns_pair --mode lo|veth|ipfs

that is, inside a user and network namespace of its own, so that mDNS multicasts on that
namespace's interfaces only, never on the machine's. It refuses to run (exit 3) where any
interface but ``lo`` exists when it starts: then it is not in a fresh namespace.

- ``lo``: both nodes in this namespace, listening on 127.0.0.1, mDNS over ``lo``.
- ``veth``: two namespaces joined by a veth pair (198.19.77.1/24 here, 198.19.77.2/24 in
  a second namespace made here, where the second node's network process runs), both nodes
  listening on 0.0.0.0 as the default config does: two machines on one LAN (each counts
  198.19/16 as LAN, ``net.lan_ranges``, as the NAT tests' homes do). Only the
  addresses of the interfaces are dialable from the other side, so it checks what mDNS
  announces.
- ``ipfs``: as ``lo``, with a peer of IPFS's names beside them
  (``tests/support/ipfs_peer.py --mdns``: mDNS under ``_p2p._udp.local.``, IPFS's DHT),
  started first. The pair must find each other and never dial it.

It prints one JSON line (``ok``, timings, addresses, ``error``) and exits 0 if both
messages arrived with the right author (and, in ``ipfs`` mode, nobody dialled the IPFS
peer), 1 if not.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from sapo_node.config import NetSection, PoolSection
from sapo_node.net.process import Libp2pTransport
from tests.support.namespaces import script_main

REPO = Path(__file__).resolve().parents[2]
VALID = REPO / "protocol" / "vectors" / "valid"
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
# The IPFS peer watches for dials from its start until this long after both messages
# arrived: a node that found it by mDNS (browsing IPFS's name) found it with its first
# query, as it found the other node, and dials it within a discovery pass (redial_s, 1 s);
# at most IPFS_WATCH_S in all.
IPFS_WATCH_AFTER_S = 5.0
IPFS_WATCH_S = 60.0

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def lo_up() -> None:
    """``ip link set lo up`` for this thread's namespace, without needing ``ip``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


class Namespaces:
    """This thread's network namespace and a second one, fresh; :meth:`inside` moves this
    thread into the second for a while (processes started meanwhile stay there)."""

    def __init__(self) -> None:
        self.home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        self.other = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        _check(_libc.setns(self.home, CLONE_NEWNET), "setns")

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        _check(_libc.setns(self.other, CLONE_NEWNET), "setns")
        try:
            yield
        finally:
            _check(_libc.setns(self.home, CLONE_NEWNET), "setns")

    def ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, pass_fds=(self.other,))

    def join(self) -> None:
        """va (198.19.77.1/24) here, vb (198.19.77.2/24) there, lo up in both."""
        lo_up()
        other = f"/proc/{os.getpid()}/fd/{self.other}"
        self.ip("link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", other)
        self.ip("addr", "add", "198.19.77.1/24", "dev", "va")
        self.ip("link", "set", "va", "up")
        with self.inside():
            lo_up()
            self.ip("addr", "add", "198.19.77.2/24", "dev", "vb")
            self.ip("link", "set", "vb", "up")


def wait_for(pred: Callable[[], object], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def first_readings(
    names: Iterable[str], ready: Callable[[str], object], read: Callable[[str], Any], timeout: float
) -> dict[str, Any]:
    """Each name's first ``read`` once it is ``ready``, kept as each appears (a node that
    moves on before the last one is ready keeps its first reading); those ready in time."""
    first: dict[str, Any] = {}
    names = list(names)

    def all_read() -> bool:
        first.update({n: read(n) for n in names if n not in first and ready(n)})
        return len(first) == len(names)

    wait_for(all_read, timeout)
    return first


def run(mode: str, find_s: float, deliver_s: float) -> dict[str, object]:
    result: dict[str, object] = {"mode": mode, "ok": False}
    listen = "/ip4/0.0.0.0/tcp/0" if mode == "veth" else "/ip4/127.0.0.1/tcp/0"
    if mode != "veth":
        lo_up()
        second: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    else:
        namespaces = Namespaces()
        namespaces.join()
        second = namespaces.inside()
    net = NetSection(
        mdns=True,
        dht=False,
        bootstrap=[],
        listen=[listen],
        swarm="mdns-test",
        redial_s=1.0,
        lan_ranges=["198.19.0.0/16"],
    )
    messages = {"a": (VALID / "minimal.msgpack").read_bytes()}
    messages["b"] = (VALID / "unicode.msgpack").read_bytes()
    transports: dict[str, Libp2pTransport] = {}
    with tempfile.TemporaryDirectory(prefix="mdns-pair-") as tmp:
        ipfs: subprocess.Popen | None = None
        ipfs_log = Path(tmp) / "ipfs.log"
        ipfs_stop = Path(tmp) / "ipfs.stop"
        try:
            if mode == "ipfs":
                with ipfs_log.open("wb") as out:
                    ipfs = subprocess.Popen(
                        [sys.executable, "-m", "tests.support.ipfs_peer", "--mdns"]
                        + ["--watch", str(IPFS_WATCH_S), "--until", str(ipfs_stop)],
                        cwd=REPO,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                if not wait_for(lambda: "addr " in ipfs_log.read_text(), find_s):
                    result["error"] = f"the IPFS peer did not start: {ipfs_log.read_text()}"
                    return result
            start = time.monotonic()
            transports["a"] = Libp2pTransport(net, PoolSection(), Path(tmp) / "a")
            with second:  # in veth mode, b's network process runs in the other namespace
                transports["b"] = Libp2pTransport(net, PoolSection(), Path(tmp) / "b")
            a, b = transports["a"], transports["b"]
            result["addrs"] = {"a": a.addrs, "b": b.addrs}
            result["started_s"] = round(time.monotonic() - start, 2)
            if not wait_for(lambda: a.peers() >= 1 and b.peers() >= 1, find_s):
                result["error"] = f"no peer found by mDNS in {find_s:.0f} s"
                result["stats"] = {"a": a.child_stats, "b": b.child_stats}
                return result
            result["found_s"] = round(time.monotonic() - start, 2)
            # A message published before the mesh forms may find no route; wait for it.
            if not wait_for(
                lambda: a.child_stats.get("mesh", 0) >= 1 and b.child_stats.get("mesh", 0) >= 1,
                find_s,
            ):
                result["error"] = f"connected but no mesh in {find_s:.0f} s"
                return result
            sent = time.monotonic()
            a.publish(messages["a"])
            b.publish(messages["b"])
            got: dict[str, list[tuple[bytes, str]]] = {"a": [], "b": []}

            def both_arrived() -> bool:
                for name, t in transports.items():
                    got[name] += [(m.data, m.author) for m in t.received()]
                return (messages["a"], a.peer_id) in got["b"] and (
                    messages["b"],
                    b.peer_id,
                ) in got["a"]

            if not wait_for(both_arrived, deliver_s):
                result["error"] = f"messages not delivered in {deliver_s:.0f} s"
                result["received"] = {
                    name: [(len(data), author) for data, author in items]
                    for name, items in got.items()
                }
                return result
            result["delivered_s"] = round(time.monotonic() - sent, 2)
            if ipfs is not None:
                time.sleep(IPFS_WATCH_AFTER_S)
                ipfs_stop.touch()
                ipfs.wait(find_s)
                said = ipfs_log.read_text()
                result["ipfs_dialled_by"] = [
                    line.split()[1] for line in said.splitlines() if line.startswith("dialled_by ")
                ]
                if "done" not in said or result["ipfs_dialled_by"]:
                    result["error"] = f"the IPFS peer was dialled: {said[-2000:]}"
                    return result
            result["ok"] = True
            return result
        finally:
            for t in transports.values():
                t.close()
            if ipfs is not None and ipfs.poll() is None:
                ipfs.kill()
                ipfs.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["lo", "veth", "ipfs"], default="lo")
    parser.add_argument("--find-s", type=float, default=45.0)
    parser.add_argument("--deliver-s", type=float, default=20.0)
    args = parser.parse_args()
    return script_main(lambda: run(args.mode, args.find_s, args.deliver_s))


if __name__ == "__main__":
    sys.exit(main())
