"""An in-process swarm of Libp2pTransport nodes on loopback, and the ledger of what they
publish and receive: what scripts/bench_swarm.py and scripts/bench_scale.py measure with."""

from __future__ import annotations

import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import msgpack

from sapo_node.config import NetSection, PoolSection
from sapo_node.net.process import Libp2pTransport
from scripts.support.loopback import loopback_net
from scripts.support.messages import group_bytes

POLL_S = 0.002  # how often the benchmark reads the inboxes


class Ledger:
    """Publish times and receptions of one measurement."""

    def __init__(self) -> None:
        self.sent: dict[tuple[int, int], float] = {}  # (node, seq) -> time.time()
        self.got: dict[tuple[int, int], dict[int, float]] = defaultdict(dict)
        self.copies = 0
        self.duplicates = 0
        self.lock = threading.Lock()

    def publish(self, t: Libp2pTransport, node: int, seq: int, texts: tuple[str, ...]) -> bool:
        now = time.time()
        data = group_bytes(texts, node, seq, int(now * 1000))
        with self.lock:
            self.sent[(node, seq)] = now
        ok = t.publish(data)
        if not ok:
            with self.lock:
                del self.sent[(node, seq)]
        return ok

    def receive(self, receiver: int, author: int, data: bytes, at: float) -> None:
        seq = msgpack.unpackb(data, raw=False)["round"]
        times = self.got[(author, seq)]
        if receiver in times:
            self.duplicates += 1
            return
        times[receiver] = at
        self.copies += 1

    def latencies(self, receivers: int) -> tuple[list[float], dict[int, list[float]], int]:
        """(last-receiver latency of each fully delivered group, per-receiver latencies,
        groups some receiver missed)."""
        last: list[float] = []
        per: dict[int, list[float]] = defaultdict(list)
        missed = 0
        with self.lock:
            sent = dict(self.sent)
        for key, t0 in sent.items():
            times = self.got.get(key, {})
            for r, at in times.items():
                per[r].append(at - t0)
            if len(times) == receivers:
                last.append(max(times.values()) - t0)
            else:
                missed += 1
        return last, per, missed


class Swarm:
    """Transports in this process, node i bootstrapped to node 0 and node i-1."""

    def __init__(self, root: Path, pool: PoolSection, redial_s: float) -> None:
        self.root, self.pool, self.redial_s = root, pool, redial_s
        self.nodes: list[Libp2pTransport] = []
        self.index: dict[str, int] = {}  # peer id -> node number
        self.serial = 0

    def net(self, bootstrap: list[str]) -> NetSection:
        return loopback_net("bench", bootstrap, redial_s=self.redial_s)

    def bootstrap(self) -> list[str]:
        return list(dict.fromkeys(n.addrs[0] for n in self.nodes[:1] + self.nodes[-1:]))

    def grow(self, total: int) -> None:
        while len(self.nodes) < total:
            self.serial += 1
            t = Libp2pTransport(
                self.net(self.bootstrap()), self.pool, self.root / f"node-{self.serial}"
            )
            self.index[t.peer_id] = len(self.nodes)
            self.nodes.append(t)

    def add_peer(self, peer_id: str) -> None:
        """A node in another process (the trainer): known by its peer id."""
        self.index[peer_id] = len(self.index)

    def settle(self, want: int, settle_s: float, timeout_s: float = 60.0) -> float:
        """Wait until every node has a swarm peer, then until every node sees ``want``
        peers or ``settle_s`` has passed since; returns the seconds waited."""
        start = time.monotonic()
        while min(n.peers() for n in self.nodes) < 1:
            if time.monotonic() - start > timeout_s:
                raise RuntimeError(f"no swarm peers after {timeout_s:.0f} s")
            time.sleep(0.05)
        ready = time.monotonic()
        while time.monotonic() - ready < settle_s:
            time.sleep(0.1)
        while min(n.peers() for n in self.nodes) < want and time.monotonic() - ready < 20:
            time.sleep(0.1)
        return time.monotonic() - start

    def poll(self, ledger: Ledger | None) -> None:
        for r, t in enumerate(self.nodes):
            for item in t.received():
                author = self.index.get(item.author)
                if ledger is not None and author is not None:
                    ledger.receive(r, author, item.data, item.received_at)

    def drain_for(self, seconds: float, ledger: Ledger | None) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.poll(ledger)
            time.sleep(POLL_S)

    def counters(self) -> dict[str, list[int]]:
        """Counters of every node's network process (reported each second)."""
        keys = ("published", "received", "bytes_in", "bytes_out", "rate_limited")
        out = {k: [int(n.child_stats.get(k, 0)) for n in self.nodes] for k in keys}
        out["inbox_dropped"] = [n.stats().inbox_dropped for n in self.nodes]
        out["publish_dropped"] = [n.stats().publish_dropped for n in self.nodes]
        return out

    def close(self) -> None:
        for t in self.nodes:
            try:
                t.close()
            except Exception as exc:  # close the others whatever happens to one
                print(f"close failed: {exc!r}", file=sys.stderr)
        self.nodes.clear()


def delta(after: dict[str, list[int]], before: dict[str, list[int]]) -> dict[str, list[int]]:
    return {k: [a - b for a, b in zip(after[k], before[k], strict=False)] for k in after}


def wait_counters(swarm: Swarm, ledger: Ledger | None, seconds: float = 1.3) -> None:
    """Keep reading until the network processes have sent a fresh stats report."""
    swarm.drain_for(seconds, ledger)


def paced_publisher(
    ledger: Ledger,
    transport: Libp2pTransport,
    node: int,
    texts: tuple[str, ...],
    groups: int,
    every_s: float,
    offset_s: float,
    stop: threading.Event,
    first_seq: int = 0,
) -> None:
    """``groups`` groups at once every ``every_s``, as a node does each round."""
    seq = first_seq
    if stop.wait(offset_s):
        return
    while True:
        for _ in range(groups):
            ledger.publish(transport, node, seq, texts)
            seq += 1
        if stop.wait(every_s):
            return
