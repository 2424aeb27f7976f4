"""Benchmark a swarm of Libp2pTransport nodes on loopback (127.0.0.1 only, no mDNS).

Every node is a real :class:`sapo_node.net.process.Libp2pTransport` (py-libp2p GossipSub
in its own child process); the benchmark process holds them all and reads their inboxes
every 2 ms. Node i bootstraps to node 0 and node i-1. Messages are valid wire groups
(``wire.encode``): 8 completions of about 260 characters, about 2.4 KB; the author is
the publishing node, ``round`` its sequence number, ``created_ms`` the publish time.
Latency is ``Received.received_at`` (stamped by the transport's reader thread when the
frame arrives from the network process) minus the time just before ``publish()``.

Prints, in one process:
  a. propagation latency, one group in flight at a time, the publishers in turn: p50/p95
     of (last of the other nodes to receive it - publish), and per receiver; in a 2-node
     swarm (the baseline), then in the full swarm (the same 2 nodes and the rest);
  b. groups/s sustained, every node publishing for ``--seconds``: with a window (at most
     ``--window`` of its groups on their way to the others: the swarm's capacity), then
     a flood (as fast as its network process takes them, ``--flood-seconds``), with
     per-author limits raised to ``--rate``/``--burst``; then with a window in a fresh
     swarm with the node's default limits (2/s, burst 64), ``--default-seconds``;
     delivered copies/s, delivery ratio (received / published x receivers), latency;
  c. bytes on the wire per group (pubsub RPC bytes counted by the network processes, no
     Noise/yamux framing) against the message size times the receivers;
  d. the network's share of CPU while a node trains: the last node is replaced by one in
     its own process that trains a tiny model with ``sapo_node.train.trainer`` back to back,
     first while the swarm is idle, then while every node publishes ``--train-groups``
     groups every ``--train-every-s``; CPU seconds (user + sys) of its network process
     against its own, training steps/s, and the gaps between its network process's
     stats reports (one a second).

All nodes share this machine's cores, so rates are those of N nodes on it, not of one
node; compare the ratios against the baselines of the same run. The network processes
log to ``--log`` (stderr goes there while the swarm runs).

Usage: python scripts/bench_swarm.py [--nodes 8] [--seconds 20] [--log FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import psutil

from sapo_node.config import NetSection, PoolSection
from sapo_node.intake import wire
from sapo_node.net.process import Libp2pTransport
from sapo_node.tasks import TaskRef, generator_of

REPO = Path(__file__).resolve().parents[1]
LOOPBACK = "/ip4/127.0.0.1/tcp/0"
COMPLETIONS = 8
FAMILY = "basic_arithmetic"
CONFIG = {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 2}
POLL_S = 0.002
_TEXT = (
    "first add the two numbers then carry one so we get next check sum result step "
    "digit plus minus times equals ones tens answer is which makes so far"
)
WORDS = _TEXT.split()


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f}"


# --- messages ---------------------------------------------------------------------------


def completions(rng: random.Random) -> tuple[str, ...]:
    """8 completions of about 260 characters of arithmetic-looking text."""
    out = []
    for _ in range(COMPLETIONS):
        words = [rng.choice(WORDS) if rng.random() < 0.7 else str(rng.randint(0, 99))]
        while sum(len(w) + 1 for w in words) < 240:
            words.append(rng.choice(WORDS) if rng.random() < 0.7 else str(rng.randint(0, 99)))
        out.append(" ".join(words) + f".\n<answer>{rng.randint(0, 999)}</answer>")
    return tuple(out)


def group_bytes(texts: tuple[str, ...], node: int, seq: int, created_ms: int) -> bytes:
    """A valid group: node ``node``'s ``seq``-th, published at ``created_ms``."""
    group = wire.RolloutGroup(
        ref=TaskRef.make(FAMILY, CONFIG, node, seq),
        generator=generator_of(FAMILY),
        question=f"What is {seq} + {node} + 17? Give the answer in <answer></answer>.",
        completions=texts,
        model="embedded",
        round=seq,
        created_ms=created_ms,
    )
    return wire.encode(group)


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


# --- the swarm --------------------------------------------------------------------------


class Swarm:
    """Transports in this process, node i bootstrapped to node 0 and node i-1."""

    def __init__(self, root: Path, pool: PoolSection, redial_s: float) -> None:
        self.root, self.pool, self.redial_s = root, pool, redial_s
        self.nodes: list[Libp2pTransport] = []
        self.index: dict[str, int] = {}  # peer id -> node number
        self.serial = 0

    def net(self, bootstrap: list[str]) -> NetSection:
        return NetSection(
            listen=[LOOPBACK],
            mdns=False,
            redial_s=self.redial_s,
            swarm="bench",
            bootstrap=bootstrap,
        )

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


# --- a. latency ---------------------------------------------------------------------------


@dataclass
class LatencyResult:
    nodes: int
    last: list[float]
    per: dict[int, list[float]]
    missed: int
    groups: int
    bytes_out: int = 0
    bytes_in: int = 0
    size: float = 0.0


def bench_latency(
    swarm: Swarm, groups: int, gap_s: float, texts: list[tuple[str, ...]], timeout_s: float = 3.0
) -> LatencyResult:
    """One group in flight at a time: publish, wait until every other node has it (or
    ``timeout_s``), pause ``gap_s``, next publisher."""
    n = len(swarm.nodes)
    ledger = Ledger()
    before = swarm.counters()
    sizes = []
    for k in range(groups):
        node = k % n
        ledger.publish(swarm.nodes[node], node, k, texts[node])
        sizes.append(len(group_bytes(texts[node], node, k, int(time.time() * 1000))))
        deadline = time.monotonic() + timeout_s
        while len(ledger.got.get((node, k), ())) < n - 1 and time.monotonic() < deadline:
            swarm.poll(ledger)
            time.sleep(POLL_S)
        swarm.drain_for(gap_s, ledger)
    swarm.drain_for(1.0, ledger)  # stragglers
    wait_counters(swarm, ledger)
    d = delta(swarm.counters(), before)
    last, per, missed = ledger.latencies(n - 1)
    return LatencyResult(
        n,
        last,
        per,
        missed,
        groups,
        sum(d["bytes_out"]),
        sum(d["bytes_in"]),
        statistics.mean(sizes),
    )


def report_latency(base: LatencyResult, full: LatencyResult) -> None:
    print(
        "a. propagation latency: one group in flight at a time, publishers in turn; "
        "time until the last of the other nodes has it"
    )
    print("   | swarm | groups | fully delivered | last receiver p50 | p95 | vs 2 nodes (p50) |")
    print("   |---|---|---|---|---|---|")
    for r in (base, full):
        p50 = pct(r.last, 0.5)
        print(
            f"   | {r.nodes} nodes | {r.groups} | {r.groups - r.missed} | {ms(p50)} ms | "
            f"{ms(pct(r.last, 0.95))} ms | {p50 / pct(base.last, 0.5):.2f}x |"
        )
    print(f"   per receiver in the {full.nodes}-node swarm (all publishers):")
    print("   | receiver | copies | p50 | p95 |")
    print("   |---|---|---|---|")
    for r in sorted(full.per):
        v = full.per[r]
        print(f"   | node {r} | {len(v)} | {ms(pct(v, 0.5))} ms | {ms(pct(v, 0.95))} ms |")


# --- b. sustained -------------------------------------------------------------------------


@dataclass
class Sustained:
    label: str
    nodes: int
    seconds: float
    published: list[int]
    received: Counter[int] = field(default_factory=Counter)  # per publisher, all receivers
    steady: float = 0.0  # copies/s received in the steady window
    last: list[float] = field(default_factory=list)
    missed: int = 0
    counters: dict[str, list[int]] = field(default_factory=dict)
    size: float = 0.0
    drain_s: float = 0.0
    banned: int = 0  # (node, peer) bans in force at the end
    flood: bool = False


def bench_sustained(
    swarm: Swarm,
    seconds: float,
    texts: list[tuple[str, ...]],
    label: str,
    drain_max_s: float,
    inflight: int,
    window: int | None,
    give_up_s: float = 3.0,
) -> Sustained:
    """Every node publishes as fast as it may for ``seconds``.

    ``window`` None (flood): whenever fewer than ``inflight`` of its groups wait in its
    transport's outbox (the queue to its network process), i.e. as fast as the network
    process takes them. ``window`` W: whenever fewer than W of its groups are on their
    way (not yet at every other node, and published less than ``give_up_s`` ago)."""
    n = len(swarm.nodes)
    ledger = Ledger()
    stop = threading.Event()
    published = [0] * n
    size = len(group_bytes(texts[0], 0, 10**6, int(time.time() * 1000)))

    def on_the_way(node: int, pending: list[tuple[int, float]]) -> list[tuple[int, float]]:
        now = time.time()
        return [
            (seq, t)
            for seq, t in pending
            if len(ledger.got.get((node, seq), ())) < n - 1 and now - t < give_up_s
        ]

    def publisher(node: int) -> None:
        seq = 0
        t = swarm.nodes[node]
        pending: list[tuple[int, float]] = []
        while not stop.is_set():
            if window is None:
                busy = t._outbox.qsize() >= inflight
            else:
                pending = on_the_way(node, pending)
                busy = len(pending) >= window
            if busy:
                time.sleep(POLL_S)
                continue
            if ledger.publish(t, node, seq, texts[node]):
                published[node] += 1
                pending.append((seq, time.time()))
            seq += 1

    before = swarm.counters()
    threads = [threading.Thread(target=publisher, args=(i,), daemon=True) for i in range(n)]
    start = time.time()
    for th in threads:
        th.start()
    warm = min(2.0, seconds / 4)
    copies_at_warm = None
    while time.time() - start < seconds:
        swarm.poll(ledger)
        if copies_at_warm is None and time.time() - start >= warm:
            copies_at_warm = ledger.copies
        time.sleep(POLL_S)
    copies_at_end = ledger.copies
    stop.set()
    end = time.time()
    for th in threads:
        th.join(10)
    # Drain: until every copy is in, or (windowed) receptions stopped for 2 s, or
    # drain_max_s (a flood's backlog takes long to come out, or never does).
    drain_start = time.monotonic()
    expected = sum(published) * (n - 1)
    quiet_s = drain_max_s if window is None else 2.0
    last_count, last_change = -1, time.monotonic()
    while time.monotonic() - drain_start < drain_max_s and ledger.copies < expected:
        swarm.drain_for(0.2, ledger)
        if ledger.copies != last_count:
            last_count, last_change = ledger.copies, time.monotonic()
        elif time.monotonic() - last_change > quiet_s:
            break
    drain_s = time.monotonic() - drain_start
    wait_counters(swarm, ledger)
    result = Sustained(
        label, n, end - start, published, size=size, drain_s=drain_s, flood=window is None
    )
    result.counters = delta(swarm.counters(), before)
    for (author, _seq), times in ledger.got.items():
        result.received[author] += len(times)
    result.steady = (copies_at_end - (copies_at_warm or 0)) / (end - start - warm)
    result.banned = sum(len(t.child_stats.get("banned", [])) for t in swarm.nodes)
    result.last, _, result.missed = ledger.latencies(n - 1)
    return result


def report_sustained(results: list[Sustained]) -> None:
    print(
        "b. sustained: every node publishes as fast as it may (window W: at most W of its "
        "groups on their way; flood: as fast as its network process takes them)"
    )
    print(
        "   | run | published/s (all nodes) | delivered copies/s, steady | groups/s to all "
        "| delivery ratio | last-receiver latency p50 / p95 | drain after stop |"
    )
    print("   |---|---|---|---|---|---|---|")
    for r in results:
        pub = sum(r.published)
        expected = pub * (r.nodes - 1)
        got = sum(r.received.values())
        lat = f"{ms(pct(r.last, 0.5))} / {ms(pct(r.last, 0.95))} ms" if r.last else "none"
        print(
            f"   | {r.label} | {pub / r.seconds:.1f} | {r.steady:.1f} | "
            f"{r.steady / (r.nodes - 1):.1f} | {got}/{expected} = {got / max(1, expected):.3f} "
            f"| {lat} | {r.drain_s:.1f} s |"
        )
    print("   per publisher: published/s, delivery ratio")
    print("   | publisher | " + " | ".join(r.label for r in results) + " |")
    print("   |---|" + "---|" * len(results))
    for i in range(results[0].nodes):
        cells = [
            f"{r.published[i] / r.seconds:.1f}/s, "
            f"{r.received[i] / max(1, r.published[i] * (r.nodes - 1)):.3f}"
            for r in results
        ]
        print(f"   | node {i} | " + " | ".join(cells) + " |")
    for r in results:
        c = r.counters
        print(
            f"   {r.label}: rate-limited {sum(c['rate_limited'])}, inbox dropped "
            f"{sum(c['inbox_dropped'])}, publish dropped {sum(c['publish_dropped'])}, "
            f"bans in force at the end {r.banned} (node, peer pairs)"
        )


# --- c. bytes -----------------------------------------------------------------------------


def report_bytes(lats: list[LatencyResult], sus: list[Sustained]) -> None:
    print("c. bytes on the wire per group (pubsub RPC bytes, all nodes summed)")
    print(
        "   | phase | message bytes | bytes out / group | bytes in / group | "
        "overhead = out / (size x receivers) |"
    )
    print("   |---|---|---|---|---|")
    rows = [
        (f"latency, {r.nodes} nodes", r.groups, r.bytes_out, r.bytes_in, r.size, r.nodes)
        for r in lats
    ]
    for r in sus:
        if r.flood:  # most of its traffic was still to come when the counters were read
            continue
        rows.append(
            (
                f"sustained, {r.label}",
                sum(r.counters["published"]),
                sum(r.counters["bytes_out"]),
                sum(r.counters["bytes_in"]),
                r.size,
                r.nodes,
            )
        )
    for label, groups, out, inn, size, nodes in rows:
        print(
            f"   | {label} | {size:.0f} | {out / groups:.0f} | {inn / groups:.0f} | "
            f"{out / groups / (size * (nodes - 1)):.2f}x |"
        )


# --- d. CPU while training ----------------------------------------------------------------


class StatsWatch:
    """When a transport's stats reports (one a second from its network process) arrive,
    seen from a thread of the node's process."""

    def __init__(self, transport: Libp2pTransport) -> None:
        self.transport = transport
        self.arrivals: list[float] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stats-watch", daemon=True)

    def _watch(self) -> None:
        seen = self.transport.child_stats
        while not self._done.is_set():
            if self.transport.child_stats is not seen:
                seen = self.transport.child_stats
                self.arrivals.append(time.monotonic())
            time.sleep(0.01)

    def __enter__(self) -> StatsWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]


def cpu_seconds(proc: psutil.Process, threads: set[int] | None = None) -> float:
    """User + system CPU seconds of a process, or of some of its threads."""
    if threads is None:
        t = proc.cpu_times()
        return t.user + t.system
    return sum(th.user_time + th.system_time for th in proc.threads() if th.id in threads)


def train_for(
    transport: Libp2pTransport,
    step: Any,
    seconds: float,
    publish: Any,
    every_s: float,
) -> dict[str, Any]:
    """Run ``step()`` back to back for ``seconds``, calling ``publish()`` every
    ``every_s`` and draining the transport after each step; CPU and stats timing."""
    me = psutil.Process()
    child = psutil.Process(transport._proc.pid)
    ipc = {
        t.native_id
        for t in threading.enumerate()
        if t.name in ("net-reader", "net-writer", "net-supervisor") and t.native_id
    }
    net0, own0, ipc0 = cpu_seconds(child), cpu_seconds(me), cpu_seconds(me, ipc)
    stats0 = dict(transport.child_stats)
    steps = received = published = 0
    with StatsWatch(transport) as watch:
        start = next_publish = time.monotonic()
        while time.monotonic() - start < seconds:
            if time.monotonic() >= next_publish:
                published += publish()
                next_publish += every_s
            step()
            steps += 1
            received += len(transport.received())
        wall = time.monotonic() - start
        net1, own1, ipc1 = cpu_seconds(child), cpu_seconds(me), cpu_seconds(me, ipc)
    stats1 = dict(transport.child_stats)
    gaps = watch.gaps()
    return {
        "wall": wall,
        "steps": steps,
        "received": received,
        "published": published,
        "net_cpu": net1 - net0,
        "train_cpu": own1 - own0,
        "ipc_cpu": ipc1 - ipc0,
        "bytes_in": stats1.get("bytes_in", 0) - stats0.get("bytes_in", 0),
        "bytes_out": stats1.get("bytes_out", 0) - stats0.get("bytes_out", 0),
        "mean_gap": statistics.mean(gaps) if gaps else float("nan"),
        "max_gap": max(gaps) if gaps else float("nan"),
    }


def trainer_main(conn: Any, settings: dict[str, Any]) -> None:
    """The training node, in its own process: a tiny model and sapo_node.train.trainer, then a
    transport; trains on the parent's word ("train", seconds, every_s, groups)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import torch

    from sapo_node.config import LoraSection, TrainSection
    from sapo_node.logs import configure_logging
    from sapo_node.train.policy import load_policy
    from sapo_node.train.trainer import Sample, Trainer
    from tests.support.tiny import build_tiny_model

    configure_logging()
    root = Path(settings["root"])
    path = build_tiny_model(root / "model", hidden=settings["hidden"], layers=settings["layers"])
    torch.manual_seed(0)
    policy = load_policy(
        str(path), device="cpu", dtype="auto", lora=LoraSection(), cache_dir=root / "cache"
    )
    trainer = Trainer(policy, TrainSection(lr=1e-4), max_new_tokens=64)
    g = torch.Generator().manual_seed(1)
    samples = [
        Sample(
            torch.randint(4, 90, (100,), generator=g).tolist(),
            torch.randint(4, 90, (64,), generator=g).tolist(),
            advantage=(-1.0) ** i * 0.5,
        )
        for i in range(settings["sequences"])
    ]
    trainer.step(samples)  # warm up
    conn.send(("model", sum(p.numel() for p in policy.model.parameters())))
    msg = conn.recv()
    if msg[0] != "bootstrap":
        return
    net = NetSection(
        listen=[LOOPBACK],
        mdns=False,
        redial_s=settings["redial_s"],
        swarm="bench",
        bootstrap=msg[1],
    )
    transport = Libp2pTransport(net, PoolSection(), root / "node")
    texts = completions(random.Random(99))
    node, seq = settings["node"], 0
    try:
        conn.send(("ready", transport.peer_id))
        while (msg := conn.recv())[0] != "stop":
            if msg[0] == "peers":
                conn.send(("peers", transport.peers()))
                continue
            _, seconds, every_s, groups = msg

            def publish(groups: int = groups) -> int:
                nonlocal seq
                now_ms = int(time.time() * 1000)
                for _ in range(groups):
                    transport.publish(group_bytes(texts, node, seq, now_ms))
                    seq += 1
                return groups

            result = train_for(transport, lambda: trainer.step(samples), seconds, publish, every_s)
            conn.send(("result", result))
    finally:
        transport.close()


def paced_publisher(
    ledger: Ledger,
    transport: Libp2pTransport,
    node: int,
    texts: tuple[str, ...],
    groups: int,
    every_s: float,
    offset_s: float,
    stop: threading.Event,
) -> None:
    """``groups`` groups at once every ``every_s``, as a node does each round."""
    seq = 10**6
    if stop.wait(offset_s):
        return
    while True:
        for _ in range(groups):
            ledger.publish(transport, node, seq, texts)
            seq += 1
        if stop.wait(every_s):
            return


def bench_training(
    swarm: Swarm,
    conn: Any,
    seconds: float,
    groups: int,
    every_s: float,
    texts: list[tuple[str, ...]],
) -> list[tuple[str, dict[str, Any]]]:
    """The trainer trains twice: the swarm idle, then the swarm publishing."""
    out = []
    ledger = Ledger()
    n = len(swarm.nodes)
    for label, burst in (("swarm idle", 0), ("swarm publishing", groups)):
        stop = threading.Event()
        threads = [
            threading.Thread(
                target=paced_publisher,
                args=(ledger, t, i, texts[i], burst, every_s, every_s * i / n, stop),
                daemon=True,
            )
            for i, t in enumerate(swarm.nodes)
            if burst
        ]
        conn.send(("train", seconds, every_s, burst))
        for th in threads:
            th.start()
        while not conn.poll(POLL_S):
            swarm.poll(None)
        stop.set()
        for th in threads:
            th.join(10)
        _, result = conn.recv()
        out.append((label, result))
        swarm.drain_for(1.0, None)
    return out


def report_training(
    rows: list[tuple[str, dict[str, Any]]],
    params: int,
    sequences: int,
    groups: int,
    every_s: float,
    others: int,
) -> None:
    print(
        f"d. one node training a {params / 1e6:.2f}M-parameter model (sapo_node.train.trainer, "
        f"{sequences} sequences of 100 + 64 tokens a step); the other {others} nodes publish "
        f"{groups} groups every {every_s:g} s each when publishing (so does the trainer)"
    )
    print(
        "   | swarm | train steps/s | groups received | network process CPU | "
        "trainer process CPU | network share | IPC threads (in trainer) | "
        "stats reports: mean / max gap |"
    )
    print("   |---|---|---|---|---|---|---|---|")
    base = rows[0][1]
    for label, r in rows:
        share = r["net_cpu"] / (r["net_cpu"] + r["train_cpu"])
        rate = r["steps"] / r["wall"]
        print(
            f"   | {label} | {rate:.2f} ({rate / (base['steps'] / base['wall']):.2f}x) | "
            f"{r['received']} | {r['net_cpu']:.2f} s ({r['net_cpu'] / r['wall']:.3f} cores) | "
            f"{r['train_cpu']:.2f} s ({r['train_cpu'] / r['wall']:.2f} cores) | "
            f"{100 * share:.1f}% | {r['ipc_cpu']:.2f} s | "
            f"{r['mean_gap']:.2f} / {r['max_gap']:.2f} s |"
        )
    busy, idle = rows[1][1], rows[0][1]
    cores = psutil.cpu_count() or 1
    print(
        f"   the publishing swarm's network process used {busy['net_cpu'] / busy['wall']:.3f} "
        f"cores: {100 * busy['net_cpu'] / busy['wall'] / cores:.1f}% of this machine's "
        f"{cores} cores (the other nodes and other programs share them too)"
    )
    extra = busy["net_cpu"] / busy["wall"] - idle["net_cpu"] / idle["wall"]
    if busy["received"]:
        per = extra * busy["wall"] / (busy["received"] + busy["published"])
        print(
            f"   network CPU above the idle swarm: {extra:.3f} cores, "
            f"{1000 * per:.1f} ms per group received or published"
        )


# --- main ---------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0, help="sustained publishing")
    parser.add_argument("--latency-groups", type=int, default=40)
    parser.add_argument("--latency-gap-ms", type=float, default=50.0)
    parser.add_argument(
        "--window", type=int, default=1, help="most groups of one node on their way"
    )
    parser.add_argument(
        "--default-seconds", type=float, default=10.0, help="sustained, default limits"
    )
    parser.add_argument("--flood-seconds", type=float, default=5.0, help="0: no flood")
    parser.add_argument("--flood-drain-s", type=float, default=8.0)
    parser.add_argument(
        "--inflight", type=int, default=8, help="flood: most groups waiting in an outbox"
    )
    parser.add_argument("--rate", type=float, default=1000.0, help="raised per-author rate")
    parser.add_argument("--burst", type=int, default=1000, help="raised per-author burst")
    parser.add_argument("--settle-s", type=float, default=3.0, help="mesh settling time")
    parser.add_argument("--redial-s", type=float, default=1.0)
    parser.add_argument("--drain-max-s", type=float, default=15.0)
    parser.add_argument("--train-seconds", type=float, default=12.0, help="each of 2 runs")
    parser.add_argument("--train-groups", type=int, default=8)
    parser.add_argument("--train-every-s", type=float, default=8.0)
    parser.add_argument("--train-hidden", type=int, default=256)
    parser.add_argument("--train-layers", type=int, default=4)
    parser.add_argument("--train-sequences", type=int, default=8, help="per training step")
    parser.add_argument("--skip-defaults", action="store_true", help="no default-limit swarm")
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "bench_swarm.log")
    args = parser.parse_args()
    if args.nodes < 3:
        parser.error("--nodes must be at least 3 (the baseline is a 2-node swarm)")

    began = time.perf_counter()
    saved_stderr = os.dup(2)
    log = open(args.log, "w")  # noqa: SIM115 -- closed in finally
    os.dup2(log.fileno(), 2)
    from sapo_node.logs import configure_logging

    configure_logging()
    texts = [completions(random.Random(i)) for i in range(args.nodes)]
    swarms: list[Swarm] = []
    trainer: mp.process.BaseProcess | None = None
    conn = None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-swarm-") as tmp:
            root = Path(tmp)
            raised = PoolSection(rate_per_author=args.rate, burst_per_author=args.burst)
            import sapo_node

            print(
                f"{args.nodes} nodes on 127.0.0.1, one network process each; sapo_node from "
                f"{Path(sapo_node.__file__).parent}; load average {load()}; logs in {args.log}",
                flush=True,
            )
            # a. 2 nodes, then the full swarm: the same 2 plus the rest
            swarm = Swarm(root / "raised", raised, args.redial_s)
            swarms.append(swarm)
            t = time.monotonic()
            swarm.grow(2)
            swarm.settle(1, args.settle_s)
            gap = args.latency_gap_ms / 1000
            base = bench_latency(swarm, args.latency_groups // 2, gap, texts)
            swarm.grow(args.nodes)
            waited = swarm.settle(min(args.nodes - 1, 4), args.settle_s)
            print(
                f"   full swarm up in {time.monotonic() - t:.1f} s (settled {waited:.1f} s); "
                "swarm peers / mesh peers per node: "
                + " ".join(f"{n.peers()}/{n.child_stats.get('mesh')}" for n in swarm.nodes)
            )
            full = bench_latency(swarm, args.latency_groups, gap, texts)
            report_latency(base, full)
            # b. sustained, raised limits: windowed, then a flood
            raised_label = f"{args.rate:g}/s burst {args.burst}"
            sustained = [
                bench_sustained(
                    swarm,
                    args.seconds,
                    texts,
                    f"window {args.window}, {raised_label}",
                    args.drain_max_s,
                    args.inflight,
                    args.window,
                )
            ]
            if args.flood_seconds > 0:
                sustained.append(
                    bench_sustained(
                        swarm,
                        args.flood_seconds,
                        texts,
                        f"flood, {raised_label}",
                        args.flood_drain_s,
                        args.inflight,
                        None,
                    )
                )
            swarm.close()
            # the training node's process prepares its model while the second swarm starts
            ctx = mp.get_context("spawn")
            conn, child_conn = ctx.Pipe()
            if not args.skip_training:
                trainer = ctx.Process(
                    target=trainer_main,
                    args=(
                        child_conn,
                        {
                            "root": str(root / "trainer"),
                            "hidden": args.train_hidden,
                            "layers": args.train_layers,
                            "sequences": args.train_sequences,
                            "redial_s": args.redial_s,
                            "node": args.nodes - 1,
                        },
                    ),
                )
                trainer.start()
            if not args.skip_defaults or not args.skip_training:
                swarm = Swarm(root / "default", PoolSection(), args.redial_s)
                swarms.append(swarm)
                swarm.grow(args.nodes)
                swarm.settle(min(args.nodes - 1, 4), args.settle_s)
            params = 0
            if trainer is not None:  # its model is built and warm: it no longer loads the CPU
                _, params = conn.recv()
            if not args.skip_defaults:
                sustained.append(
                    bench_sustained(
                        swarm,
                        args.default_seconds,
                        texts,
                        f"window {args.window}, default 2/s burst 64",
                        args.drain_max_s,
                        args.inflight,
                        args.window,
                    )
                )
            report_sustained(sustained)
            report_bytes([base, full], sustained)
            if trainer is not None:
                # d. the last node leaves; the training node takes its place
                swarm.nodes.pop().close()
                conn.send(("bootstrap", swarm.bootstrap()))
                _, peer_id = conn.recv()
                swarm.add_peer(peer_id)
                start = time.monotonic()
                while True:
                    conn.send(("peers",))
                    if conn.recv()[1] >= 1 and time.monotonic() - start > args.settle_s:
                        break
                    swarm.drain_for(0.2, None)
                rows = bench_training(
                    swarm,
                    conn,
                    args.train_seconds,
                    args.train_groups,
                    args.train_every_s,
                    texts,
                )
                report_training(
                    rows,
                    params,
                    args.train_sequences,
                    args.train_groups,
                    args.train_every_s,
                    len(swarm.nodes),
                )
    finally:
        if conn is not None and trainer is not None:
            with contextlib.suppress(OSError):
                conn.send(("stop",))
        if trainer is not None:
            trainer.join(15)
            if trainer.is_alive():
                trainer.kill()
                trainer.join(5)
        for s in swarms:
            s.close()
        sys.stderr.flush()
        os.dup2(saved_stderr, 2)
        log.close()
    print(f"total {time.perf_counter() - began:.0f} s; load average {load()}")


if __name__ == "__main__":
    main()
