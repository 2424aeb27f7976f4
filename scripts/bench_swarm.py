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
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sapo_node.config import PoolSection  # noqa: E402
from scripts.support.measure import load, ms, pct  # noqa: E402
from scripts.support.messages import completions, group_bytes  # noqa: E402
from scripts.support.procs import stderr_to  # noqa: E402
from scripts.support.swarm_load import (  # noqa: E402
    POLL_S,
    Ledger,
    Swarm,
    delta,
    wait_counters,
)
from scripts.support.swarm_training import TrainingNode, bench_training, report_training  # noqa: E402

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


# --- main ---------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
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
    return args


def bench_raised(
    args: argparse.Namespace, root: Path, texts: list[tuple[str, ...]], swarms: list[Swarm]
) -> tuple[list, list[Sustained]]:
    """a. 2 nodes, then the full swarm (the same 2 plus the rest); b. sustained in it, per-
    author limits raised: windowed, then a flood. Returns both latencies and b.'s rows."""
    raised = PoolSection(rate_per_author=args.rate, burst_per_author=args.burst)
    swarm = Swarm(root, raised, args.redial_s)
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
    label = f"{args.rate:g}/s burst {args.burst}"
    sustained = [
        bench_sustained(
            swarm, args.seconds, texts, f"window {args.window}, {label}",
            args.drain_max_s, args.inflight, args.window,
        )
    ]  # fmt: skip
    if args.flood_seconds > 0:
        sustained.append(
            bench_sustained(
                swarm, args.flood_seconds, texts, f"flood, {label}",
                args.flood_drain_s, args.inflight, None,
            )
        )  # fmt: skip
    swarm.close()
    return [base, full], sustained


def trainer_settings(args: argparse.Namespace, root: Path) -> dict:
    return {
        "root": str(root),
        "hidden": args.train_hidden,
        "layers": args.train_layers,
        "sequences": args.train_sequences,
        "redial_s": args.redial_s,
        "node": args.nodes - 1,
    }


def bench_trainer(
    args: argparse.Namespace,
    trainer: TrainingNode,
    swarm: Swarm,
    params: int,
    texts: list[tuple[str, ...]],
) -> None:
    """d. the last node leaves; the training node takes its place, trains and reports."""
    trainer.join(swarm, args.settle_s)
    every_s, groups = args.train_every_s, args.train_groups
    rows = bench_training(swarm, trainer.conn, args.train_seconds, groups, every_s, texts)
    report_training(rows, params, args.train_sequences, groups, every_s, len(swarm.nodes))


def main() -> None:
    args = parse_args()
    began = time.perf_counter()
    texts = [completions(random.Random(i)) for i in range(args.nodes)]
    swarms: list[Swarm] = []
    trainer = TrainingNode()
    with stderr_to(args.log), tempfile.TemporaryDirectory(prefix="bench-swarm-") as tmp:
        from sapo_node.logs import configure_logging

        configure_logging()
        root = Path(tmp)
        try:
            import sapo_node

            print(
                f"{args.nodes} nodes on 127.0.0.1, one network process each; sapo_node from "
                f"{Path(sapo_node.__file__).parent}; load average {load()}; logs in {args.log}",
                flush=True,
            )
            latencies, sustained = bench_raised(args, root / "raised", texts, swarms)
            # the training node's process prepares its model while the second swarm starts
            if not args.skip_training:
                trainer.start(trainer_settings(args, root / "trainer"))
            if not args.skip_defaults or not args.skip_training:
                swarm = Swarm(root / "default", PoolSection(), args.redial_s)
                swarms.append(swarm)
                swarm.grow(args.nodes)
                swarm.settle(min(args.nodes - 1, 4), args.settle_s)
            params = trainer.parameters()
            if not args.skip_defaults:
                label = f"window {args.window}, default 2/s burst 64"
                sustained.append(
                    bench_sustained(
                        swarm, args.default_seconds, texts, label,
                        args.drain_max_s, args.inflight, args.window,
                    )
                )  # fmt: skip
            report_sustained(sustained)
            report_bytes(latencies, sustained)
            if trainer.proc is not None:  # d. the training node takes the last node's place
                bench_trainer(args, trainer, swarm, params, texts)
        finally:
            trainer.stop()
            for s in swarms:
                s.close()
    print(f"total {time.perf_counter() - began:.0f} s; load average {load()}")


if __name__ == "__main__":
    main()
