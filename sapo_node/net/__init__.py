"""The swarm transport behind one small interface.

The round loop sees only :class:`Transport`: ``publish`` bytes, drain ``received``
messages with their authors, count ``peers``, report ``stats``, ``penalise`` an author
whose group this node refused, ``close``. Two implementations:

- :class:`sapo_node.net.memory.MemoryTransport`, an in-process hub for fast tests;
- :class:`sapo_node.net.process.Libp2pTransport`, py-libp2p GossipSub running in its own
  process (``sapo_node.net.host``), restarted if it dies.

Both hold received messages in an :class:`Inbox`, bounded per author and in total, so a
peer that floods fills only its own share while the round loop is busy.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Protocol

MAX_REFUSAL_KEYS = 1024  # (author, reason) pairs held between two reads; beyond, "(others)"
OTHERS = "(others)"


def count_refusal(counts: dict[tuple[str, str], int], author: str, reason: str, n: int = 1):
    """Add to bounded per-(author, reason) counts: past MAX_REFUSAL_KEYS pairs, new
    authors are counted as OTHERS, so a peer inventing identities grows nothing."""
    key = (author, reason)
    if key not in counts and len(counts) >= MAX_REFUSAL_KEYS:
        key = (OTHERS, reason)
    counts[key] = counts.get(key, 0) + n


class NetError(RuntimeError):
    """The network cannot start (port in use, bad address, unreadable identity)."""


@dataclass(frozen=True)
class Received:
    """One message from the swarm; ``author`` is the peer ID that signed it, and
    ``received_at`` when it reached this node, on the node's clock (the wall clock; an
    experiment's transport stamps its own), however long it then waited in the inbox."""

    data: bytes
    author: str
    received_at: float = field(default_factory=time.time)


@dataclass
class NetStats:
    """Counters since start; ``peers`` is the current number of swarm peers."""

    peers: int = 0
    published: int = 0  # messages handed to the network
    publish_dropped: int = 0  # messages that could not be handed over in time
    received: int = 0  # messages that passed the wire checks, handed to the node
    rejected: int = 0  # messages refused by the wire checks in the network process
    inbox_dropped: int = 0  # received messages dropped while the round loop was busy
    bytes_in: int = 0
    bytes_out: int = 0
    restarts: int = 0
    reachability: str = ""  # public, private or local (addresses.py); "" without a network
    # why: config, announce, address, upnp (a router's port mapping), loopback, nat or
    # autonat (peers could not dial its public address, net/autonat.py)
    reachability_reason: str = ""
    autonat: str = ""  # what peers' dial-backs showed: public, private; "" not asked or unsure
    connections_direct: int = 0
    connections_relayed: int = 0  # through a circuit relay
    routing_table: int = 0  # peers in the DHT routing table
    dht_lan_addrs: int = 0  # LAN addresses the DHT would hand out (0 on a public node)
    shards: str = ""  # the shard topics joined, "3,17 of 64"; "" in a swarm of one topic
    mesh_peers: list[int] = field(default_factory=list)  # mesh peers per joined topic


class Transport(Protocol):
    """What the round loop needs of a swarm."""

    peer_id: str

    def publish(self, data: bytes) -> bool:
        """Hand one message to the swarm; False (logged, counted) if it could not be."""
        ...

    def received(self) -> list[Received]:
        """Every message received since the last call, oldest first; never blocks."""
        ...

    def peers(self) -> int: ...

    def stats(self) -> NetStats: ...

    def penalise(self, author: str) -> None:
        """Lower the score of a peer whose message this node refused."""
        ...

    def refusals(self) -> dict[tuple[str, str], int]:
        """Messages refused before they reached the node (by the network process's checks),
        per (author, reason), since the last call."""
        ...

    def close(self) -> None: ...


class Inbox:
    """Received messages, at most ``per_author`` from one author and ``total`` in all.

    When full, the oldest message of the author holding the most is dropped, so a
    flooding peer displaces only its own messages.
    """

    def __init__(self, per_author: int = 64, total: int = 4096) -> None:
        self.per_author, self.total = per_author, total
        self._by_author: OrderedDict[str, deque[Received]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self.dropped = 0

    def put(self, item: Received) -> None:
        with self._lock:
            queue = self._by_author.setdefault(item.author, deque())
            if len(queue) >= self.per_author:
                queue.popleft()
                self.dropped += 1
                self._size -= 1
            elif self._size >= self.total:
                largest = max(self._by_author.values(), key=len)
                largest.popleft()
                self.dropped += 1
                self._size -= 1
            queue.append(item)
            self._size += 1

    def drain(self) -> list[Received]:
        with self._lock:
            items = [x for q in self._by_author.values() for x in q]
            self._by_author.clear()
            self._size = 0
        items.sort(key=lambda x: x.received_at)
        return items

    def __len__(self) -> int:
        return self._size
