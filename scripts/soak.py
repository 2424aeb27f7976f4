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

- children: how long each child of a SIGKILLed node (its network process) outlived it;
- groups accounted for: at each receiver, the accepted groups that left its pool
  neither aged out (``expired``) nor evicted nor still held, against the peers' groups
  its rounds trained on (metrics.jsonl);
- the stop: every other node gets the final SIGTERM on its whole process group (as
  ``timeout`` and some supervisors send it: the network process gets it too), the
  rest on the node's process alone; each must exit 0, its children gone within 5 s,
  with no "network process died" line.

Harder runs, each an option (issue 33):

- ``--partition-at S --partition-for S``: the nodes run in two network namespaces of
  the soak's own, half in each, joined by one link (198.18.10.1 and .2, nothing outside
  them is touched). At S s the link is cut (nftables answers the other half with TCP
  resets, as after a router's reboot), and healed S s later. Checked: no group crosses
  the halves during the cut, groups cross again within ``--heal-within`` s of the heal
  (the time is reported per node), no network process restarts and no node bans
  another over it. Needs root (or ``unshare -rn``), ``ip`` and ``nft``.
- ``--skewed-peer SECONDS``: the last node's wall clock runs that far ahead (or behind,
  if negative): scripts/clock_skew.c, built with ``cc`` and preloaded, moves its wall
  clock only (monotonic clocks, sleeps and timers stay true; why not libfaketime:
  there). Checked: within the receivers' tolerance (SPEC.md, the clock rule) every
  other node accepts its groups; beyond it, they refuse them all (``from_the_future``
  or ``too_old``).
- ``--rogue-peer``: tests/support/rogue.py's ``persist`` peer publishes invalid messages
  to every node until they ban it, is then killed and started again with the same key,
  and the next kill goes to a node that banned it. Checked: while each ban lasts, after
  the rogue's restart and after the banning node's restart, no message of the rogue is
  refused there again and it is not banned again (its messages no longer get in).

Exit status 0 when every target holds (0 survivor crashes, RSS growth at most
``--max-rss-growth`` %, every restart resumed, no node left unable to publish, no child
outliving its node by more than 5 s, every group accounted for, a clean stop, and those
of the options given), 1 when one fails, 2 on bad arguments. Every process it starts
ends with it: they run in their own process groups, which are killed on the way out
(Ctrl-C, SIGTERM, an error), and they die with it if it is killed (PDEATHSIG); the
namespaces have no name and go with their processes, so a killed run leaves none.

Usage: python scripts/soak.py --nodes 4 --kill-every 60 --duration 3600 --out DIR
       [--partition-at 240 --partition-for 300] [--skewed-peer 120] [--rogue-peer]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sapo_node.config import PoolSection  # noqa: E402
from sapo_node.intake import wire  # noqa: E402
from sapo_node.intake.pool import PoolError, summary  # noqa: E402
from sapo_node.metrics import upgrade  # noqa: E402
from sapo_node.net import identity  # noqa: E402
from tests.support.mdns_pair import lo_up  # noqa: E402
from tests.support.nat_swarm import Netns  # noqa: E402
from tests.support.partition import RESET  # noqa: E402
from tests.support.swarm import free_port  # noqa: E402
from tests.support.tiny import build_tiny_model  # noqa: E402

# The tests' tiny node (tests/support/swarm.py), with longer completions (--tokens) so
# that a round takes seconds rather than 70 ms: the node's own groups (2 to 4 a round)
# then stay within the 2 groups/s per author that peers accept. No poisoning defences:
# the tiny model's random completions fail their checks, and honest nodes distrusted
# each other within a minute (they are measured in docs/security.md, not here).
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
external_groups = {external_groups}
[pool]
sampling = "uniform"
[defence]
enabled = false
[net]
swarm = "{swarm}"
redial_s = 1.0
"""
CHECKPOINT_EVERY = 5
EXTERNAL_GROUPS = 2
STARTUP_S = 300.0  # the longest the soak waits for every node's first round
FIRST_ROUND_GRACE_S = 120.0  # at the end, how long a process started last may take
LAST_ROUNDS = 5  # "its last rounds": the peers it had then, in the report
POOL_EVERY_S = 30.0  # how often the pools' per-author counts are read
STOP_TIMEOUT_S = 60.0
BANNED = "peer banned for invalid messages"
NET_RESTART = "network process died; restarting it"
CHILD_WAIT_S = 20.0  # how long the soak waits for a killed node's children to end
MAX_OUTLIVE_S = 5.0  # target: a child ends at most this long after its node
NOT_ARRIVALS = {"held", "expired", "evicted_quota", "evicted_full"}  # pool counts, not arrivals
CHECKS = "completions_"  # pool counts of the poisoning checks, per completion, not per group
CUT_GRACE_S = 20.0  # groups on their way when the link is cut may land this long after
HEAL_POLL_S = 2.0
ROGUE_INTERVAL_S = 1.0  # one invalid message a second
ROGUE_RESTART_AFTER_S = 60.0  # after its first ban (or once every live node banned it)
ROGUE_DOWN_S = 5.0
ROGUE_CHECK_S = 120.0  # a banning node is killed only with at least this much ban left
ROGUE_MIN_LINES = 6  # a window shows the ban held with 30 s of the rogue up (a line each 5 s)
CLOCK_SKEW_C = REPO / "scripts" / "clock_skew.c"  # --skewed-peer's wall clock (why: there)
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


def _wall(event: dict) -> float | None:
    """A JSON log line's timestamp, in seconds since the epoch (by its writer's clock)."""
    with contextlib.suppress(KeyError, TypeError, ValueError):
        return datetime.fromisoformat(event["timestamp"]).timestamp()
    return None


class Halves:
    """The network of ``--partition-at``: two network namespaces of the soak's own, "left"
    and "right", made fresh and joined by one veth link (left0 198.18.10.1/24, right0
    198.18.10.2/24). They have no name and nothing in the soak's own namespace, so the
    kernel removes them, with the link and any nftables table in them, once the soak's
    descriptors and the processes in them are gone, however it ends (killed, its nodes
    die with it: PDEATHSIG). No run can leave one behind for the next to clean up.

    :meth:`cut` adds in each a table that answers the other half with TCP resets (the
    ``reset`` cut of tests/support/partition.py); :meth:`heal` deletes both."""

    IPS = {"left": "198.18.10.1", "right": "198.18.10.2"}

    def __init__(self) -> None:
        self.ns = Netns(list(self.IPS))
        for side in self.IPS:
            with self.ns.inside(side):
                lo_up()
        self.ns.link("left", "left0", "198.18.10.1/24", "right", "right0", "198.18.10.2/24")

    def inside(self, side: str | None) -> contextlib.AbstractContextManager[None]:
        return self.ns.inside(side)

    def cut(self) -> None:
        for side, other in (("left", "right"), ("right", "left")):
            self.ns.run(side, "nft", "-f", "-", stdin=RESET.format(other=self.IPS[other]))

    def heal(self) -> None:
        for side in self.IPS:
            self.ns.run(side, "nft", "delete", "table", "inet", "cut")

    def close(self) -> None:
        for fd in [*self.ns.fds.values(), self.ns.home]:
            os.close(fd)


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
    orphans: int = 0  # its processes still there CHILD_WAIT_S after it was SIGKILLed
    outlived_s: float | None = None  # how long its last child outlived a SIGKILL
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
    side: str | None = None  # its network namespace (--partition-at); None: the soak's
    skew: float = 0.0  # how far its clock is ahead (--skewed-peer)
    halves: Halves | None = None
    proc: subprocess.Popen | None = None
    lives: list[Life] = field(default_factory=list)
    records: dict[tuple[int, float], dict] = field(default_factory=dict)  # (round, time)
    rss: list[tuple[float, float, float, int]] = field(default_factory=list)
    pool_counts: list[tuple[float, dict[str, dict[str, int]]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.data_dir = self.root / self.name
        self.peer_id = identity.peer_id_of(self.data_dir)

    @property
    def ip(self) -> str:
        return Halves.IPS[self.side] if self.side else "127.0.0.1"

    @property
    def addr(self) -> str:
        return f"/ip4/{self.ip}/tcp/{self.port}/p2p/{self.peer_id}"

    @property
    def life(self) -> Life:
        return self.lives[-1]

    def start(self, peers: list[Node], now: float, after: str) -> None:
        log = self.data_dir / f"node.{len(self.lives)}.log"
        bootstrap = [a for p in peers if p is not self for a in ("--bootstrap", p.addr)]
        where = self.halves.inside(self.side) if self.halves else contextlib.nullcontext()
        with log.open("wb") as out, where:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sapo_node.cli", "start", "--config", str(self.config)]
                + ["--data-dir", str(self.data_dir), "--json-logs"]
                + ["--listen", f"/ip4/{self.ip}/tcp/{self.port}", *bootstrap],
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
        """SIGKILL the node's own process (as the OOM killer would), time how long its
        children outlive it (its network process exits by itself: its stdin closes),
        then clear the group."""
        procs = self.group()
        killed = time.monotonic()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        ends = [0.0]
        _, alive = psutil.wait_procs(
            procs[1:], CHILD_WAIT_S, callback=lambda _: ends.append(time.monotonic() - killed)
        )
        self.life.orphans = len(alive)
        self.life.outlived_s = round(time.monotonic() - killed if alive else max(ends), 1)
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


@dataclass
class Rogue:
    """``--rogue-peer``: tests/support/rogue.py's ``persist`` peer, with its key in its own
    directory, so that it comes back as itself when started again."""

    root: Path
    env: dict[str, str]
    niceness: int
    halves: Halves | None = None
    proc: subprocess.Popen | None = None
    lives: list[dict[str, Any]] = field(default_factory=list)  # started, ended, log

    def __post_init__(self) -> None:
        self.data_dir = self.root / "rogue"
        self.peer_id = identity.peer_id_of(self.data_dir)

    def start(self, nodes: list[Node], topic: str, now: float) -> None:
        log = self.data_dir / f"rogue.{len(self.lives)}.log"
        dial = [a for n in nodes[1:] for a in ("--dial", n.addr)]
        where = self.halves.inside("left") if self.halves else contextlib.nullcontext()
        with log.open("wb") as out, where:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.rogue", "persist", nodes[0].addr, topic]
                + ["--key-dir", str(self.data_dir), "--interval", str(ROGUE_INTERVAL_S), *dial],
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: _child_setup(self.niceness),
            )
        self.lives.append({"started": now, "ended": None, "log": str(log)})

    def kill(self, now: float) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            self.lives[-1]["ended"] = now

    def status(self) -> list[dict]:
        """Its status lines (wall clock ``time``, ``connected``, ``streams``, ``sent``)."""
        return [e for life in self.lives for e in _events(Path(life["log"])) if "sent" in e]


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
        self.wall0 = 0.0  # time.time() at the soak clock's 0
        self.nodes: list[Node] = []
        self.halves: Halves | None = None
        self.rogue: Rogue | None = None
        self.rogue_restart_at = 0.0
        self.heal_poll_at = 0.0
        self.partition: dict[str, Any] = {}
        self.stop_how: dict[str, str] = {}  # node -> "group" or "process"
        self.stop_children: dict[str, int] = {}  # its processes left MAX_OUTLIVE_S after

    def now(self) -> float:
        return time.monotonic() - self.t0

    def setup(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        model = build_tiny_model(self.out / "model")
        config = self.out / "node.toml"
        self.swarm = f"soak-{self.args.seed}"
        config.write_text(
            CONFIG.format(
                model=model,
                checkpoint_every=CHECKPOINT_EVERY,
                external_groups=EXTERNAL_GROUPS,
                tokens=self.args.tokens,
                swarm=self.swarm,
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
        a = self.args
        if a.partition_at is not None:
            self.halves = Halves()
        self.nodes = []
        for i in range(a.nodes):
            side = ("left" if i < a.nodes // 2 else "right") if self.halves else None
            skew = a.skewed_peer if a.skewed_peer and i == a.nodes - 1 else 0.0
            node_env = env
            if skew:  # its wall clock only: the monotonic ones, sleeps and timers stay true
                lib = self.out / "clock_skew.so"
                subprocess.run(
                    [a.cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(CLOCK_SKEW_C), "-ldl"],
                    check=True,
                )
                node_env = {
                    **env,
                    "LD_PRELOAD": " ".join(filter(None, [str(lib), env.get("LD_PRELOAD")])),
                    "SOAK_CLOCK_SKEW_S": str(skew),
                }
            self.nodes.append(
                Node(
                    f"n{i}",
                    root,
                    config,
                    node_env,
                    a.nice,
                    side=side,
                    skew=skew,
                    halves=self.halves,
                )
            )
        if a.rogue_peer:
            self.rogue = Rogue(self.out, env, a.nice, self.halves)

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
        self.wall0 = time.time()
        for n in self.nodes:
            n.rss.clear()
            for life in n.lives:
                life.started -= self.startup_s
                if life.first_round_at is not None:
                    life.first_round_at -= self.startup_s
        if self.rogue:
            self.rogue.start(self.nodes, wire.topic(self.swarm), 0.0)
        next_kill, next_sample, next_pool = a.kill_every, 0.0, 0.0
        while (t := self.now()) < a.duration:
            for n in self.nodes:
                if not n.alive():
                    self._crashed(n, t)
            if self.halves:
                self._partition_step(t)
            if t >= next_sample:
                self._tick(t)
                if self.rogue:
                    self._rogue_step(t)
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
        fresh = [r for r in n.records.values() if r["time"] - n.skew >= start]
        if fresh:
            first = min(fresh, key=lambda r: r["time"])
            life.first_round = first["round"]
            life.first_round_at = self.now() - (time.time() - (first["time"] - n.skew))

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
        banning = self._banning_to_kill(t)
        victim = self.rng.choice([n for n in ready if n.name in banning] or ready)
        rounds = [r["round"] for r in victim.records.values()]
        print(f"[soak] {t:7.0f} s  SIGKILL {victim.name} (last round {max(rounds)})", flush=True)
        victim.kill(t)
        victim.read_metrics()  # the rounds a resume will cut from its file
        self.kills.append({"node": victim.name, "t": round(t, 1), "life": victim.life.index})
        victim.start(self.nodes, self.now(), "kill")
        return True

    def _partition_step(self, t: float) -> None:
        """Cut the link at --partition-at; from CUT_GRACE_S later until the heal, count
        the groups that still cross; heal it --partition-for s after the cut, then time
        until each node takes in a group from the other half again."""
        a, p = self.args, self.partition
        if "cut_at" not in p:
            if t >= a.partition_at:
                self.halves.cut()
                p["cut_at"] = round(t, 1)
                print(f"[soak] {t:7.0f} s  partition: the link is cut", flush=True)
        elif "during" not in p:
            if t >= p["cut_at"] + CUT_GRACE_S:
                p["during"] = self._across()
        elif "healed_at" not in p:
            if t >= a.partition_at + a.partition_for:
                now = self._across()
                p["crossed_while_cut"] = {
                    k: v - p["during"][k] for k, v in now.items() if k in p["during"]
                }
                self.halves.heal()
                p["healed_at"], p["at_heal"], p["heal_s"] = round(t, 1), now, {}
                print(f"[soak] {t:7.0f} s  partition: the link is back", flush=True)
        elif self.heal_poll_at <= t < p["healed_at"] + a.heal_within:
            self.heal_poll_at = t + HEAL_POLL_S
            for name, k in self._across().items():
                if name not in p["heal_s"] and k > p["at_heal"].get(name, k):
                    p["heal_s"][name] = round(t - p["healed_at"], 1)

    def _across(self) -> dict[str, int]:
        """Per node (whose pool can be read now): the groups it has taken in so far,
        accepted or refused, from the nodes in the other half."""
        side = {n.peer_id: n.side for n in self.nodes}
        out = {}
        for n in self.nodes:
            with contextlib.suppress(PoolError):
                peers = summary(n.data_dir / "pool.sqlite3")["peers"]
                out[n.name] = sum(
                    k
                    for author, counts in peers.items()
                    if side.get(author, n.side) != n.side
                    for outcome, k in counts.items()
                    if outcome not in NOT_ARRIVALS and not outcome.startswith(CHECKS)
                )
        return out

    def _at(self, n: Node, event: dict) -> float | None:
        """When a node logged ``event``, on the soak's clock (its own clock's skew out)."""
        wall = _wall(event)
        return None if wall is None else round(wall - n.skew - self.wall0, 1)

    def _rogue_bans(self) -> dict[str, list[tuple[float, float]]]:
        """Per node that banned the rogue: (when, for how many seconds) of each ban."""
        out: dict[str, list[tuple[float, float]]] = {}
        for n in self.nodes:
            for life in n.lives:
                for e in _events(life.log):
                    if e.get("event") == BANNED and e.get("peer") == self.rogue.peer_id:
                        ban = (self._at(n, e), float(e.get("seconds", 0.0)))
                        out.setdefault(n.name, []).append(ban)
        return out

    def _rogue_step(self, t: float) -> None:
        """Kill the rogue once every live node has banned it (or ROGUE_RESTART_AFTER_S
        after its first ban), and start it again with the same key ROGUE_DOWN_S later."""
        r = self.rogue
        if len(r.lives) > 1:
            return
        if r.lives[0]["ended"] is None:
            bans = self._rogue_bans()
            first = min((b[0][0] for b in bans.values()), default=None)
            alive = {n.name for n in self.nodes if n.alive()}
            if first is not None and (alive <= set(bans) or t >= first + ROGUE_RESTART_AFTER_S):
                r.kill(t)
                self.rogue_restart_at = t + ROGUE_DOWN_S
                print(f"[soak] {t:7.0f} s  rogue banned by {sorted(bans)}: killed", flush=True)
        elif t >= self.rogue_restart_at:
            r.start(self.nodes, wire.topic(self.swarm), t)
            print(f"[soak] {t:7.0f} s  rogue started again, same key", flush=True)

    def _banning_to_kill(self, t: float) -> set[str]:
        """With --rogue-peer, once the rogue is back: the nodes that ban it with at least
        ROGUE_CHECK_S of their ban left, until one of them has been killed during its
        ban (then none: the churn picks among all)."""
        if self.rogue is None or len(self.rogue.lives) < 2:
            return set()
        names = set()
        for name, bans in self._rogue_bans().items():
            start, seconds = bans[0]
            if any(k["node"] == name and start < k["t"] < start + seconds for k in self.kills):
                return set()
            if t < start + seconds - ROGUE_CHECK_S:
                names.add(name)
        return names

    def stop(self) -> None:
        """SIGTERM every node, each to save and exit 0: every other one (n0, n2, ...) on
        its whole process group, its network process included (as ``timeout`` and some
        supervisors send it), the rest on the node's own process. Then SIGKILL whatever
        is left, and count the children still there MAX_OUTLIVE_S after each node."""
        t = self.now()
        children = {}
        for i, n in enumerate(self.nodes):
            if n.alive():
                children[n.name] = n.group()[1:]
                self.stop_how[n.name] = "group" if i % 2 == 0 else "process"
                if i % 2 == 0:
                    n._killpg(signal.SIGTERM)
                else:
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
            if n.name in children:
                _, alive = psutil.wait_procs(children[n.name], MAX_OUTLIVE_S)
                self.stop_children[n.name] = len(alive)
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
        if self.rogue is not None:
            self.rogue.kill(self.now())
        if self.halves is not None:  # the last descriptors: the kernel removes them
            self.halves.close()
            self.halves = None

    # --- the report -----------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The raw figures, from which ``--report-only`` makes the report again."""
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(self.args).items()}
        return {
            "settings": settings,
            "ran_s": self.ran_s,
            "startup_s": self.startup_s,
            "wall0": self.wall0,
            "kills": self.kills,
            "crashes": self.crashes,
            "stop_codes": self.stop_codes,
            "stop_how": self.stop_how,
            "stop_children": self.stop_children,
            "partition": self.partition,
            "rogue_lives": self.rogue.lives if self.rogue else None,
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
        self.wall0, self.partition = st.get("wall0", 0.0), st.get("partition", {})
        self.stop_how, self.stop_children = st.get("stop_how", {}), st.get("stop_children", {})
        given = {"out", "report_only", "settle", "max_rss_growth"}  # may differ this time
        if self.args.warmup is not None:
            given.add("warmup")
        for k, v in st["settings"].items():
            if k not in given:
                setattr(self.args, k, v)
        a = self.args
        for i, (name, v) in enumerate(st["nodes"].items()):
            side = ("left" if i < a.nodes // 2 else "right") if a.partition_at is not None else None
            skew = a.skewed_peer if a.skewed_peer and i == a.nodes - 1 else 0.0
            n = Node(name, self.out / "nodes", self.out / "node.toml", {}, 0, v["port"], side, skew)
            n.lives = [Life(**(life | {"log": Path(life["log"])})) for life in v["lives"]]
            n.records = {(r["round"], r["time"]): r for r in v["records"]}
            n.rss = [tuple(x) for x in v["rss"]]
            n.pool_counts = [tuple(x) for x in v["pool_counts"]]
            self.nodes.append(n)
        if st.get("rogue_lives"):
            self.rogue = Rogue(self.out, {}, 0)
            self.rogue.lives = st["rogue_lives"]

    def report(self) -> dict[str, Any]:
        a = self.args
        by_peer = {n.peer_id: n.name for n in self.nodes}
        if self.rogue is not None:
            by_peer[self.rogue.peer_id] = "rogue"
        tenth = max((a.duration - a.warmup) / 10, 3 * a.sample_every)
        nodes: dict[str, Any] = {}
        pool_refusals: Counter[str] = Counter()
        received_from: dict[str, Counter[str]] = {n.name: Counter() for n in self.nodes}
        recent_from: dict[str, int] = {n.name: 0 for n in self.nodes}
        for n in self.nodes:
            final = n.pool_counts[-1][1] if n.pool_counts else {}
            before = _counts_at(n.pool_counts, a.duration - tenth)
            for author, counts in final.items():
                name = by_peer.get(author, author[:16])
                for outcome, k in counts.items():
                    if outcome.startswith(CHECKS):
                        continue
                    if outcome != "held":
                        received_from.setdefault(name, Counter())[outcome] += k
                    if outcome not in ("held", "accepted"):
                        pool_refusals[outcome] += k
                if name in recent_from:
                    old = before.get(author, {})
                    recent_from[name] += counts.get("accepted", 0) - old.get("accepted", 0)
        net_refusals: Counter[str] = Counter()
        bans: dict[str, list[dict]] = {n.name: [] for n in self.nodes}  # of each node
        net_restarts: dict[str, list[float | None]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for life in n.lives:
                for e in _events(life.log):
                    if e.get("event") == "message refused":
                        net_refusals[e.get("reason", "?")] += 1
                    elif e.get("event") == BANNED:
                        banned = by_peer.get(e.get("peer"), str(e.get("peer"))[:16])
                        ban = {"by": n.name, "at": e.get("timestamp"), "s": e.get("seconds")}
                        bans.setdefault(banned, []).append(ban | {"t": self._at(n, e)})
                    elif e.get("event") == NET_RESTART:
                        net_restarts[n.name].append(self._at(n, e))
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
            refused_by_design = n.skew and not _within_tolerance(n.skew)  # its own target
            if len(self.nodes) > 1 and recent_from.get(n.name, 0) == 0 and not refused_by_design:
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
        last_restarts = {
            n.name: k
            for n in self.nodes
            if (k := sum(e.get("event") == NET_RESTART for e in _events(n.life.log)))
        }
        left_at_stop = {k: c for k, c in self.stop_children.items() if c}
        outlived = {f"{r['node']}@{r['t']:.0f}": r["child_outlived_s"] for r in restarts}
        too_long = {k: v for k, v in outlived.items() if v is not None and v > MAX_OUTLIVE_S} | {
            f"{k} at the stop": f"{c} left" for k, c in left_at_stop.items()
        }
        accounts = self._accounting()
        unexplained = {
            k: v["unexplained"]
            for k, v in accounts.items()
            if not 0 <= v["unexplained"] <= v["tolerance"]
        }
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
            "clean_stop": _target(
                not unclean and not last_restarts and len(self.stop_codes) == len(self.nodes),
                f"exit codes on SIGTERM {self.stop_codes}, sent to {self.stop_how}; "
                f"network process restarted in the stopped process: {last_restarts or 'none'}",
            ),
            "children_end_with_their_node": _target(
                not too_long,
                f"at most {max((v for v in outlived.values() if v is not None), default=0)} s "
                f"after a SIGKILL ({len(outlived)} kills), max {MAX_OUTLIVE_S}"
                + (f"; over it: {too_long}" if too_long else "; none left at the stop"),
            ),
            "every_group_accounted_for": _target(
                not unexplained,
                "accepted groups drawn from each pool (neither expired, evicted nor held) "
                "against those its rounds trained on or distrusted, off by "
                f"{ {k: v['unexplained'] for k, v in accounts.items()} } (at most a round "
                "cut short a process: "
                f"{ {k: v['tolerance'] for k, v in accounts.items()} })",
            ),
        }
        extra: dict[str, Any] = {}
        honest_bans = [b | {"of": k} for k, v in bans.items() if k != "rogue" for b in v]
        if a.partition_at is not None:
            extra["partition"], targets["partition_heals"] = self._partition_report(
                honest_bans, net_restarts
            )
        if a.skewed_peer:
            extra["skewed_peer"], targets["skewed_peer"] = self._skew_report()
        if self.rogue is not None:
            extra["rogue"], targets["rogue_ban_holds"] = self._rogue_report()
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
            "network_process_restarts": {k: len(v) for k, v in net_restarts.items()},
            "groups_accounted": accounts,
            **extra,
            "nodes": nodes,
        }

    def _accounting(self) -> dict[str, dict[str, int]]:
        """Per receiver, from its final pool counts: the accepted groups that left the
        pool neither aged out (``expired``) nor evicted, and are not held: the ones its
        rounds drew. Against them, the peers' groups its rounds trained on, or dropped
        as distrusted, in its metrics. A round cut short by a kill or the stop drew its
        groups but wrote no line: at most ``external_groups`` per process."""
        out = {}
        for n in self.nodes:
            total: Counter[str] = Counter()
            for counts in (n.pool_counts[-1][1] if n.pool_counts else {}).values():
                total.update(counts)
            evicted = total["evicted_quota"] + total["evicted_full"]
            drawn = total["accepted"] - total["expired"] - evicted - total["held"]
            trained = sum(
                r.get("groups/external", 0) + r.get("defence/distrusted", 0)
                for r in n.records.values()
            )
            out[n.name] = {
                "accepted": total["accepted"],
                "expired": total["expired"],
                "evicted": evicted,
                "held": total["held"],
                "drawn": drawn,
                "trained_or_distrusted": trained,
                "unexplained": drawn - trained,
                "tolerance": EXTERNAL_GROUPS * len(n.lives),
            }
        return out

    def _partition_report(
        self, honest_bans: list[dict], net_restarts: dict[str, list[float | None]]
    ) -> tuple[dict, dict]:
        a, p = self.args, self.partition
        end = p.get("healed_at", a.duration) + a.heal_within
        window = [p.get("cut_at", a.partition_at), end]
        bans = [b for b in honest_bans if b["t"] is not None and window[0] <= b["t"] <= end]
        restarts = {
            k: [t for t in v if t is not None and window[0] <= t <= end]
            for k, v in net_restarts.items()
        }
        restarts = {k: v for k, v in restarts.items() if v}
        crossed = {k: v for k, v in p.get("crossed_while_cut", {}).items() if v}
        heal_s = p.get("heal_s", {})
        slow = [n.name for n in self.nodes if n.name not in heal_s]
        section = {
            "halves": {n.name: n.side for n in self.nodes},
            "cut_at": p.get("cut_at"),
            "healed_at": p.get("healed_at"),
            "taken_in_across_while_cut": p.get("crossed_while_cut"),
            "seconds_to_take_in_across_after_heal": heal_s,
            "honest_bans_in_window": bans,
            "network_process_restarts_in_window": restarts,
        }
        ok = "healed_at" in p and "during" in p and not crossed and not slow
        target = _target(
            ok and not bans and not restarts,
            f"cut at {p.get('cut_at')} s, healed at {p.get('healed_at')} s; groups across "
            f"while cut: {crossed or 'none'}; each node took in a group from the other half "
            f"again {max(heal_s.values(), default=None)} s after the heal at worst "
            f"(max {a.heal_within})"
            + (f", not: {slow}" if slow else "")
            + f"; bans {len(bans)}, network process restarts {restarts or 0} "
            f"from the cut to {end:.0f} s",
        )
        return section, target

    def _skew_report(self) -> tuple[dict, dict]:
        """How the others took the skewed node's groups: all accepted (no clock refusal)
        within the tolerance, all refused beyond it (SPEC.md, the clock rule)."""
        skew, skewed = self.args.skewed_peer, self.nodes[-1]
        pool = PoolSection()
        within = _within_tolerance(skew)
        at = {
            n.name: (n.pool_counts[-1][1] if n.pool_counts else {}).get(skewed.peer_id, {})
            for n in self.nodes
            if n is not skewed
        }
        accepted = {k: c.get("accepted", 0) for k, c in at.items()}
        future = {k: c.get("from_the_future", 0) for k, c in at.items()}
        too_old = {k: c.get("too_old", 0) for k, c in at.items()}
        if within:
            ok = all(accepted.values()) and not any(future.values())
        else:
            ok = not any(accepted.values()) and (any(future.values()) or any(too_old.values()))
        section = {
            "node": skewed.name,
            "skew_s": skew,
            "tolerance": {"ahead_s": pool.max_clock_skew_s, "behind_s": pool.max_age_s},
            "expected": "accepted" if within else "refused",
            "its_groups_at_the_others": at,
        }
        detail = (
            f"{skewed.name} {skew:+g} s ({'within' if within else 'beyond'} the tolerance: "
            f"{pool.max_clock_skew_s:g} s ahead, {pool.max_age_s:g} s behind); its groups "
            f"accepted {accepted}, from_the_future {future}, too_old {too_old}"
        )
        return section, _target(ok, detail)

    def _rogue_report(self) -> tuple[dict, dict]:
        """Whether each ban of the rogue held through its restart and through the banning
        node's restarts: in each window (from that restart to the ban's end) the node
        refused no message of the rogue again and did not ban it again (a ban that
        held keeps its messages out), while the rogue was up, dialling it."""
        r = self.rogue
        status = [(e["time"] - self.wall0, e) for e in r.status()]
        back = round(r.lives[1]["started"], 1) if len(r.lives) > 1 else None
        per_node, windows = {}, []
        for n in self.nodes:
            events = [(self._at(n, e), e) for life in n.lives for e in _events(life.log)]
            mine = [(t, e) for t, e in events if t is not None]
            bans = [t for t, e in mine if e.get("event") == BANNED and e.get("peer") == r.peer_id]
            if not bans:
                continue
            start = bans[0]
            seconds = next(
                float(e.get("seconds", 0.0))
                for t, e in mine
                if e.get("event") == BANNED and e.get("peer") == r.peer_id
            )
            end = start + seconds
            checks = []
            if back is not None and back < end:
                checks.append(("rogue restarted", back))
            checks += [
                ("node restarted", life.started) for life in n.lives if start < life.started < end
            ]
            for what, since in checks:
                refused = sum(
                    since <= t < end
                    and e.get("event") == "message refused"
                    and e.get("author") == r.peer_id
                    for t, e in mine
                )
                again = sum(since < t < end for t in bans[1:])
                seen = [e for t, e in status if since <= t < end]
                windows.append(
                    {
                        "node": n.name,
                        "after": what,
                        "from": round(since, 1),
                        "to": round(end, 1),
                        "refused_again": refused,
                        "banned_again": again,
                        "rogue_status_lines": len(seen),
                        "rogue_connected_in": sum(n.peer_id in e["connected"] for e in seen),
                        "rogue_had_a_stream_in": sum(n.peer_id in e["streams"] for e in seen),
                    }
                )
            per_node[n.name] = {"bans_at": bans, "first_ban_s": seconds}
        held = [w for w in windows if not w["refused_again"] and not w["banned_again"]]
        covered = {w["after"] for w in windows if w["rogue_status_lines"] >= ROGUE_MIN_LINES}
        ok = (
            bool(per_node)
            and len(held) == len(windows)
            and covered
            == {
                "rogue restarted",
                "node restarted",
            }
        )
        section = {
            "peer_id": r.peer_id,
            "lives": r.lives,
            "bans": per_node,
            "windows": windows,
        }
        detail = (
            f"banned by {sorted(per_node)}; the ban held in {len(held)} of {len(windows)} "
            f"windows (after the rogue's restart at {back} s, after a banning node's "
            f"restart: {sum(w['after'] == 'node restarted' for w in windows)})"
        )
        return section, _target(ok, detail)

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
                "child_outlived_s": n.lives[k["life"]].outlived_s,
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


def _within_tolerance(skew: float) -> bool:
    """Whether peers take the groups of a node whose clock is ``skew`` s ahead (SPEC.md,
    the clock rule, with the default pool settings the soak's nodes run with)."""
    pool = PoolSection()
    return -pool.max_age_s < skew <= pool.max_clock_skew_s


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
    p.add_argument("--partition-at", type=float, help="cut the swarm in two at S s")
    p.add_argument("--partition-for", type=float, help="and heal it S s later")
    p.add_argument(
        "--heal-within",
        type=float,
        default=360.0,
        help="target: seconds for groups to cross again after the heal (default 360: the "
        "longest redial delay, 300 s, and a minute)",
    )
    p.add_argument("--skewed-peer", type=float, help="one node's clock is off by S s (+: ahead)")
    p.add_argument("--rogue-peer", action="store_true", help="a peer that sends invalid messages")
    a = p.parse_args(argv)
    a.out = a.out.resolve()
    if a.nodes < 2:
        p.error("--nodes must be at least 2")
    if a.kill_every <= 0 or a.duration <= a.kill_every:
        p.error("--kill-every must be positive and below --duration")
    if (a.partition_at is None) != (a.partition_for is None):
        p.error("--partition-at and --partition-for go together")
    if a.partition_at is not None and not a.report_only:
        if a.partition_at < 0 or a.partition_for < 2 * CUT_GRACE_S or a.heal_within <= 0:
            p.error(
                f"--partition-at must be 0 or more, --partition-for at least "
                f"{2 * CUT_GRACE_S:g} s, --heal-within positive"
            )
        if a.partition_at + a.partition_for + a.heal_within > a.duration:
            p.error("--partition-at + --partition-for + --heal-within must fit in --duration")
        if os.geteuid() != 0:
            p.error(
                "--partition-at makes network namespaces: run it as root, or under `unshare -rn`"
            )
        missing = [c for c in ("ip", "nft") if shutil.which(c) is None]
        if missing:
            p.error(f"--partition-at needs {missing} (Debian: apt-get install iproute2 nftables)")
    a.cc = shutil.which("cc")
    if a.skewed_peer is not None and not a.report_only:
        if a.skewed_peer == 0:
            p.error("--skewed-peer must not be 0")
        if a.cc is None:
            p.error(
                f"--skewed-peer builds {CLOCK_SKEW_C.name} into the node: it needs a C compiler, "
                "`cc` (Debian: apt-get install gcc)"
            )
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
