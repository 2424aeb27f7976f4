"""The processes of scripts/soak.py: its nodes (one ``Life`` per process a node runs),
the rogue peer of ``--rogue-peer`` and the two network halves of ``--partition-at``;
and the soak's settings that more than one of its parts reads."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from sapo_node.intake.pool import PoolError, summary
from sapo_node.metrics import upgrade
from sapo_node.net import identity
from scripts.support.procs import child_setup, json_events, killpg
from tests.support.mdns_pair import lo_up
from tests.support.nat_swarm import Netns
from tests.support.partition import RESET
from tests.support.swarm import free_port

REPO = Path(__file__).resolve().parents[2]
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
                preexec_fn=lambda: child_setup(self.niceness),
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
        killpg(self.proc.pid, sig)

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
                preexec_fn=lambda: child_setup(self.niceness),
            )
        self.lives.append({"started": now, "ended": None, "log": str(log)})

    def kill(self, now: float) -> None:
        if self.proc is not None and self.proc.poll() is None:
            killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            self.lives[-1]["ended"] = now

    def status(self) -> list[dict]:
        """Its status lines (wall clock ``time``, ``connected``, ``streams``, ``sent``)."""
        return [e for life in self.lives for e in json_events(Path(life["log"])) if "sent" in e]
