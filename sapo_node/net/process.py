"""The libp2p transport as the node sees it: a supervised network process.

The libp2p stack (``sapo_node.net.host``) runs in a child process, so that training holds
neither its GIL nor its event loop, and a crash in the network stack costs a restart, not
the model. The node talks to it through bounded queues:

- ``publish`` puts a message on a bounded queue and returns at once: the round loop
  never waits for the network. The child takes the next message only when this node is
  within the per-author rate its peers enforce and every peer's send queue has room
  (backpressure); when the queue is full because the swarm cannot keep up, a message
  is not shared, and that is counted (``publish_dropped``, the metric ``net/unsent``) and
  logged, never silent;
- received messages land in an :class:`~sapo_node.net.Inbox`, bounded per author.

If the child dies it is restarted (with the same identity and the ports it had), with
a growing delay; the round loop never waits for it.

What the child learns about peers that must outlive it (bans, with the wall-clock time
each ends, and score penalties) comes here in its stats; it is kept in
``peers-net.json`` in the data directory (peerstate.py: bounded, expiring, replaced
atomically, saved as it changes) and handed to every child this transport starts, and
to the next run's.

The child ignores SIGINT and SIGTERM, so that a signal sent to the node's whole process
group (Ctrl-C, ``timeout``, a supervisor) does not kill it under the node, which would
restart it instead of stopping; ``close`` stops it with SIGUSR1.
"""

from __future__ import annotations

import contextlib
import math
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import structlog

from sapo_node.config import NetSection, PoolSection
from sapo_node.intake import peerstate, wire
from sapo_node.net import Inbox, NetError, NetStats, Received, count_refusal, identity, ipc

log = structlog.get_logger("sapo_node.net")

_COUNTED = ("received", "rejected", "bytes_in", "bytes_out")
_CURRENT = ("connections_direct", "connections_relayed", "routing_table", "dht_lan_addrs")


class Libp2pTransport:
    """A :class:`~sapo_node.net.Transport` over py-libp2p GossipSub in a child process."""

    def __init__(
        self,
        net: NetSection,
        pool: PoolSection,
        data_dir: Path,
        *,
        json_logs: bool = False,
        start_timeout_s: float = 60.0,
        queue_size: int = 256,
    ) -> None:
        self.peer_id = identity.peer_id_of(data_dir)
        # The shard topics this node joins (docs/scale.md), its home shard's first: with
        # one shard, the swarm's single topic.
        me = identity.id_bytes(self.peer_id)
        self.shards = wire.shards_of(me, net.shards, net.shards_joined)
        self.topics = wire.shard_topics(net.swarm, me, net.shards, net.shards_joined)
        self.topic = self.topics[0]
        # While the swarm changes its shard count: this node's shards of the count before
        # too (SPEC.md section 2.2, changing S)
        topics_before = (
            wire.shard_topics(net.swarm, me, net.shards_before, net.shards_joined)
            if net.shards_before
            else []
        )
        self.settings: dict[str, Any] = {
            "key": str(data_dir / identity.KEY_FILE),
            "topic": wire.topic(net.swarm),  # the swarm's: its DHT key
            "topics": self.topics,
            "topics_before": topics_before,
            "shards": net.shards,
            "shards_joined": net.shards_joined,
            "listen": list(net.listen),
            "announce": list(net.announce),
            "bootstrap": list(net.bootstrap),
            "mdns": net.mdns,
            "dht": net.dht,
            "reachability": net.reachability,
            "lan_ranges": list(net.lan_ranges),
            "upnp": net.upnp,
            "autonat": net.autonat,
            "nameservers": list(net.nameservers),
            "redial_s": net.redial_s,
            "max_peers": net.max_peers,
            "max_connections": net.max_connections,
            "max_inbound_per_ip": net.max_inbound_per_ip,
            "max_inbound_per_net": net.max_inbound_per_net,
            "mesh_degree": net.mesh_degree,
            "relay_reservations": net.relay_reservations,
            "relay_circuits": net.relay_circuits,
            "relay_circuit_mb": net.relay_circuit_mb,
            "rate_per_author": pool.rate_per_author,
            "burst_per_author": pool.burst_per_author,
            "json_logs": json_logs,
        }
        # What the network process knows of peers, kept across its restarts and the node's.
        self.state_path = data_dir / peerstate.NET_FILE
        saved = peerstate.load(self.state_path, "net")
        self.settings["banned"] = peerstate.deadlines(
            saved.get("banned"), time.time(), peerstate.MAX_BANNED
        )
        self.settings["penalties"] = saved.get("penalties") or {}
        if self.settings["banned"] or self.settings["penalties"]:
            log.info(
                "peer bans and penalties restored",
                banned=len(self.settings["banned"]),
                penalised=len(self.settings["penalties"]),
                path=str(self.state_path),
            )
        self._last_drop_log = -math.inf
        self.addrs: list[str] = []
        self.child_stats: dict[str, Any] = {}
        self._inbox = Inbox(net.inbox_per_peer, net.inbox_total)
        self._outbox: queue.Queue[list[Any]] = queue.Queue(maxsize=queue_size)
        self._stats = NetStats()
        self._refusals: dict[tuple[str, str], int] = {}
        self._base = dict.fromkeys(_COUNTED, 0)  # counts of the children before this one
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready = threading.Event()
        self._fatal: str | None = None
        self._flush_lock = threading.Lock()
        self._flush_token = 0
        self._flush_answer: tuple[int, bool] = (0, False)
        self._flushed = threading.Event()  # set when the child answers a flush
        # When the child last sent a frame (monotonic): it reports every second, so a
        # long silence means it is stuck, or dead and not restarted (status.py's /healthz).
        self.heard_at = time.monotonic()
        self._spawn()
        if not self._ready.wait(start_timeout_s) or self._fatal:
            reason = self._fatal or f"no answer in {start_timeout_s:.0f} s"
            self._kill()
            raise NetError(f"the network cannot start: {reason}")
        # A restarted child listens where the first one did (same addresses for peers).
        self.settings["listen"] = self._listening
        self._supervisor = threading.Thread(target=self._supervise, name="net-supervisor")
        self._supervisor.daemon = True
        self._supervisor.start()

    # --- the Transport interface -------------------------------------------------------

    def publish(self, data: bytes, wait_s: float = 0.0) -> bool:
        """Queue ``data`` for the network process; with ``wait_s``, wait that long for
        room (a sender with nothing else to do, ``sapo-node share``) instead of dropping."""
        if self._closing.is_set():
            return False
        try:
            if wait_s > 0:
                self._outbox.put(["publish", data], timeout=wait_s)
            else:
                self._outbox.put_nowait(["publish", data])
        except queue.Full:
            with self._lock:
                self._stats.publish_dropped += 1
                dropped = self._stats.publish_dropped
            if time.monotonic() - self._last_drop_log >= 60.0:
                self._last_drop_log = time.monotonic()
                log.warning(
                    "the swarm is not keeping up: groups not shared",
                    queued=self._outbox.qsize(),
                    unsent_since_start=dropped,
                )
            return False
        with self._lock:
            self._stats.published += 1
        return True

    def received(self) -> list[Received]:
        return self._inbox.drain()

    def peers(self) -> int:
        return int(self.child_stats.get("peers", 0))

    def stats(self) -> NetStats:
        with self._lock:
            s = self._stats
            for name in _COUNTED:
                setattr(s, name, self._base[name] + int(self.child_stats.get(name, 0)))
            s.peers = self.peers()
            s.reachability = str(self.child_stats.get("reachability", ""))
            s.reachability_reason = str(self.child_stats.get("reachability_reason", ""))
            s.autonat = str(self.child_stats.get("autonat") or "")
            for name in (
                "connections_direct",
                "connections_relayed",
                "routing_table",
                "dht_lan_addrs",
            ):
                setattr(s, name, int(self.child_stats.get(name, 0)))
            s.inbox_dropped = self._inbox.dropped
            count = int(self.child_stats.get("shard_count", 1))
            if count > 1:
                s.shards = ",".join(map(str, self.shards)) + f" of {count}"
            s.mesh_peers = [int(m) for m in self.child_stats.get("meshes", ())]
            return NetStats(**{**vars(s), "mesh_peers": list(s.mesh_peers)})

    def penalise(self, author: str) -> None:
        with contextlib.suppress(queue.Full):
            self._outbox.put_nowait(["penalise", author])

    def refusals(self) -> dict[tuple[str, str], int]:
        with self._lock:
            out, self._refusals = self._refusals, {}
        return out

    def flush(self, timeout_s: float, drain_s: float = 2.0) -> bool:
        """Wait until the network process has published every message queued before
        this call and written them to its peers' streams (its queues to peers drained,
        at most ``drain_s`` after the last publish); False if it did not confirm that
        within ``timeout_s``. After True, closing loses none of them."""
        deadline = time.monotonic() + timeout_s
        with self._flush_lock:
            self._flush_token += 1
            token = self._flush_token
            self._flushed.clear()
            try:
                self._outbox.put(["flush", token, drain_s], timeout=timeout_s)
            except queue.Full:
                return False
            while self._flushed.wait(max(0.0, deadline - time.monotonic())):
                answer = self._flush_answer
                if answer[0] == token:
                    return bool(answer[1])
                self._flushed.clear()  # an answer to an earlier call that gave up
                if time.monotonic() >= deadline:
                    break
            return False

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the child (SIGUSR1: it ignores SIGTERM, and has nothing to save: its state
        is kept here), then make sure it has. Not a frame on stdin: the writer thread may
        be blocked on a full pipe there."""
        if self._closing.is_set():
            return
        self._closing.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGUSR1)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._kill()
        if hasattr(self, "_supervisor"):
            self._supervisor.join(timeout_s)
        self.save_peer_state()

    # --- the child ----------------------------------------------------------------------

    def _spawn(self) -> None:
        self._ready.clear()
        self._fatal = None
        proc = subprocess.Popen(
            [sys.executable, "-m", "sapo_node.net.host"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        proc.stdin.write(ipc.pack(["settings", self.settings]))
        proc.stdin.flush()
        self._proc = proc
        threading.Thread(target=self._read, args=(proc,), name="net-reader", daemon=True).start()
        threading.Thread(target=self._write, args=(proc,), name="net-writer", daemon=True).start()

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        while True:
            try:
                frame = ipc.read_frame(proc.stdout)
            except (OSError, ValueError) as exc:
                log.error("bad frame from the network process", error=str(exc))
                frame = None
            if frame is None:
                return
            self.heard_at = time.monotonic()
            kind = frame[0]
            if kind == "message":
                self._inbox.put(Received(frame[1], frame[2]))
            elif kind == "stats":
                with self._lock:
                    for author, reason, n in frame[1].pop("refusals", ()):
                        count_refusal(self._refusals, str(author), str(reason), int(n))
                self._keep_peer_state(frame[1])
                self.child_stats = frame[1]
            elif kind == "flushed":
                self._flush_answer = (int(frame[1]), bool(frame[2]))
                self._flushed.set()
            elif kind == "ready":
                self.addrs, self._listening = list(frame[2]), list(frame[3])
                self._ready.set()
            elif kind == "fatal":
                self._fatal = frame[1]
                self._ready.set()

    def _keep_peer_state(self, stats: dict[str, Any]) -> None:
        """Save the child's bans and penalties when they change; the next child starts
        with them."""
        changed = False
        banned = stats.get("banned")
        if isinstance(banned, dict) and banned != self.settings["banned"]:
            self.settings["banned"], changed = banned, True
        penalties = stats.pop("penalties", None)
        if isinstance(penalties, dict) and penalties != self.settings["penalties"]:
            self.settings["penalties"], changed = penalties, True
        if changed:
            self.save_peer_state()

    def save_peer_state(self) -> None:
        s = self.settings
        peerstate.save(self.state_path, "net", {"banned": s["banned"], "penalties": s["penalties"]})

    def _write(self, proc: subprocess.Popen[bytes]) -> None:
        while proc.poll() is None and not self._closing.is_set():
            try:
                frame = self._outbox.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                proc.stdin.write(ipc.pack(frame))
                proc.stdin.flush()
            except (OSError, ValueError):
                return  # the child is gone; the supervisor restarts it

    def _supervise(self) -> None:
        delay = 1.0
        while not self._closing.is_set():
            proc = self._proc
            code = proc.wait()
            if self._closing.is_set():
                return
            with self._lock:
                for name in _COUNTED:
                    self._base[name] += int(self.child_stats.get(name, 0))
                self.child_stats = {}
                self._stats.restarts += 1
            log.error("network process died; restarting it", exit_code=code, in_s=delay)
            if self._closing.wait(delay):
                return
            self._spawn()
            if self._ready.wait(60.0) and not self._fatal:
                log.info("network process restarted", addrs=self.addrs)
                delay = 1.0
            else:
                log.error("network process failed to restart", reason=self._fatal or "timeout")
                self._kill()
                delay = min(delay * 2, 60.0)

    def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
