"""How a node's network load grows with the swarm: the curve, its fit, its extrapolation.

For each swarm size N (``--nodes 4,8,16,24``), a fresh swarm of N lightweight members on
127.0.0.1: real :class:`sapo_node.net.process.Libp2pTransport` network processes
(py-libp2p GossipSub, DHT, default limits, mDNS off) without models, held by this one
process, each publishing valid wire groups (``scripts/support/messages.py``: 8 completions,
about 2.4 KB) at a node's pace: ``--groups`` g at once every ``--round-s`` R seconds,
the members' rounds spread evenly over R. Node i bootstraps to node 0 and node i-1; the
DHT finds the rest. After the meshes settle, ``--seconds`` of publishing are measured:

- per node: CPU seconds per second of its network process (user + system, psutil),
  pubsub bytes in and out per second (RPC bytes its network process counted), fresh
  groups received per second and per round (R seconds), and copies: bytes in per group
  received over the message size (how many times each group's bytes arrived);
- the whole machine's busy fraction over the window (these machines have 2 cores: a
  swarm whose network processes want more than that falls behind, and says so here).

``--arms single,sharded`` measures each size twice, interleaved: one topic (S = 1, the
baseline), then shards (``--shards S``, or S = N·k/m with ``--shard-members m``).

Then it fits each per-node figure, per arm, as a + b·N (least squares over the points) and
extrapolates to ``--extrapolate`` sizes, scaling the publish rate to ``--model-groups``
g' every ``--model-round-s`` R' (each figure's N-dependent part is proportional to the
swarm's groups per second). With ``--shards S --shards-joined k`` every member joins k of
S shard topics (docs/scale.md); ``--late`` starts one more member after the measurement,
bootstrapped to node 0 only, and reports how long it took to mesh on each of its shards
and to receive a group on each.

All members share this machine's cores: compare figures within one run (the 8-node
point is the baseline). The network processes log to ``--log``; the last line printed is
the run's figures as JSON.

Usage: python scripts/bench_scale.py [--nodes 4,8,16,24] [--seconds 40] [--groups 1]
       [--round-s 15] [--arms single,sharded] [--shard-members 8] [--shards-joined 2]
       [--late]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sapo_node.config import NetSection, PoolSection  # noqa: E402
from sapo_node.net import NetError  # noqa: E402
from sapo_node.net.process import Libp2pTransport  # noqa: E402
from scripts.support.loopback import loopback_net  # noqa: E402
from scripts.support.measure import load  # noqa: E402
from scripts.support.messages import completions, group_bytes  # noqa: E402
from scripts.support.procs import stderr_to  # noqa: E402
from scripts.support.swarm_load import POLL_S, Ledger, Swarm, paced_publisher  # noqa: E402


class ScaleSwarm(Swarm):
    """N transports in this process, node i bootstrapped to node 0 and node i-1; its own
    start-up and settling, the benchmark swarm's ``poll`` and ``close``
    (scripts/support/swarm_load.py)."""

    def __init__(self, root: Path, args: argparse.Namespace, shards: int) -> None:
        self.root, self.args, self.shards = root, args, shards
        self.nodes: list[Libp2pTransport] = []
        self.index: dict[str, int] = {}
        self.lock = threading.Lock()

    def net(self, bootstrap: list[str]) -> NetSection:
        extra: dict[str, Any] = {}
        if self.shards > 1:
            extra = {"shards": self.shards, "shards_joined": self.args.shards_joined}
        return loopback_net(
            "scale",
            bootstrap,
            redial_s=self.args.redial_s,
            mesh_degree=self.args.mesh_degree,
            **extra,
        )

    def add(self, bootstrap: list[str], name: str | None = None) -> Libp2pTransport:
        name = name or f"node-{len(self.nodes)}"
        t = Libp2pTransport(
            self.net(bootstrap), PoolSection(), self.root / name, start_timeout_s=180.0
        )
        with self.lock:
            self.index[t.peer_id] = len(self.nodes)
            self.nodes.append(t)
        return t

    def grow(self, total: int, at_once: int = 4) -> None:
        """Start members ``at_once`` at a time (a start is mostly imports), each
        bootstrapped to node 0 and to the last one started before its batch."""
        if not self.nodes:
            self.add([])
        while len(self.nodes) < total:
            boot = list(dict.fromkeys(n.addrs[0] for n in self.nodes[:1] + self.nodes[-1:]))
            batch = min(at_once, total - len(self.nodes))
            names = [f"node-{len(self.nodes)}-{i}" for i in range(batch)]
            with ThreadPoolExecutor(batch) as pool:
                list(pool.map(lambda name, b=boot: self.add(b, name), names))

    def meshed(self, t: Libp2pTransport, want: int) -> bool:
        meshes = t.child_stats.get("meshes") or [t.child_stats.get("mesh", 0)]
        return min(int(m) for m in meshes) >= want

    def settle(self, want: int, timeout_s: float) -> float:
        """Wait until every node's mesh (on each of its topics) holds ``want`` peers, or
        ``timeout_s``; returns the seconds waited."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if all(self.meshed(t, want) for t in self.nodes):
                break
            self.poll(None)
            time.sleep(0.2)
        return time.monotonic() - start


def cpu(pid: int) -> float:
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return float("nan")
    return times.user + times.system


def start_publishers(
    swarm: ScaleSwarm, args: argparse.Namespace, ledger: Ledger, stop: threading.Event
) -> list[threading.Thread]:
    """Every member publishing ``args.groups`` groups every ``args.round_s``, the members'
    rounds spread over it, until ``stop``."""
    n = len(swarm.nodes)
    texts = [completions(random.Random(i)) for i in range(n)]
    threads = [
        threading.Thread(
            target=paced_publisher,
            args=(ledger, t, i, texts[i], args.groups, args.round_s, args.round_s * i / n, stop),
            daemon=True,
        )
        for i, t in enumerate(swarm.nodes)
    ]
    for th in threads:
        th.start()
    return threads


def measure(swarm: ScaleSwarm, args: argparse.Namespace) -> dict[str, Any]:
    n = len(swarm.nodes)
    size = len(group_bytes(completions(random.Random(0)), 0, 10**6, int(time.time() * 1000)))
    ledger = Ledger()
    stop = threading.Event()
    pids = [t._proc.pid for t in swarm.nodes]
    # warm: discovery's first passes (DHT announcements, dials) are over
    t_warm = time.monotonic()
    while time.monotonic() - t_warm < args.warm_seconds:
        swarm.poll(None)
        time.sleep(0.05)
    # idle: what the network processes cost with nothing published
    idle0 = [cpu(p) for p in pids]
    t_idle = time.monotonic()
    while time.monotonic() - t_idle < args.idle_seconds:
        swarm.poll(None)
        time.sleep(0.05)
    idle_wall = time.monotonic() - t_idle
    stats0 = [dict(t.child_stats) for t in swarm.nodes]
    cpu0 = [cpu(p) for p in pids]
    me0 = cpu(os.getpid())
    psutil.cpu_percent()
    start = time.monotonic()
    threads = start_publishers(swarm, args, ledger, stop)
    while time.monotonic() - start < args.seconds:
        swarm.poll(ledger)
        time.sleep(POLL_S)
    wall = time.monotonic() - start
    cpu1 = [cpu(p) for p in pids]
    me1 = cpu(os.getpid())
    busy = psutil.cpu_percent() / 100
    stats1 = [dict(t.child_stats) for t in swarm.nodes]
    stop.set()
    for th in threads:
        th.join(5)
    received = [0] * n
    for times in ledger.got.values():
        for r in times:
            received[r] += 1
    # delivery: of the others' groups published 3 s or more before the end on a topic
    # the node joined, the share it received (the last ones may still be on their way).
    # A member publishes its groups on its shards in turn (net/pubsub.py), so the author's
    # seq-th group went to shard shards[seq % k].
    t_end = time.time()
    with ledger.lock:
        old = [key for key, t in ledger.sent.items() if t_end - t >= 3.0]
    delivered = [0] * n
    due = [0] * n
    joined = [set(t.shards) for t in swarm.nodes]
    for author, seq in old:
        times = ledger.got.get((author, seq), {})
        home = swarm.nodes[author].shards
        shard = home[seq % len(home)]
        for r in range(n):
            if r != author and shard in joined[r]:
                due[r] += 1
                delivered[r] += r in times
    per_node = []
    for i in range(n):
        b_in = stats1[i].get("bytes_in", 0) - stats0[i].get("bytes_in", 0)
        b_out = stats1[i].get("bytes_out", 0) - stats0[i].get("bytes_out", 0)
        per_node.append(
            {
                "cpu": (cpu1[i] - cpu0[i]) / wall,
                "idle_cpu": (cpu0[i] - idle0[i]) / max(idle_wall, 1e-9),
                "bytes_in_s": b_in / wall,
                "bytes_out_s": b_out / wall,
                "groups_s": received[i] / wall,
                "copies": b_in / size / max(1, received[i]),
                "delivery": delivered[i] / max(1, due[i]),
                "mesh": stats1[i].get("meshes") or [stats1[i].get("mesh", 0)],
                "peers": stats1[i].get("peers", 0),
                "connected": stats1[i].get("connected", 0),
            }
        )
    published = len(ledger.sent)
    # age on arrival: receipt (the transport's stamp) minus publish, every copy delivered
    with ledger.lock:
        sent = dict(ledger.sent)
    ages = sorted(at - sent[key] for key, times in ledger.got.items() for at in times.values())
    return {
        "age_p50_ms": 1000 * ages[len(ages) // 2] if ages else None,
        "age_p95_ms": 1000 * ages[int(0.95 * (len(ages) - 1))] if ages else None,
        "nodes": n,
        "wall_s": wall,
        "message_bytes": size,
        "published": published,
        "swarm_groups_s": published / wall,
        "machine_busy": busy,
        "bench_cpu": (me1 - me0) / wall,
        "duplicates": ledger.duplicates,
        "per_node": per_node,
    }


def late_joiner(swarm: ScaleSwarm, args: argparse.Namespace, timeout_s: float) -> dict[str, Any]:
    """One more member, bootstrapped to node 0 only: seconds until it meshes on each of
    its topics, and until it has received a group (its members go on publishing)."""
    ledger = Ledger()
    stop = threading.Event()
    threads = start_publishers(swarm, args, ledger, stop)
    start = time.monotonic()
    try:
        t = swarm.add([swarm.nodes[0].addrs[0]])
    except NetError as exc:  # a machine too loaded to start one more in time
        stop.set()
        return {"error": str(exc)}
    up = time.monotonic() - start
    meshed_s = got_s = None
    me = len(swarm.nodes) - 1
    while time.monotonic() - start < timeout_s and (meshed_s is None or got_s is None):
        swarm.poll(ledger)
        if meshed_s is None and swarm.meshed(t, 1):
            meshed_s = time.monotonic() - start
        if got_s is None and any(me in times for times in ledger.got.values()):
            got_s = time.monotonic() - start
        time.sleep(0.05)
    stop.set()
    for th in threads:
        th.join(5)
    return {
        "started_s": up,
        "meshed_s": meshed_s,
        "first_group_s": got_s,
        "shards": t.child_stats.get("shards"),
        "mesh": t.child_stats.get("meshes") or [t.child_stats.get("mesh", 0)],
        "connected": t.child_stats.get("connected", 0),
    }


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares a + b·x."""
    mx, my = statistics.mean(xs), statistics.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - b * mx, b


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="4,8,16,24", help="swarm sizes, comma-separated")
    parser.add_argument("--seconds", type=float, default=40.0, help="measured, per size")
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="idle, before it")
    parser.add_argument(
        "--warm-seconds", type=float, default=20.0, help="after the meshes settle, before idle"
    )
    parser.add_argument("--groups", type=int, default=1, help="g: groups a member publishes")
    parser.add_argument("--round-s", type=float, default=15.0, help="R: every R seconds")
    parser.add_argument("--arms", default="single", help="single (S = 1), sharded, or both")
    parser.add_argument("--shards", type=int, default=1, help="S shard topics of the sharded arm")
    parser.add_argument("--shards-joined", type=int, default=1, help="k shards a member joins")
    parser.add_argument(
        "--shard-members",
        type=int,
        default=0,
        help="m: S = round(N·k/m) at each size (the organiser's rule); 0: --shards",
    )
    parser.add_argument("--mesh-degree", type=int, default=6)
    parser.add_argument("--redial-s", type=float, default=10.0, help="as a node's default")
    parser.add_argument("--settle-s", type=float, default=40.0, help="most to wait for meshes")
    parser.add_argument("--late", action="store_true", help="a late joiner after the last size")
    parser.add_argument("--external", type=int, default=2, help="J, for the fill check")
    parser.add_argument("--model-groups", type=int, default=4, help="g' of the extrapolation")
    parser.add_argument("--model-round-s", type=float, default=15.0, help="R' of it")
    parser.add_argument("--extrapolate", default="1000,10000")
    parser.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "bench_scale.log")
    args = parser.parse_args()
    return args


def run_point(n: int, arm: str, args: argparse.Namespace, last: bool) -> dict[str, Any]:
    """One swarm of ``n`` members in ``arm``: grown, settled, measured and reported; with
    ``--late``, after the last sharded size, a late joiner too (``point["late"]``)."""
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        shards = 1
        if arm == "sharded":
            shards = args.shards
            if args.shard_members:  # the organiser's rule: S = N·k/m
                shards = max(1, round(n * args.shards_joined / args.shard_members))
        swarm = ScaleSwarm(Path(tmp), args, shards)
        try:
            t0 = time.monotonic()
            swarm.grow(n)
            members = n * min(args.shards_joined, shards) / shards  # per shard
            want = max(1, min(int(members) - 1, args.mesh_degree * 2 // 3))
            settled = swarm.settle(want, args.settle_s)
            point = measure(swarm, args)
            point["settle_s"] = settled
            point["shards"] = shards
            point["arm"] = arm
            point["banned"] = sum(len(t.child_stats.get("banned", ())) for t in swarm.nodes)
            point["up_s"] = time.monotonic() - t0 - args.seconds
            report_point(point, args)
            if args.late and last and arm == "sharded":
                late = late_joiner(swarm, args, 60.0)
                print(f"   late joiner: {json.dumps(late)}", flush=True)
                return point | {"late": late}
            return point
        finally:
            swarm.close()


def main() -> None:
    args = parse_args()
    sizes = [int(x) for x in args.nodes.split(",")]
    began = time.monotonic()
    points: list[dict[str, Any]] = []
    late: dict[str, Any] | None = None
    with stderr_to(args.log):
        from sapo_node.logs import configure_logging

        configure_logging(models=False)  # members only: no model here
        print(
            f"sizes {sizes}; each member publishes {args.groups} groups every "
            f"{args.round_s:g} s; shards S={args.shards}, joined k={args.shards_joined}; mesh "
            f"degree {args.mesh_degree}; {args.seconds:g} s a size; load average {load()}",
            flush=True,
        )
        # each size in each arm, the arms interleaved: one topic (S = 1, the baseline),
        # then shards (S from --shards, or N·k/m with --shard-members)
        for n, arm in [(n, arm) for n in sizes for arm in args.arms.split(",")]:
            point = run_point(n, arm, args, last=n == sizes[-1])
            late = point.pop("late", late)
            points.append(point)
    model = {}
    for arm in args.arms.split(","):
        print(f"{arm}:")
        model[arm] = report_model([p for p in points if p["arm"] == arm], args)
    print(f"total {time.monotonic() - began:.0f} s; load average {load()}")
    print(json.dumps({"args": vars(args) | {"log": str(args.log)}, "points": points,
                      "late": late, "model": model}, default=str))  # fmt: skip


def summary(point: dict[str, Any], key: str) -> tuple[float, float, float]:
    values = [p[key] for p in point["per_node"]]
    return statistics.mean(values), min(values), max(values)


def report_point(p: dict[str, Any], args: argparse.Namespace) -> None:
    cpu_m, _, cpu_max = summary(p, "cpu")
    idle_m, _, _ = summary(p, "idle_cpu")
    bin_m, _, _ = summary(p, "bytes_in_s")
    bout_m, _, bout_max = summary(p, "bytes_out_s")
    g_m, g_min, _ = summary(p, "groups_s")
    heard = [x["copies"] for x in p["per_node"] if x["groups_s"] > 0]
    copies = statistics.mean(heard) if heard else 0.0  # nobody heard anyone: 0
    deliv_m, deliv_min, _ = summary(p, "delivery")
    meshes = [min(x["mesh"]) for x in p["per_node"]]
    conn_m, conn_min, conn_max = summary(p, "connected")
    print(
        f"{p['arm']} N={p['nodes']:3d}, S={p['shards']}: network CPU {cpu_m:.4f} cores/node "
        f"(max {cpu_max:.4f}, idle "
        f"{idle_m:.4f}); "
        f"in {bin_m / 1e3:.1f} kB/s, out {bout_m / 1e3:.1f} kB/s (max {bout_max / 1e3:.1f}); "
        f"groups {g_m:.3f}/s/node (min {g_min:.3f}; {g_min * args.round_s:.1f} a round, J="
        f"{args.external}); delivery {deliv_m:.3f} (min {deliv_min:.3f}); "
        f"copies {copies:.2f}; swarm {p['swarm_groups_s']:.2f} groups/s; "
        f"mesh min {min(meshes)}; connected {conn_m:.1f} ({conn_min:.0f}-{conn_max:.0f}); "
        f"machine {100 * p['machine_busy']:.0f}% busy; "
        f"bench {p['bench_cpu']:.2f} cores; settled {p['settle_s']:.1f} s; "
        f"duplicates {p['duplicates']}; bans {p['banned']}; age on arrival p50 "
        f"{p['age_p50_ms'] or 0:.0f} ms, p95 {p['age_p95_ms'] or 0:.0f} ms",
        flush=True,
    )


def report_model(points: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Fit per-node figures as a + b·N; extrapolate at the model's publish rate."""
    if len(points) < 2:
        return {}
    xs = [float(p["nodes"]) for p in points]
    scale = (args.model_groups / args.model_round_s) / (args.groups / args.round_s)
    out: dict[str, Any] = {"rate_scale": scale}
    print(
        f"fit per node = a + b·N over N={[int(x) for x in xs]}; extrapolated with each member "
        f"publishing {args.model_groups} every {args.model_round_s:g} s (b x {scale:g})"
    )
    for key, unit in (("cpu", "cores"), ("bytes_in_s", "B/s"), ("bytes_out_s", "B/s"),
                      ("groups_s", "groups/s")):  # fmt: skip
        ys = [summary(p, key)[0] for p in points]
        a, b = fit(xs, ys)
        out[key] = {"a": a, "b": b}
        extra = []
        for size in (int(x) for x in args.extrapolate.split(",")):
            value = a + b * scale * size
            out[key][str(size)] = value
            extra.append(f"N={size}: {value:.4g} {unit}")
        print(f"   {key}: a={a:.4g}, b={b:.4g} {unit}/node; " + "; ".join(extra))
    # The same, per group a node receives: figure = a + c·G, G its fresh groups/s (the
    # N-dependent part of its load is what it receives, verifies and relays).
    gs = [summary(p, "groups_s")[0] for p in points]
    print("   per group received: figure = a + c·G, G = a node's fresh groups/s")
    for key, unit in (("cpu", "core-s"), ("bytes_in_s", "B"), ("bytes_out_s", "B")):
        ys = [summary(p, key)[0] for p in points]
        a, c = fit(gs, ys)
        out[f"{key}_per_group"] = {"a": a, "c": c}
        extra = []
        for size in (int(x) for x in args.extrapolate.split(",")):
            g = (size - 1) * args.model_groups / args.model_round_s
            value = a + c * g
            out[f"{key}_per_group"][str(size)] = value
            extra.append(f"N={size} (G={g:.0f}/s): {value:.4g}")
        print(f"   {key}: a={a:.4g}, c={c:.4g} {unit}/group; " + "; ".join(extra))
    return out


if __name__ == "__main__":
    main()
