"""Case d. of scripts/bench_swarm.py: the network's share of CPU while a node trains. The
training node runs in its own process (``trainer_main``), driven over a pipe by
``TrainingNode``; the rest of the swarm publishes at a round's pace meanwhile."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from sapo_node.config import PoolSection
from sapo_node.net.process import Libp2pTransport
from scripts.support.loopback import loopback_net
from scripts.support.measure import cpu_seconds
from scripts.support.messages import completions, group_bytes
from scripts.support.swarm_load import POLL_S, Ledger, Swarm, paced_publisher


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
    net = loopback_net("bench", msg[1], redial_s=settings["redial_s"])
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
                args=(ledger, t, i, texts[i], burst, every_s, every_s * i / n, stop, 10**6),
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


class TrainingNode:
    """The training node's process (``trainer_main``), started with its settings; it
    builds and warms its model while the caller starts a swarm."""

    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self.conn, self._child_conn = self.ctx.Pipe()
        self.proc: mp.process.BaseProcess | None = None

    def start(self, settings: dict[str, Any]) -> None:
        self.proc = self.ctx.Process(target=trainer_main, args=(self._child_conn, settings))
        self.proc.start()

    def parameters(self) -> int:
        """Its model's size, once built and warm (it no longer loads the CPU then)."""
        if self.proc is None:
            return 0
        _, params = self.conn.recv()
        return params

    def join(self, swarm: Swarm, settle_s: float) -> None:
        """Take the place of the swarm's last node, and wait until it has a swarm peer
        and ``settle_s`` has passed."""
        swarm.nodes.pop().close()
        self.conn.send(("bootstrap", swarm.bootstrap()))
        _, peer_id = self.conn.recv()
        swarm.add_peer(peer_id)
        start = time.monotonic()
        while True:
            self.conn.send(("peers",))
            if self.conn.recv()[1] >= 1 and time.monotonic() - start > settle_s:
                break
            swarm.drain_for(0.2, None)

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(OSError):
            self.conn.send(("stop",))
        self.proc.join(15)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
