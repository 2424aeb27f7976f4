"""Libp2p transports on loopback for the transport tests: a ``Swarm`` of one test's
transports and hostile peers, stopped together, and the waits the tests read.

Every node listens on 127.0.0.1 only, mDNS off (scripts/support/loopback.py), in a swarm
of its test's own. The hostile peer is ``tests/support/rogue.py``, written straight
against py-libp2p; the tests' ``swarm`` fixture (tests/integration/conftest.py) stops
every process a test started.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sapo_node.config import NetSection, PoolSection
from sapo_node.net import Received
from sapo_node.net.process import Libp2pTransport
from scripts.support.loopback import loopback_net

REPO = Path(__file__).resolve().parents[2]
VALID = REPO / "protocol" / "vectors" / "valid"
INVALID = REPO / "protocol" / "vectors" / "invalid"
MINIMAL = (VALID / "minimal.msgpack").read_bytes()
UNICODE = (VALID / "unicode.msgpack").read_bytes()
CUSTOM = (VALID / "custom_family.msgpack").read_bytes()
BIGGEST = (VALID / "size_limit.msgpack").read_bytes()  # 512 KiB, the largest valid message
TRUNCATED = (INVALID / "malformed_truncated.msgpack").read_bytes()


# Deadlines, not delays: generous, for a loaded machine; each wait ends as soon as it can.
MESH_S = 30.0  # a mesh forms 1-3 s after connecting (1 s heartbeat)
MSG_S = 20.0  # a message arrives in well under a second


def wait_until(pred: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.1)


class Swarm:
    """Transports and rogue peers of one test, all stopped by :meth:`close`."""

    def __init__(self, root: Path, name: str) -> None:
        self.root = root
        self.name = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:40] or "test"
        self.transports: list[Libp2pTransport] = []
        self.rogues: list[subprocess.Popen] = []
        self.got: dict[int, list[Received]] = {}
        self.refusals: dict[int, dict[str, int]] = {}

    def net(self, bootstrap: list[str] = (), port: int = 0, **fields: object) -> NetSection:
        return loopback_net(self.name, bootstrap, port=port, **fields)

    def start(
        self,
        name: str,
        *,
        to: Libp2pTransport | list[Libp2pTransport] | None = None,
        port: int = 0,
        pool: PoolSection | None = None,
        kind: type[Libp2pTransport] = Libp2pTransport,
        **net: object,
    ) -> Libp2pTransport:
        peers = [] if to is None else to if isinstance(to, list) else [to]
        bootstrap = [p.addrs[0] for p in peers]
        section = self.net(bootstrap, port, **net)
        t = kind(section, pool or PoolSection(), self.root / name)
        self.transports.append(t)
        return t

    def rogue(
        self, mode: str, target: Libp2pTransport, *args: str, at: str | None = None
    ) -> tuple[Path, int]:
        """A rogue peer aimed at ``target`` (on its topic, dialling ``at`` instead if
        given); its output goes to a file, read by tests."""
        log = self.root / f"rogue-{len(self.rogues)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.rogue", mode, at or target.addrs[0]]
                + [target.topic, *args],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.rogues.append(proc)
        return log, len(self.rogues) - 1

    def ipfs_peer(self, *args: str) -> Path:
        """A peer of IPFS's names only (``tests/support/ipfs_peer.py``); its output goes
        to a file, read by tests."""
        log = self.root / f"ipfs-{len(self.rogues)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.ipfs_peer", *args],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.rogues.append(proc)
        return log

    def messages(self, t: Libp2pTransport) -> list[Received]:
        """Everything ``t`` received so far (drains its inbox into a running list)."""
        got = self.got.setdefault(id(t), [])
        got.extend(t.received())
        return got

    def data_from(self, t: Libp2pTransport, author: Libp2pTransport) -> list[bytes]:
        return [m.data for m in self.messages(t) if m.author == author.peer_id]

    def close(self) -> None:
        for proc in self.rogues:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        for t in self.transports:
            try:
                t.close()
            finally:
                if t._proc is not None and t._proc.poll() is None:
                    t._proc.kill()
                    t._proc.wait(10)


def meshed(*transports: Libp2pTransport, peers: int = 1) -> Callable[[], bool]:
    return lambda: all(int(t.child_stats.get("mesh", 0)) >= peers for t in transports)


def alive(t: Libp2pTransport) -> bool:
    return t._proc is not None and t._proc.poll() is None and t.stats().restarts == 0


def rogue_said(log: Path, word: str) -> Callable[[], bool]:
    return lambda: word in log.read_text(errors="replace")


def rogue_line(log: Path, word: str) -> str:
    """What the rogue peer printed after ``word`` (its peer id, its address)."""
    wait_until(rogue_said(log, f"{word} "), 60, f"the rogue peer says its {word}")
    return re.search(rf"^{word} (\S+)", log.read_text(), re.M).group(1)


def ban_and_drop_a_rogue(swarm: Swarm, victim: Libp2pTransport, honest: int) -> str:
    """A meshsub 1.2 rogue peer joins ``victim``'s mesh, sends invalid messages until it is
    banned, then dies (SIGKILL); returns its peer id once ``victim`` is connected to its
    ``honest`` peers only."""
    args = ["--protocol", "/meshsub/1.2.0", "--count", "10", "--interval", "0.2"]
    log, n = swarm.rogue("invalid", victim, *args, "--linger", "60")
    rogue_id = rogue_line(log, "peer_id")
    wait_until(
        lambda: rogue_id in victim.child_stats.get("banned", []),
        60,
        f"the rogue peer banned; its log:\n{log.read_text()}",
    )
    swarm.rogues[n].kill()
    swarm.rogues[n].wait(10)
    wait_until(
        lambda: victim.child_stats.get("connected") == honest,
        30,
        "the victim connected to its honest peers only",
    )
    return rogue_id
