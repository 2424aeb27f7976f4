"""An in-process swarm for fast tests: every transport attached to a hub receives what
the others publish, with the author's name; no sockets, no threads."""

from __future__ import annotations

import dataclasses
import threading

from sapo_node.net import Inbox, NetStats, Received


class MemoryHub:
    """The shared medium of in-memory transports."""

    def __init__(self) -> None:
        self._members: dict[str, MemoryTransport] = {}
        self._lock = threading.Lock()

    def join(self, peer_id: str, *, per_author: int = 64, total: int = 4096) -> MemoryTransport:
        transport = MemoryTransport(self, peer_id, Inbox(per_author, total))
        with self._lock:
            self._members[peer_id] = transport
        return transport

    def _leave(self, peer_id: str) -> None:
        with self._lock:
            self._members.pop(peer_id, None)

    def _deliver(self, author: str, data: bytes) -> None:
        with self._lock:
            others = [t for pid, t in self._members.items() if pid != author]
        for t in others:
            t._arrive(Received(data, author))

    def size(self) -> int:
        with self._lock:
            return len(self._members)


class MemoryTransport:
    """A member of a :class:`MemoryHub`."""

    def __init__(self, hub: MemoryHub, peer_id: str, inbox: Inbox) -> None:
        self.hub, self.peer_id, self._inbox = hub, peer_id, inbox
        self._stats = NetStats()
        self.penalised: list[str] = []
        self.closed = False

    def publish(self, data: bytes) -> bool:
        if self.closed:
            return False
        self._stats.published += 1
        self._stats.bytes_out += len(data)
        self.hub._deliver(self.peer_id, data)
        return True

    def _arrive(self, item: Received) -> None:
        self._stats.received += 1
        self._stats.bytes_in += len(item.data)
        self._inbox.put(item)

    def received(self) -> list[Received]:
        return self._inbox.drain()

    def peers(self) -> int:
        return self.hub.size() - 1 if not self.closed else 0

    def stats(self) -> NetStats:
        self._stats.peers = self.peers()
        self._stats.inbox_dropped = self._inbox.dropped
        return dataclasses.replace(self._stats)  # a snapshot: callers diff two of them

    def penalise(self, author: str) -> None:
        self.penalised.append(author)

    def refusals(self) -> dict[tuple[str, str], int]:
        return {}  # the hub checks nothing: every message reaches the node's intake

    def close(self) -> None:
        self.closed = True
        self.hub._leave(self.peer_id)
