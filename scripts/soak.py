"""A churn soak: N real nodes on loopback, one killed with SIGKILL and restarted every K s.

Every node is a real ``sapo-node start`` process (the tiny model of the tests, libp2p on
127.0.0.1 only, no mDNS), with its own data directory and port, bootstrapped to all the
others. Once every node has run its first round, the soak's clock starts: every
``--kill-every`` seconds one node, chosen at random (``--seed``) among
those that have run enough rounds since they last started to have saved a checkpoint
(the kill waits until one has), is killed with SIGKILL and started
again on the same data directory and port, so it must resume from its checkpoint. At the
end every node is stopped with SIGTERM and the soak reports, on stdout and in
OUT/report.json:

- survivor crashes: node processes that ended without the soak killing them (each is
  started again, so that the soak goes on), and nodes that did not exit 0 on SIGTERM;
- RSS: each node's process tree (the node and its network process), sampled every
  ``--sample-every`` s; samples taken less than ``--settle`` s after the process's
  first round, or in the first ``--warmup`` s of the run, are left out; growth is the
  median of the rest in the last tenth of the run after the warm-up against their
  median in its first tenth (from the node's first sample left in);
- groups: published per node (its metrics.jsonl, read as the run goes, so that rounds
  a restart cuts from the file are still counted), and received from it by each of the
  others (their pools' per-author counts: accepted, and refused by reason);
- restarts: whether each one resumed (its ``resumed`` log line, at a round no earlier
  than the last checkpoint the killed process logged, and its first round after the
  restart is that round);
- refusals by reason: in the pools (the intake) and in the network processes (wire
  checks, their ``message refused`` log lines);
- bans: how often each node was banned by another (``peer banned`` log lines);
- nodes left unable to publish: no group of it accepted by any other node in the last
  tenth (groups made faster than the receivers' rate are dropped by design, counted as
  ``net/unsent`` in metrics.jsonl, and are not that).

Exit status 0 when every target holds (0 survivor crashes, RSS growth at most
``--max-rss-growth`` %, every restart resumed, no node left unable to publish, every
node exits 0 when stopped), 1 when one fails, 2 on bad arguments. Every process it
starts ends with it: they run in their own process groups, which are killed on the way
out (Ctrl-C, SIGTERM, an error), and they die with it if it is killed (PDEATHSIG).

Usage: python scripts/soak.py --nodes 4 --kill-every 60 --duration 3600 --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sapo_node.metrics import upgrade  # noqa: E402
from sapo_node.net import identity  # noqa: E402
from sapo_node.pool import PoolError, summary  # noqa: E402
from tests.support.swarm import free_port  # noqa: E402
from tests.support.tiny import build_tiny_model  # noqa: E402

# The tests' tiny node (tests/support/swarm.py), with longer completions (--tokens) so
# that a round takes seconds rather than 70 ms: the node's own groups (2 to 4 a round)
# then stay within the 2 groups/s per author that peers accept.
CONFIG = """
[node]
checkpoint_every = {checkpoint_every}
threads = 1
[model]
name = "{model}"
[generation]
completions_per_task = 8
max_new_tokens = {tokens}
[tasks]
one_shot = false
system_prompt = "Reply."
reward = "partial"
[[tasks.families]]
name = "tests.support.families:Sevens"
[train]
local_groups = 2
external_groups = 2
[pool]
sampling = "uniform"
[net]
swarm = "{swarm}"
redial_s = 1.0
"""
CHECKPOINT_EVERY = 5
STARTUP_S = 300.0  # the longest the soak waits for every node's first round
FIRST_ROUND_GRACE_S = 120.0  # at the end, how long a process started last may take
LAST_ROUNDS = 5  # "its last rounds": the peers it had then, in the report
POOL_EVERY_S = 30.0  # how often the pools' per-author counts are read
STOP_TIMEOUT_S = 60.0
_PR_SET_PDEATHSIG = 1


def _child_setup(niceness: int) -> None:
    """In the child before exec: lower its priority (the machine may be shared), and
    SIGKILL it when the soak dies (Linux)."""
    os.nice(niceness)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _events(path: Path) -> list[dict]:
    """The JSON log lines of one process (other lines, e.g. a traceback, are skipped)."""
    out = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
    return out


def _tail(path: Path, n: int = 15) -> list[str]:
    with contextlib.suppress(FileNotFoundError):
        return path.read_text(errors="replace").splitlines()[-n:]
    return []


@dataclass
class Life:
    """One process of a node, from its start to its end."""

    index: int
    pid: int
    started: float  # soak clock (s since the soak began)
    log: Path
    after: str  # "first start", "kill", "crash"
    ended: float | None = None
    killed: bool = False
    orphans: int = 0  # its processes still there 20 s after it was SIGKILLed
    returncode: int | None = None
    first_round: int | None = None  # the first metrics round this process wrote
    first_round_at: float | None = None


@dataclass
class Node:
    name: str
    root: Path
    config: Path
    env: dict[str, str]
    niceness: int
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    lives: list[Life] = field(default_factory=list)
    records: dict[tuple[int, float], dict] = field(default_factory=dict)  # (round, time)
    rss: list[tuple[float, float, float, int]] = field(default_factory=list)
    pool_counts: list[tuple[float, dict[str, dict[str, int]]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.data_dir = self.root / self.name
        self.peer_id = identity.peer_id(identity.load_or_create(self.data_dir))

    @property
    def addr(self) -> str:
        return f"/ip4/127.0.0.1/tcp/{self.port}/p2p/{self.peer_id}"

    @property
    def life(self) -> Life:
        return self.lives[-1]

    def start(self, peers: list[Node], now: float, after: str) -> None:
        log = self.data_dir / f"node.{len(self.lives)}.log"
        bootstrap = [a for p in peers if p is not self for a in ("--bootstrap", p.addr)]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sapo_node.cli", "start", "--config", str(self.config)]
                + ["--data-dir", str(self.data_dir), "--json-logs"]
                + ["--listen", f"/ip4/127.0.0.1/tcp/{self.port}", *bootstrap],
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, killed as one at the end
                preexec_fn=lambda: _child_setup(self.niceness),
            )
        self.lives.append(Life(len(self.lives), self.proc.pid, now, log, after))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def group(self) -> list[psutil.Process]:
        """The node's process and its descendants (its network process)."""
        try:
            main = psutil.Process(self.proc.pid)
            return [main, *main.children(recursive=True)]
        except psutil.Error:
            return []

    def kill(self, now: float) -> None:
        """SIGKILL the node's own process (as the OOM killer would), wait until its
        network process has gone by itself (its stdin closes), then clear the group."""
        procs = self.group()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        _, alive = psutil.wait_procs(procs[1:], timeout=20)
        self.life.orphans = len(alive)  # its network process should exit by itself
        self._killpg(signal.SIGKILL)
        self.life.killed, self.life.ended, self.life.returncode = True, now, self.proc.returncode

    def _killpg(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def read_metrics(self) -> None:
        path = self.data_dir / "metrics.jsonl"
        with contextlib.suppress(FileNotFoundError):
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    r = upgrade(json.loads(line))
                    self.records.setdefault((r["round"], r["time"]), r)

    def sample(self, now: float) -> None:
        procs = self.group()
        try:
            mains = procs[0].memory_info().rss if procs else 0
            kids = sum(p.memory_info().rss for p in procs[1:])
        except psutil.Error:
            return
        if mains:
            self.rss.append((round(now, 1), mains / 2**20, kids / 2**20, self.life.index))

    def read_pool(self, now: float) -> None:
        with contextlib.suppress(PoolError):
            self.pool_counts.append((now, summary(self.data_dir / "pool.sqlite3")["peers"]))


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = args.out
        self.rng = random.Random(args.seed)
        self.t0 = time.monotonic()
        self.kills: list[dict] = []
        self.crashes: list[dict] = []
        self.stop_codes: dict[str, int | None] = {}
        self.ran_s = self.startup_s = 0.0
        self.nodes: list[Node] = []

    def now(self) -> float:
        return time.monotonic() - self.t0

    def setup(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        model = build_tiny_model(self.out / "model")
        config = self.out / "node.toml"
        swarm = f"soak-{self.args.seed}"
        config.write_text(
            CONFIG.format(
                model=model, checkpoint_every=CHECKPOINT_EVERY, tokens=self.args.tokens, swarm=swarm
            )
        )
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "SAPO_NET__ENABLED": "true",
            "SAPO_NET__MDNS": "false",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        root = self.out / "nodes"
        self.nodes = [
            Node(f"n{i}", root, config, env, self.args.nice) for i in range(self.args.nodes)
        ]

    def run(self) -> None:
        a = self.args
        self.t0 = time.monotonic()
        for n in self.nodes:
            n.start(self.nodes, self.now(), "first start")
        # the soak's clock starts once every node has run a round (or after STARTUP_S)
        while self.now() < STARTUP_S and any(n.life.first_round is None for n in self.nodes):
            self._tick(self.now())
            if not all(n.alive() for n in self.nodes):
                break  # counted as a crash in the loop below
            time.sleep(1.0)
        self.startup_s = self.now()
        self.t0 += self.startup_s
        for n in self.nodes:
            n.rss.clear()
            for life in n.lives:
                life.started -= self.startup_s
                if life.first_round_at is not None:
                    life.first_round_at -= self.startup_s
        next_kill, next_sample, next_pool = a.kill_every, 0.0, 0.0
        while (t := self.now()) < a.duration:
            for n in self.nodes:
                if not n.alive():
                    self._crashed(n, t)
            if t >= next_sample:
                self._tick(t)
                next_sample += a.sample_every
            if t >= next_pool:
                for n in self.nodes:
                    n.read_pool(t)
                next_pool += POOL_EVERY_S
            if t >= next_kill and self._churn(t):
                next_kill += a.kill_every
            time.sleep(0.2)
        # a process started last must run a round before the end, or its resume is unproven
        grace = a.duration + FIRST_ROUND_GRACE_S
        while self.now() < grace and any(n.life.first_round is None for n in self.nodes):
            self._tick(self.now())
            time.sleep(1.0)

    def _tick(self, t: float) -> None:
        for n in self.nodes:
            n.read_metrics()
            self._note_first_round(n)
            n.sample(t)

    def _note_first_round(self, n: Node) -> None:
        life = n.life
        if life.first_round is not None:
            return
        start = time.time() - (self.now() - life.started)  # wall clock at its start
        fresh = [r for r in n.records.values() if r["time"] >= start]
        if fresh:
            first = min(fresh, key=lambda r: r["time"])
            life.first_round = first["round"]
            life.first_round_at = self.now() - (time.time() - first["time"])

    def _saved_since_start(self, n: Node) -> bool:
        """Whether the node's process has run enough rounds to have saved a checkpoint."""
        life = n.life
        if life.first_round is None:
            return False
        rounds = [r["round"] for r in n.records.values()]
        return max(rounds) >= life.first_round + CHECKPOINT_EVERY

    def _crashed(self, n: Node, t: float) -> None:
        life = n.life
        life.ended, life.returncode = t, n.proc.returncode
        crash = {"node": n.name, "t": round(t, 1), "returncode": n.proc.returncode}
        crash["log_tail"] = _tail(life.log)
        self.crashes.append(crash)
        print(
            f"[soak] {t:7.0f} s  {n.name} CRASHED (exit {n.proc.returncode}); restarting",
            flush=True,
        )
        n.start(self.nodes, t, "crash")

    def _churn(self, t: float) -> bool:
        """Kill a random node among those with a checkpoint of this process to resume
        from, and start it again; False (to try again shortly) if none has one yet."""
        ready = [n for n in self.nodes if n.alive() and self._saved_since_start(n)]
        if not ready:
            return False
        victim = self.rng.choice(ready)
        rounds = [r["round"] for r in victim.records.values()]
        print(f"[soak] {t:7.0f} s  SIGKILL {victim.name} (last round {max(rounds)})", flush=True)
        victim.kill(t)
        self.kills.append({"node": victim.name, "t": round(t, 1), "life": victim.life.index})
        victim.start(self.nodes, self.now(), "kill")
        return True

    def stop(self) -> None:
        """SIGTERM all (each saves and exits 0), then SIGKILL whatever is left."""
        t = self.now()
        for n in self.nodes:
            if n.alive():
                n.proc.send_signal(signal.SIGTERM)
        for n in self.nodes:
            if n.proc is None:
                continue
            try:
                n.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                n.proc.kill()
                n.proc.wait(10)
            self.stop_codes[n.name] = n.proc.returncode
            if n.life.ended is None:
                n.life.ended, n.life.returncode = t, n.proc.returncode
        self.cleanup()
        for n in self.nodes:
            n.read_metrics()
            n.read_pool(self.now())
        self.ran_s = self.now()

    def cleanup(self) -> None:
        for n in self.nodes:
            if n.proc is not None:
                n._killpg(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    n.proc.wait(10)

    # --- the report -----------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The raw figures, from which ``--report-only`` makes the report again."""
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(self.args).items()}
        return {
            "settings": settings,
            "ran_s": self.ran_s,
            "startup_s": self.startup_s,
            "kills": self.kills,
            "crashes": self.crashes,
            "stop_codes": self.stop_codes,
            "nodes": {
                n.name: {
                    "port": n.port,
                    "lives": [vars(life) | {"log": str(life.log)} for life in n.lives],
                    "records": list(n.records.values()),
                    "rss": n.rss,
                    "pool_counts": n.pool_counts,
                }
                for n in self.nodes
            },
        }

    def load(self) -> None:
        st = json.loads((self.out / "state.json").read_text())
        self.kills, self.crashes, self.stop_codes = st["kills"], st["crashes"], st["stop_codes"]
        self.ran_s, self.startup_s = st["ran_s"], st.get("startup_s", 0.0)
        given = {"out", "report_only", "settle", "max_rss_growth"}  # may differ this time
        if self.args.warmup is not None:
            given.add("warmup")
        for k, v in st["settings"].items():
            if k not in given:
                setattr(self.args, k, v)
        for name, v in st["nodes"].items():
            n = Node(name, self.out / "nodes", self.out / "node.toml", {}, 0, v["port"])
            n.lives = [Life(**(life | {"log": Path(life["log"])})) for life in v["lives"]]
            n.records = {(r["round"], r["time"]): r for r in v["records"]}
            n.rss = [tuple(x) for x in v["rss"]]
            n.pool_counts = [tuple(x) for x in v["pool_counts"]]
            self.nodes.append(n)

    def report(self) -> dict[str, Any]:
        a = self.args
        by_peer = {n.peer_id: n.name for n in self.nodes}
        tenth = max((a.duration - a.warmup) / 10, 3 * a.sample_every)
        nodes: dict[str, Any] = {}
        pool_refusals: Counter[str] = Counter()
        received_from: dict[str, Counter[str]] = {n.name: Counter() for n in self.nodes}
        recent_from: dict[str, int] = dict.fromkeys(by_peer.values(), 0)
        for n in self.nodes:
            final = n.pool_counts[-1][1] if n.pool_counts else {}
            before = _counts_at(n.pool_counts, a.duration - tenth)
            for author, counts in final.items():
                name = by_peer.get(author, author[:16])
                for outcome, k in counts.items():
                    if outcome != "held":
                        received_from.setdefault(name, Counter())[outcome] += k
                    if outcome not in ("held", "accepted"):
                        pool_refusals[outcome] += k
                if name in recent_from:
                    old = before.get(author, {})
                    recent_from[name] += counts.get("accepted", 0) - old.get("accepted", 0)
        net_refusals: Counter[str] = Counter()
        bans: dict[str, list[dict]] = {n.name: [] for n in self.nodes}  # of each node
        for n in self.nodes:
            for life in n.lives:
                for e in _events(life.log):
                    if e.get("event") == "message refused":
                        net_refusals[e.get("reason", "?")] += 1
                    elif e.get("event") == "peer banned for invalid messages":
                        banned = by_peer.get(e.get("peer"), str(e.get("peer"))[:16])
                        ban = {"by": n.name, "at": e.get("timestamp"), "s": e.get("seconds")}
                        bans.setdefault(banned, []).append(ban)
        restarts = self._restarts()
        for n in self.nodes:
            recs = sorted(n.records.values(), key=lambda r: (r["time"], r["round"]))
            settled = [s for s in n.rss if s[0] >= a.warmup and self._settled(n.lives[s[3]], s[0])]
            t_first, t_last = (settled[0][0], settled[-1][0]) if settled else (0, 0)
            first = [s[1] + s[2] for s in settled if s[0] < t_first + tenth]
            last = [s[1] + s[2] for s in settled if s[0] > t_last - tenth]
            rss: dict[str, Any] = {
                "first_mb": round(statistics.median(first), 1) if first else None,
                "last_mb": round(statistics.median(last), 1) if last else None,
                "peak_mb": round(max((s[1] + s[2] for s in n.rss), default=0), 1),
            }
            rss["growth_pct"] = (
                round(100 * (rss["last_mb"] - rss["first_mb"]) / rss["first_mb"], 2)
                if first and last
                else None
            )
            rss["samples"] = [[s[0], round(s[1], 1), round(s[2], 1), s[3]] for s in n.rss]
            tail = recs[-LAST_ROUNDS:]
            published = sum(r["net/published"] for r in recs)
            got = received_from.get(n.name, Counter())
            # Unable to publish: nothing of it reached the others lately. Unsent groups
            # alone are not that: a node that makes groups faster than the receivers' rate
            # limit (tiny models, short completions) fills its queue and drops the excess
            # by design (net/unsent), while the others still get its groups at the rate.
            problems = []
            if len(self.nodes) > 1 and recent_from.get(n.name, 0) == 0:
                problems.append("no other node accepted a group of it in the last tenth")
            nodes[n.name] = {
                "peer_id": n.peer_id,
                "port": n.port,
                "processes": len(n.lives),
                "killed": sum(life.killed for life in n.lives),
                "last_round": max((r["round"] for r in recs), default=None),
                "rounds_run": len(recs),
                "groups_published": published,
                "groups_unsent": sum(r["net/unsent"] for r in recs),
                "groups_received": sum(r["net/received"] for r in recs),
                "groups_accepted": sum(r["net/accepted"] for r in recs),
                "received_by_others": dict(got),
                "accepted_by_others_last_tenth": recent_from.get(n.name, 0),
                "delivery_ratio": round(sum(got.values()) / (published * (len(self.nodes) - 1)), 3)
                if published and len(self.nodes) > 1
                else None,
                "peers_last_rounds": [r["net/peers"] for r in tail],
                "banned_by_others": bans.get(n.name, []),
                "unable_to_publish": problems,
                "stop_exit_code": self.stop_codes.get(n.name),
                "data_dir_mb": round(
                    sum(p.stat().st_size for p in n.data_dir.rglob("*") if p.is_file()) / 2**20,
                    2,
                ),
                "rss": rss,
            }
        growth = {k: v["rss"]["growth_pct"] for k, v in nodes.items()}
        unmeasured = [k for k, g in growth.items() if g is None]
        bad_growth = {k: g for k, g in growth.items() if g is not None and g > a.max_rss_growth}
        not_resumed = [r for r in restarts if not r["resumed"]]
        stuck = {k: v["unable_to_publish"] for k, v in nodes.items() if v["unable_to_publish"]}
        unclean = {k: c for k, c in self.stop_codes.items() if c != 0}
        targets = {
            "no_survivor_crash": _target(not self.crashes, f"{len(self.crashes)} crash(es)"),
            "rss_growth": _target(
                not bad_growth and not unmeasured,
                f"growth % {growth} (max {a.max_rss_growth})"
                + (f"; not measured: {unmeasured}" if unmeasured else ""),
            ),
            "every_restart_resumed": _target(
                bool(restarts) and not not_resumed,
                f"{len(restarts) - len(not_resumed)} of {len(restarts)} resumed",
            ),
            "every_node_publishes": _target(not stuck, json.dumps(stuck) if stuck else "all do"),
            "clean_stop": _target(not unclean, f"exit codes on SIGTERM {self.stop_codes}"),
        }
        return {
            "command": [sys.executable, *sys.argv],
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
            "startup_s": round(self.startup_s, 1),
            "ran_s": round(self.ran_s, 1),
            "cpu_count": os.cpu_count(),
            "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
            "ok": all(t["ok"] for t in targets.values()),
            "targets": targets,
            "survivor_crashes": self.crashes,
            "kills": len(self.kills),
            "restarts": restarts,
            "refusals": {"pool": dict(pool_refusals), "network": dict(net_refusals)},
            "bans": {k: len(v) for k, v in bans.items()},
            "nodes": nodes,
        }

    def _settled(self, life: Life, t: float) -> bool:
        """Whether a sample at ``t`` is ``--settle`` s past the process's first round."""
        return life.first_round_at is not None and t - life.first_round_at >= self.args.settle

    def _restarts(self) -> list[dict]:
        """Per kill: the checkpoint the killed process last logged, the round the next one
        resumed at, and the first round it ran."""
        out = []
        names = {n.name: n for n in self.nodes}
        for k in self.kills:
            n = names[k["node"]]
            saved = [
                e["round"]
                for life in n.lives[: k["life"] + 1]
                for e in _events(life.log)
                if e.get("event") == "checkpoint saved"
            ]
            nxt = n.lives[k["life"] + 1]
            resumed = [e["round"] for e in _events(nxt.log) if e.get("event") == "resumed"]
            r = {
                "node": n.name,
                "t": k["t"],
                "last_checkpoint_logged": max(saved, default=None),
                "orphans_after_kill": n.lives[k["life"]].orphans,
                "resumed_round": resumed[0] if resumed else None,
                "first_round_after": nxt.first_round,
                "seconds_to_first_round": round(nxt.first_round_at - nxt.started, 1)
                if nxt.first_round_at is not None
                else None,
            }
            r["resumed"] = (
                r["resumed_round"] is not None
                and r["resumed_round"] >= (r["last_checkpoint_logged"] or 0)
                and r["first_round_after"] == r["resumed_round"]
            )
            out.append(r)
        return out


def _counts_at(history: list[tuple[float, dict]], t: float) -> dict:
    """The last pool counts read before ``t`` (empty if none)."""
    before = [c for when, c in history if when <= t]
    return before[-1] if before else {}


def _target(ok: bool, detail: str) -> dict[str, Any]:
    return {"ok": bool(ok), "detail": detail}


def print_report(rep: dict[str, Any]) -> None:
    print(f"\nsoak: {rep['settings']['nodes']} nodes, {rep['ran_s']:.0f} s, {rep['kills']} kills")
    print(
        f"{'node':5} {'procs':>5} {'rounds':>6} {'pub':>6} {'unsent':>6} {'got':>6} "
        f"{'by others':>9} {'ratio':>5} {'rss first':>9} {'last':>7} {'growth':>7} {'exit':>4}"
    )
    for name, v in rep["nodes"].items():
        rss = v["rss"]
        print(
            f"{name:5} {v['processes']:5} {v['rounds_run']:6} {v['groups_published']:6} "
            f"{v['groups_unsent']:6} {v['groups_received']:6} "
            f"{sum(v['received_by_others'].values()):9} {v['delivery_ratio'] or 0:5.2f} "
            f"{rss['first_mb'] or 0:9.1f} {rss['last_mb'] or 0:7.1f} "
            f"{rss['growth_pct'] if rss['growth_pct'] is not None else 'n/a':>7} "
            f"{v['stop_exit_code']!s:>4}"
        )
    resumed = sum(r["resumed"] for r in rep["restarts"])
    print(f"restarts resumed: {resumed} of {len(rep['restarts'])}")
    print(f"refusals: pool {rep['refusals']['pool']}, network {rep['refusals']['network']}")
    print(f"bans of each node by the others (not a target): {rep['bans']}")
    for name, t in rep["targets"].items():
        print(f"  {'ok  ' if t['ok'] else 'FAIL'} {name}: {t['detail']}")
    print("all targets met" if rep["ok"] else "TARGETS MISSED")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--kill-every", type=float, default=60.0, help="seconds between kills")
    p.add_argument("--duration", type=float, default=3600.0, help="seconds")
    p.add_argument("--out", type=Path, required=True, help="directory for data and report")
    p.add_argument("--seed", type=int, default=0, help="which nodes are killed")
    p.add_argument("--warmup", type=float, help="seconds left out of RSS (default: 10%%)")
    p.add_argument(
        "--settle", type=float, default=30.0, help="RSS: seconds after a process's first round"
    )
    p.add_argument("--sample-every", type=float, default=5.0, help="RSS sampling, seconds")
    p.add_argument("--tokens", type=int, default=192, help="max_new_tokens of the nodes")
    p.add_argument("--nice", type=int, default=10, help="niceness of the nodes")
    p.add_argument("--report-only", action="store_true", help="report again from OUT/state.json")
    p.add_argument("--max-rss-growth", type=float, default=5.0, help="target, in %%")
    a = p.parse_args(argv)
    a.out = a.out.resolve()
    if a.nodes < 2:
        p.error("--nodes must be at least 2")
    if a.kill_every <= 0 or a.duration <= a.kill_every:
        p.error("--kill-every must be positive and below --duration")
    if a.warmup is None and not a.report_only:
        a.warmup = a.duration / 10
    if a.warmup is not None and not 0 <= a.warmup < a.duration:
        p.error("--warmup must be below --duration")
    return a


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    soak = Soak(args)
    if args.report_only:
        soak.load()
    else:
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            soak.setup()
            soak.run()
            soak.stop()
        except KeyboardInterrupt:
            print("[soak] interrupted: the nodes are killed", file=sys.stderr)
            return 130
        finally:
            soak.cleanup()
        (args.out / "state.json").write_text(json.dumps(soak.state()))
    rep = soak.report()
    (args.out / "report.json").write_text(json.dumps(rep, indent=1))
    print_report(rep)
    print(f"report: {args.out / 'report.json'}")
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
