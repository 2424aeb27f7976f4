"""The network process: a py-libp2p host running GossipSub for one swarm.

Started by :class:`sapo_node.net.process.Libp2pTransport` as ``python -m
sapo_node.net.host``; it never imports torch. It talks to its parent over stdin/stdout
in length-prefixed MessagePack frames (``sapo_node.net.ipc``):

    parent -> here   ["settings", {...}] first, then ["publish", bytes], ["penalise", author]
    here -> parent   ["ready", peer_id, [addr, ...], [listen, ...]], ["message", bytes, author],
                     ["stats", {...}] every second, ["fatal", text]

It holds nothing worth saving: what it learns about peers that must outlive it (bans
with their wall-clock ends, score penalties) goes to the parent in its stats, and comes
back in the settings of the next one (the parent keeps it in the data directory,
peerstate.py). It ignores SIGINT and SIGTERM: a signal sent to the node's whole process
group (Ctrl-C, ``timeout``, a supervisor) is the node's to act on, and the node then
stops it with SIGUSR1. It exits by itself when its parent is gone (stdin closes, or it
is given another parent), within a second.

Each trap of py-libp2p 0.8.1 measured in LIBP2P.md has its answer here, marked "trap N":
a guarded stream handler, serialised writes, no spam limit (per-author token buckets
instead), bigger outbound queues and backpressure, a raised inbound limit with the real
message cap in the validator, a 1 s heartbeat without adaptive gossip, sequence numbers
from nanoseconds, bounded equivocation memory, services started before the host listens,
periodic re-dial, our own port check, Noise only, announce addresses, the default
message id, and discovery through the DHT. Two more keep a node behind NAT from
poisoning discovery with its LAN addresses (issue 30, net/reach.py): identify shows
peers outside its LAN none of them (trap 16), and a DHT routing table takes only peers
that serve the DHT from an address others can dial (trap 17); circuit relay v2 is wired
in by hand (trap 18). A node that would be private asks its home router for a port
mapping (UPnP, net/upnp.py, trap 19) and, given one, is public at the router's address.
DCUtR replaces a relayed connection by a direct one where both NATs keep ports, and
pubsub moves onto it (trap 20). AutoNAT's dial-backs go over fresh connections, and a
node that peers cannot dial at its public address turns private (trap 21, net/autonat.py).
Where the library forgets a peer in pieces (a ban, a disconnect
after one), ``SwarmPubsub.forget_peer`` forgets it everywhere at once, and ``stats``
reports any per-peer state still held for a peer that is gone.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import math
import os
import random
import signal
import sys
import threading
import time
import weakref
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import multiaddr
import structlog
import trio
from libp2p import new_host
from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.discovery.mdns.mdns import MDNSDiscovery
from libp2p.identity.identify_push import push_identify_to_peers
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.pubsub import pubsub as pubsub_module
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.score import PeerScorer, ScoreParams, TopicScoreParams
from libp2p.rcmgr import Direction
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service

from sapo_node import peerstate, wire
from sapo_node.logs import configure_logging
from sapo_node.net import (
    NetError,
    autonat,
    count_refusal,
    dnsaddr,
    identity,
    ipc,
    patches,
    reach,
    upnp,
)
from sapo_node.net.patches import DHT_PROTOCOL, LIBRARY_DHT_PROTOCOL, OUTBOUND_QUEUE
from sapo_node.net.ports import check_ports_free
from sapo_node.net.state import COUNTERS, STATE
from sapo_node.pool import RateLimiter

log = structlog.get_logger("sapo_node.net")

PROTOCOLS = ["/meshsub/1.2.0", "/meshsub/1.1.0", "/meshsub/1.0.0"]
# The swarm's own mDNS service name (protocol/SPEC.md section 2, *Discovery*), not IPFS's
# _p2p._udp.local.: on it a node found the IPFS nodes on its LAN and dialled them (its DHT
# protocol id, DHT_PROTOCOL, is set in net/patches.py).
MDNS_SERVICE = "_sapo._udp.local."
BACKPRESSURE_FILL = 0.5  # publish waits while a peer's queue is fuller than this
BACKPRESSURE_WAIT_S = 10.0
INBOUND_RPC_LIMIT = 8 * 2**20  # trap 5: above js-libp2p's 4 MiB; the real cap is wire's
EQUIVOCATION_MEMORY = 8192  # digests of (author, seqno) kept (trap 8)
EXCUSED_MEMORY = 8192  # ids of messages refused through no sender's fault
BAN_S = 600.0  # a peer whose score falls below the graylist threshold is ignored this long
MAX_PENALISED = 10_000  # peers whose score penalties are remembered beyond their connection
MAX_BACKOFF = 10_000  # peers whose redial delay is remembered
SCORE_DECAY = 0.999  # per 1 s heartbeat, of invalid messages and behaviour penalties
DIAL_TIMEOUT_S = 5.0
DIAL_CONCURRENCY = 8  # dials at once in a discovery pass
DIAL_PASS_S = 2 * DIAL_TIMEOUT_S  # the most a pass spends dialling (peers that fail back off)
RESOLVE_EVERY_S = 600.0  # bootstrap names (/dnsaddr/, /dns4/) are looked up again this often
ALONE_NOTICE_S = 60.0  # a node still without a peer this long after start says so, once
RELAYS = 2  # relays a private node keeps a reservation on
CIRCUIT_S = 3600  # a relayed connection lasts at most this long (then it is dialled again)
RELAY_GRACE_S = 10.0  # a relayed connection closes this long after a punch replaced it
# Message ids of valid messages are remembered this long (refreshed on each sighting):
# memory is bounded by the authors' rate limit times this. Content duplicates are the
# pool's job, for its max_age_s.
SEEN_TTL_S = 120
STALE_S = 15.0  # a connection without a pubsub stream this long is dropped and redialled
# A public node announces its topics in the DHT again this often, and whenever peers it
# has not announced to connect (records live 48 h; each announcement is a lookup that
# every peer it asks pays for, and at 24 nodes the DHT was a large share of the CPU).
PROVIDE_EVERY_S = 600.0
# A node with at least the mesh degree of its topics' members connected looks their
# providers up this often, not every pass: each lookup costs every peer it asks, and at
# 24 nodes the DHT was a quarter of a member's network CPU (docs/scale.md).
LOOKUP_EVERY_S = 60.0


def dht_key(topic: str) -> str:
    """The swarm's DHT provider key (protocol/SPEC.md, discovery): the CIDv1 of the
    topic's UTF-8 bytes (raw codec 0x55, sha2-256), as base32 text. js-libp2p and
    go-libp2p Kademlia take a CID and key the records by its multihash, as py-libp2p
    does when given a CID string, so every implementation finds the same swarm.

    >>> dht_key("sapo/demo/rollouts/v2")[:7]
    'bafkrei'
    """
    digest = hashlib.sha256(topic.encode("utf-8")).digest()
    cid = bytes([0x01, 0x55, 0x12, 0x20]) + digest  # version, codec, sha2-256, 32 bytes
    return "b" + base64.b32encode(cid).decode("ascii").lower().rstrip("=")


class SwarmScorer(PeerScorer):
    """The library's scorer, except that for one message a forwarder is charged at most
    once, and not at all when the validator *ignored* the message (another version, a
    rate limit): only a sender's fault is counted.

    py-libp2p charges the forwarder of a refused message once for each entry of the
    message's topic list, which the author chooses and signs: with ``[A, A]`` each
    refusal cost an honest relay twice, and the excuse covered one entry (issue 46).
    A charge lands on a topic this node joined (its home topic if the message's is not
    one), so that it counts in the score the ban reads."""

    def __init__(self, params: ScoreParams, joined: list[str]) -> None:
        super().__init__(params)
        self.joined = joined
        self.judging: ID | None = None  # the forwarder of the message being checked
        self.excused = False  # that message was refused through nobody's fault
        self.charged = False  # its forwarder has paid for it

    def judge(self, forwarder: ID) -> None:
        """A message from ``forwarder`` is about to be checked. Called by
        ``SwarmPubsub.push_msg`` just before the library's, which validates (sync
        validators only) and charges before its first await: no other message's check
        comes between."""
        self.judging, self.excused, self.charged = forwarder, False, False

    def on_invalid_message(self, peer: ID, topic: str) -> None:
        if peer == self.judging:
            if self.excused or self.charged:
                return
            self.charged = True
        self.charge(peer, topic)

    def charge(self, peer: ID, topic: str) -> None:
        """One invalid message against ``peer``, outside the check of a message (the
        parent's penalty) or once for one (``SwarmPubsub.push_msg``)."""
        super().on_invalid_message(peer, topic if topic in self.joined else self.joined[0])


class SwarmGossipSub(GossipSub):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.equivocation_detection = OrderedDict()
        self.on_add_peer: Any = None  # called with each peer the router takes

    def add_peer(self, peer_id: ID, protocol_id: Any) -> None:
        super().add_peer(peer_id, protocol_id)
        if self.on_add_peer is not None:
            self.on_add_peer(peer_id)

    async def handle_rpc(self, rpc: Any, sender_peer_id: ID) -> None:
        """A banned peer's control messages (a GRAFT, say) are not taken: they would put
        it back in the mesh, on a stream still open until its connection closes."""
        if self.pubsub is not None and self.pubsub.is_peer_blacklisted(sender_peer_id):
            return
        await super().handle_rpc(rpc, sender_peer_id)

    async def handle_prune(self, prune_msg: Any, sender_peer_id: ID) -> None:
        """The library's, without its GRAFT-flood mark. py-libp2p 0.8.1 notes the time a
        peer *pruned this node* as if this node had pruned it, and then penalises that
        peer's next GRAFT within 10 s by 10 (a score of -100: a ban), though the backoff
        binds the pruned side only. Meshes that shrink and grow at each heartbeat (more
        peers on a topic than D_high) so banned honest peers by the dozen in a swarm of
        16 (docs/scale.md). The mark stays where this node prunes a peer itself."""
        topic = prune_msg.topicID
        before = self.graft_flood_tracking.get(sender_peer_id, {}).get(topic)
        await super().handle_prune(prune_msg, sender_peer_id)
        marks = self.graft_flood_tracking.get(sender_peer_id)
        if marks is not None:
            if before is None:
                marks.pop(topic, None)
            else:
                marks[topic] = before
            if not marks:
                del self.graft_flood_tracking[sender_peer_id]

    def _check_equivocation(self, msg: Any) -> bool:
        """As the library's, but remembers a digest of the last EQUIVOCATION_MEMORY
        messages instead of every whole message forever (trap 8)."""
        key = msg.from_id + msg.seqno
        digest = hashlib.sha256(msg.data + "\0".join(msg.topicIDs).encode()).digest()
        seen = self.equivocation_detection.get(key)
        if seen is None:
            self.equivocation_detection[key] = digest
            while len(self.equivocation_detection) > EQUIVOCATION_MEMORY:
                self.equivocation_detection.popitem(last=False)
            return True
        if seen != digest:
            log.warning("equivocation: one seqno, two messages", author=ID(msg.from_id).pretty())
            author = ID(msg.from_id)
            # a score only for a peer: one kept for an author elsewhere is never forgotten
            if self.scorer is not None and self.pubsub is not None and author in self.pubsub.peers:
                self.scorer.penalize_equivocation(author, 100.0)
            return False
        return True


class SwarmPubsub(Pubsub):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Ids of messages refused through no fault of whoever relays them (another
        # version, the author over its rate): further copies are dropped unchecked and at
        # no cost, where the library would answer from its validation cache and charge
        # each honest relay as for an invalid message.
        self.excused: OrderedDict[bytes, None] = OrderedDict()
        # trap 7: seconds-based seqnos collide after a quick restart; nanoseconds do not
        self.counter = time.time_ns()
        self._write_locks: weakref.WeakKeyDictionary[Any, trio.Lock] = weakref.WeakKeyDictionary()
        # The network loop's own per-peer maps, forgotten with the library's state.
        self.own_peer_maps: list[dict[ID, Any]] = []
        self.on_forget: Any = None  # called with a peer just before it is forgotten
        # called with (forwarder, message) before anything else: True if it refused the
        # message for its topic list (Network._refuse_topics)
        self.refuse_topics: Any = None

    # --- forgetting a peer -------------------------------------------------------------
    #
    # py-libp2p 0.8.1 forgets a peer in pieces. A ban (``add_to_blacklist``) drops the
    # peer's stream and subscriptions but keeps its outbound queue, its place in the mesh
    # and fanout and the router's state (protocol, IDONTWANT, scores): GossipSub went on
    # queueing an IDONTWANT for every message to it, and nothing drained the queue. When
    # the peer then disconnects, ``_handle_dead_peer`` returns early for a peer without a
    # stream, so that state stayed for good; at half the queue full, backpressure held
    # every own publish 10 s, and own publishing stopped (issue 11). So a ban and a
    # disconnect both end in ``forget_peer``.

    def forget_peer(self, peer: ID) -> Any:
        """Drop everything this pubsub, its router, the scorer and the network loop keep
        about ``peer`` (a ban is kept apart, in the blacklist; its score penalties in the
        network's memory, ``on_forget``). Returns the peer's outbound stream, if it had
        one, for the caller to reset."""
        if self.on_forget is not None:
            self.on_forget(peer)
        stream = self.peers.pop(peer, None)
        queue = self.peer_queues.pop(peer, None)
        if queue is not None:
            queue.close()  # its sending task exits; what it held is dropped
        self._clear_pending_announce_retries_for_peer(peer)
        self._forget_all_subscriptions(peer)
        self._peer_added_events.pop(peer, None)
        for key in [k for k in self._subscription_events if k[0] == peer]:
            del self._subscription_events[key]
        # mesh, fanout, protocol, IDONTWANT, scores, IWANT/IHAVE/GRAFT limits, pending
        # messages and control, extensions, topic observation
        self.router.remove_peer(peer)
        for peers in self.router.back_off.values():
            peers.pop(peer, None)
        for own in self.own_peer_maps:
            own.pop(peer, None)
        return stream

    def _peer_places(self) -> Iterator[tuple[str, Iterable[ID]]]:
        """Each per-peer structure, by name, with the peers it holds."""
        router, scorer = self.router, self.router.scorer
        yield "peer_queues", self.peer_queues
        yield "peer_topics", {p for peers in self.peer_topics.values() for p in peers}
        yield "subscription_count", self._peer_subscription_count
        yield "replayed_topics", self._replayed_recent_topics
        yield "announce_retries", {key[0] for key in self._pending_announce_retries}
        yield "subscription_events", {key[0] for key in self._subscription_events}
        yield "mesh", {p for peers in router.mesh.values() for p in peers}
        yield "fanout", {p for peers in router.fanout.values() for p in peers}
        yield "back_off", {p for peers in router.back_off.values() for p in peers}
        yield "peer_protocol", router.peer_protocol
        yield "idontwant", router.dont_send_message_ids
        yield "pending_messages", router._pending_messages
        yield "pending_control", router._pending_control
        yield (
            "gossip_limits",
            {
                *router.iwant_request_limits,
                *router.ihave_message_limits,
                *router.graft_flood_tracking,
            },
        )
        if scorer is not None:
            yield (
                "score",
                {
                    *scorer.time_in_mesh,
                    *scorer.first_message_deliveries,
                    *scorer.mesh_message_deliveries,
                    *scorer.invalid_messages,
                    *scorer.behavior_penalty,
                    *scorer.app_specific_scores,
                    *scorer.ip_by_peer,
                    *scorer.graft_flood_penalties,
                    *scorer.iwant_spam_penalties,
                    *scorer.ihave_spam_penalties,
                    *scorer.equivocation_penalties,
                },
            )
        yield "own", {p for own in self.own_peer_maps for p in own}

    def stale_state(self, live: set[ID]) -> dict[ID, list[str]]:
        """Per-peer state held for peers not in ``live`` (each with where it is held):
        empty unless a path forgot a peer only in part."""
        held: defaultdict[ID, list[str]] = defaultdict(list)
        for name, peers in self._peer_places():
            for peer in peers:
                if peer not in live:
                    held[peer].append(name)
        return dict(held)

    async def _teardown_if_connected(self, peer_id: ID) -> None:
        """A ban (``add_to_blacklist`` runs this): the peer is forgotten entirely, not
        only its stream and subscriptions."""
        stream = self.forget_peer(peer_id)
        if stream is not None:
            with contextlib.suppress(Exception):
                await stream.reset()

    def _handle_dead_peer(self, peer_id: ID) -> None:
        """The library's, then the rest: a peer that is gone, or banned, is forgotten
        entirely (the library returns early for a peer whose stream a ban took)."""
        super()._handle_dead_peer(peer_id)
        if peer_id not in self.peers and (
            self.is_peer_blacklisted(peer_id) or not self._peer_is_connected(peer_id)
        ):
            self.forget_peer(peer_id)

    def handle_subscription(self, origin_id: ID, sub_message: Any) -> None:
        """Nor a banned peer's subscriptions (as ``handle_rpc`` above)."""
        if not self.is_peer_blacklisted(origin_id):
            super().handle_subscription(origin_id, sub_message)

    def live_queues(self) -> list[Any]:
        """The outbound queues of peers with a pubsub stream, connected, not banned."""
        return [
            queue
            for peer, queue in self.peer_queues.items()
            if peer in self.peers
            and not self.is_peer_blacklisted(peer)
            and self._peer_is_connected(peer)
        ]

    async def hand_over(self, peer: ID) -> bool:
        """trap 20: move this node's pubsub stream to ``peer`` onto the connection the
        swarm now prefers (a direct one over a relayed one), keeping the peer's place in
        the mesh and what its queue holds; the old stream is closed once its writer is
        done, which the peer reads as an end of that stream only. True if moved."""
        old = self.peers.get(peer)
        if old is None:
            return False
        stream = await self.host.new_stream(peer, self.protocols)
        if stream.muxed_conn is old.muxed_conn or self.peers.get(peer) is not old:
            with contextlib.suppress(Exception):
                await stream.reset()
            return False
        # The peer takes the hello's subscriptions again as a no-op.
        hello = self.get_hello_packet().SerializeToString()
        await stream.write(pubsub_module.encode_varint_prefixed(hello))
        if self.peers.get(peer) is not old:  # gone or banned meanwhile
            with contextlib.suppress(Exception):
                await stream.reset()
            return False
        queue = pubsub_module.RpcQueue()
        previous = self.peer_queues.get(peer)
        if previous is not None:  # what it holds goes on the new stream, in order
            queue._queue, previous._queue = previous._queue, queue._queue
            previous.close()  # its sending task ends after the write in hand, if any
        self.peers[peer], self.peer_queues[peer] = stream, queue
        self.manager.run_task(self.handle_sending_messages, peer, stream, queue)
        async with self._write_locks.setdefault(old, trio.Lock()):
            with contextlib.suppress(Exception):
                await old.close()
        return True

    async def write_msg(self, stream: Any, rpc_msg: Any) -> bool:
        """trap 2: one writer at a time per stream (queue and replay interleaved frames)."""
        lock = self._write_locks.setdefault(stream, trio.Lock())
        async with lock:
            ok = await super().write_msg(stream, rpc_msg)
        if ok:
            COUNTERS.bytes_out += rpc_msg.ByteSize()
        return ok

    async def stream_handler(self, stream: Any) -> None:
        """trap 1: a malformed frame resets that peer's stream, never the whole host.

        A banned peer's new stream is reset unread: the library would take its
        subscriptions and GRAFTs, and hold state for it again."""
        if self.is_peer_blacklisted(stream.muxed_conn.peer_id):
            with contextlib.suppress(Exception):
                await stream.reset()
            return
        try:
            await super().stream_handler(stream)
        except Exception as exc:
            peer = stream.muxed_conn.peer_id
            COUNTERS.bad_frames += 1
            log.warning("bad pubsub frame; stream reset", peer=str(peer), error=repr(exc)[:200])
            with contextlib.suppress(Exception):
                await stream.reset()
            self._handle_dead_peer(peer)
            # after: forgetting the dead peer forgets its score too. A peer that is gone
            # keeps no score (nothing would ever forget it); one still connected opens
            # its stream again, penalised.
            if self.router.scorer is not None and self._peer_is_connected(peer):
                self.router.scorer.penalize_behavior(peer, 1.0)

    async def push_msg(self, msg_forwarder: Any, msg: Any) -> None:
        """trap 1 again: each received message is checked in a task of its own, outside
        the stream handler, and an exception there (a junk public key in a message, say)
        ends the whole host. Such a message is dropped and counted as a bad frame.

        The library drops, unvalidated and at no cost, messages from a peer whose score
        is below the publish threshold, so invalid messages alone could never take a
        peer down to the graylist and the ban. Here each such message costs as an
        invalid one: a peer that goes on sending once refused is banned."""
        if self.get_message_id(msg) in self.excused:
            return
        scorer = self.router.scorer
        fresh = (
            not self.is_peer_blacklisted(msg_forwarder)
            and not self.is_peer_blacklisted(ID(msg.from_id))
            and not self._is_msg_seen(msg)
        )
        if fresh and self.refuse_topics is not None and self.refuse_topics(msg_forwarder, msg):
            return
        if (
            scorer is not None
            and fresh
            and not scorer.allow_publish(msg_forwarder, list(msg.topicIDs))
        ):
            scorer.charge(msg_forwarder, msg.topicIDs[0])
            return
        if scorer is not None:
            scorer.judge(msg_forwarder)
        try:
            await super().push_msg(msg_forwarder, msg)
        except Exception as exc:
            COUNTERS.bad_frames += 1
            log.warning("bad pubsub message", peer=str(msg_forwarder), error=repr(exc)[:200])
            if scorer is not None:
                scorer.charge(msg_forwarder, msg.topicIDs[0] if msg.topicIDs else "")


# --- reachability (issue 30) ------------------------------------------------------------
#
# What this node shows peers of its addresses is net/state.py's STATE, and the library's
# hooks that show them are patched in net/patches.py (docs/libp2p.md#addresses-shown-to-peers).


class SwarmDHT(KadDHT):
    """trap 17: py-libp2p's DHT puts a peer in its routing table when it opens a DHT
    stream ("so it MUST be a server": a client asks questions too) or before identify
    said what it speaks, and peers it merely heard of from others. A routing table that
    holds clients hands their addresses to everyone as the closest peers. Here a peer is
    taken only once identify says it serves the DHT, and, by a public node, only with
    an address outside the LAN ranges."""

    def __init__(self, host: Any, mode: DHTMode, *, public: bool) -> None:
        super().__init__(host, mode)
        self.public = public
        # A provider record is handed to whoever asks: a public node keeps only the
        # addresses that lead somewhere (an old or hostile node may still send LAN ones),
        # and what it provides shows no LAN address of a private node.
        patches.guard_dht(self, self.admits, lambda: self.public)

    def lan_addrs_held(self) -> int:
        """LAN addresses this DHT would hand out: its routing table's peers' and those in
        its provider records (0 on a public node, whatever its peers are)."""
        store = self.host.get_peerstore()
        addrs = [str(a) for p in self.routing_table.get_peer_ids() for a in store.addrs(p)]
        for records in self.provider_store.providers.values():
            addrs += [str(a) for r in records.values() for a in r.addresses]
        return sum(map(reach.is_lan_addr, addrs))

    def drop_departed(self) -> None:
        """Peers that no longer serve the DHT leave the routing table: a node that AutoNAT
        found private switched to client and told its peers so (identify push)."""
        for peer in self.routing_table.get_peer_ids():
            if not self.admits(peer):
                self.routing_table.remove_peer(peer)

    def admits(self, peer: ID) -> bool:
        store = self.host.get_peerstore()
        try:
            if DHT_PROTOCOL not in (store.get_protocols(peer) or ()):
                return False
            addrs = [str(a) for a in store.addrs(peer)]
        except Exception:  # not in the peerstore (yet)
            return False
        if not self.public:
            return bool(addrs)
        return any(reach.ip_of(a) is not None and not reach.is_lan_addr(a) for a in addrs)


# trap 20 (DCUtR hole punching): py-libp2p's DCUtR punches through NATs that keep ports
# (measured: 1.3-1.5 s through two home routers that drop unsolicited packets; never
# through a symmetric one), then closes the relayed connection RELAY_CLOSE_GRACE_PERIOD
# (60 s) later. Nothing moves the pubsub streams, which stay on the relayed connection.
# When it closed, the library's reader took the end of the peer's stream quietly and
# its dead-peer handler skipped a peer still connected (directly): a stream was opened
# again only when this side next wrote, that message lost and the peer's subscriptions
# forgotten until the peer wrote too. A node that only listened got nothing (2 of 4
# runs of the NAT test with the hand-over below switched off). Here each node moves its
# own pubsub stream to a direct connection as soon as one is open, and to any that is
# left when its own closes (Network._prefer_direct, SwarmPubsub.hand_over); the relayed
# one closes RELAY_GRACE_S after the punch. Both sides' auto-drive loops start a punch
# at once, each as the other answers; that worked in every run, and answering only the
# side that took the relayed connection (the spec's way) failed in 3 runs of 3.


def is_relayed(conn: Any) -> bool:
    """A connection through a circuit relay: its transport address is a /p2p-circuit one."""
    with contextlib.suppress(Exception):
        return any("/p2p-circuit" in str(a) for a in conn.get_transport_addresses() or ())
    return False


class SwarmDCUtR(DCUtRProtocol):
    """The library's DCUtR, with a shorter wait before the relayed connection closes
    (pubsub moves within a second), and without LAN addresses in what it tells a peer
    when it has no outside address to predict (trap 16: the peer is not on its LAN)."""

    def __init__(self, host: Any) -> None:
        super().__init__(host)
        self.punched = self.failed = 0  # punches that worked, and failed (either side's part)
        self.punching: set[ID] = set()
        self.punch_s = 0.0  # how long the last punch that worked took to dial through

    async def initiate_hole_punch(self, peer_id: ID) -> bool:
        """The library's auto-drive loop punches one peer after another, and a punch that
        cannot work (a symmetric NAT: a 10 s direct dial, then 3 rounds, ~20 s) held up
        the peers behind it by half a minute: here each peer's runs in a task of its own."""
        if self._nursery is None or peer_id in self.punching:
            return False
        self.punching.add(peer_id)
        self._nursery.start_soon(self._punch, peer_id)
        return False

    async def _punch(self, peer_id: ID) -> None:
        try:
            await super().initiate_hole_punch(peer_id)
        finally:
            self.punching.discard(peer_id)

    async def _perform_hole_punch(self, peer_id: ID, *args: Any, **kwargs: Any) -> bool:
        began = time.monotonic()
        ok = await super()._perform_hole_punch(peer_id, *args, **kwargs)
        if ok:
            self.punch_s = time.monotonic() - began
        else:
            self.failed += 1
            log.info("hole punch failed; the connection stays relayed", peer=peer_id.pretty())
        return ok

    def _schedule_relay_close(self, peer_id: ID) -> None:
        self.punched += 1
        log.info(
            "hole punched: a direct connection replaces the relayed one", peer=peer_id.pretty()
        )
        super()._schedule_relay_close(peer_id)

    async def _close_relayed_conns_after_grace(
        self, peer_id: ID, grace: float = RELAY_GRACE_S
    ) -> None:
        await super()._close_relayed_conns_after_grace(peer_id, min(grace, RELAY_GRACE_S))

    async def _get_observed_addrs(self) -> list[bytes]:
        addrs = await super()._get_observed_addrs()
        if STATE.reachability != "private":
            return addrs
        return [a for a in addrs if not reach.is_lan_addr(str(multiaddr.Multiaddr(a)))]


def score_params() -> ScoreParams:
    """Invalid messages cost 10 each (decaying by half in about 11 minutes); at -30 a
    peer's messages are no longer accepted from it, at -50 it is graylisted and banned.
    IP colocation is not scored: nodes behind one NAT, or on one test machine, share an IP."""
    return ScoreParams(
        p4_invalid_messages=TopicScoreParams(weight=10.0, cap=1000.0, decay=0.999),
        p5_behavior_penalty_weight=10.0,
        p5_behavior_penalty_decay=0.999,
        publish_threshold=-30.0,
        gossip_threshold=-20.0,
        graylist_threshold=-50.0,
        accept_px_threshold=0.0,
    )


_interfaces: tuple[float, list[str]] = (0.0, [])


def _interface_ips() -> list[str]:
    """This machine's IPv4 addresses but loopback, looked up at most once a minute (the
    library asks for the host's addresses on every message it sends)."""
    global _interfaces
    if time.monotonic() >= _interfaces[0]:
        import ifaddr

        ips = {
            ip.ip
            for adapter in ifaddr.get_adapters()
            for ip in adapter.ips
            if isinstance(ip.ip, str) and not ip.ip.startswith("127.")
        }
        _interfaces = (time.monotonic() + 60.0, sorted(ips))
    return _interfaces[1]


def interface_addresses(addrs: list[multiaddr.Multiaddr]) -> list[multiaddr.Multiaddr]:
    """trap 13: a wildcard listen address is announced as each interface's address."""
    if not any(str(a).startswith("/ip4/0.0.0.0/") for a in addrs):
        return addrs
    ips = _interface_ips()
    out = []
    for addr in addrs:
        text = str(addr)
        if text.startswith("/ip4/0.0.0.0/"):
            out += [multiaddr.Multiaddr(text.replace("0.0.0.0", ip, 1)) for ip in ips]
            if not ips:
                out.append(multiaddr.Multiaddr(text.replace("0.0.0.0", "127.0.0.1", 1)))
        else:
            out.append(addr)
    return out


def announced_addresses(listen: list[str], announce: list[str]) -> list[str]:
    """The addresses a node gives peers (without /p2p/ID), as its host will."""
    if announce:
        return list(announce)
    return [str(a) for a in interface_addresses([multiaddr.Multiaddr(x) for x in listen])]


class Network:
    """The host, pubsub, DHT and the loops around them."""

    def __init__(
        self,
        settings: dict[str, Any],
        out: ipc.FrameWriter,
        mapping: upnp.Mapping | None = None,
    ) -> None:
        self.s, self.out = settings, out
        self.mapping = mapping  # a port the home router maps to this node (UPnP)
        self.topic: str = settings["topic"]  # the swarm's topic: its DHT key
        # The topics this node joins and publishes on (its shards, docs/scale.md), its
        # home shard's first; a swarm of one shard has one, the swarm's topic.
        self.topics: list[str] = list(settings.get("topics") or [self.topic])
        self.home = self.topics[0]
        # While the swarm changes its shard count (SPEC.md section 2.2): this node's shards
        # of the count before, joined too; each group goes out on one of each set.
        self.publish_topics = list(self.topics)
        self.topics_before: list[str] = list(settings.get("topics_before") or [])
        self.topics += [t for t in self.topics_before if t not in self.topics]
        # a message on two topics meets the validator once per topic and reaches both
        # subscriptions: it is checked and handed on once
        self.judged: tuple[Any, bool] = (None, False)
        self.delivered: OrderedDict[bytes, None] = OrderedDict()
        self.shard_count = int(settings.get("shards", 1))
        self.shards_joined = int(settings.get("shards_joined", 1))
        self.next_topic = 0  # own groups go to the joined topics in turn
        self.key = identity.load(Path(settings["key"]))
        self.listen = [multiaddr.Multiaddr(a) for a in settings["listen"]]
        announce = [multiaddr.Multiaddr(a) for a in settings["announce"]]
        self.host = new_host(
            key_pair=self.key,
            # trap 12: Noise only (the default list also offers secio and plaintext)
            sec_opt={
                NOISE_PROTOCOL_ID: NoiseTransport(
                    self.key, noise_privkey=create_new_x25519_key_pair().private_key
                )
            },
            muxer_preference="YAMUX",
            listen_addrs=self.listen,
            announce_addrs=announce or None,
            addrs_factory=None if announce else interface_addresses,
        )
        if settings["mdns"]:
            # The swarm's service name, not IPFS's (the host's own mDNS takes none, so it
            # is made here; the host starts it when it listens); it announces the
            # interfaces' addresses, as go-libp2p does, not the raw listen ones (announce
            # ones are for peers elsewhere): docs/libp2p.md#mdns-addresses.
            transport_addrs = self.host.get_transport_addrs
            self.host.mDNS = MDNSDiscovery(
                self.host.get_network(),
                service_type=MDNS_SERVICE,
                host=SimpleNamespace(
                    get_transport_addrs=lambda: interface_addresses(transport_addrs())
                ),
            )
        degree = settings["mesh_degree"]
        self.gossipsub = SwarmGossipSub(
            protocols=PROTOCOLS,
            degree=degree,
            degree_low=max(1, degree * 2 // 3),
            degree_high=degree * 2,
            heartbeat_interval=1,  # trap 6: 1 s heartbeat, no adaptive stretching
            heartbeat_initial_delay=0.1,
            adaptive_gossip_enabled=False,
            spam_protection_enabled=False,  # trap 3: per-author buckets in the validator
            score_params=score_params(),
            eclipse_protection_enabled=False,
        )
        self.scorer = SwarmScorer(self.gossipsub.scorer.params, self.topics)
        self.gossipsub.scorer = self.scorer
        self.pubsub = SwarmPubsub(
            self.host,
            self.gossipsub,
            strict_signing=True,  # the author is the signer; unsigned messages are dropped
            max_inbound_rpc_size=INBOUND_RPC_LIMIT,
            seen_ttl=SEEN_TTL_S,
            validation_cache_size=4096,
        )  # trap 14: the default message id (author + seqno) is kept
        patches.check_state(self.pubsub, patches.PUBSUB_STATE, "Pubsub")
        patches.check_state(self.gossipsub, patches.ROUTER_STATE, "GossipSub")
        patches.check_state(self.scorer, patches.SCORER_STATE, "PeerScorer")
        self.limiter = RateLimiter(settings["rate_per_author"], settings["burst_per_author"])
        # Peers refuse an author above this rate (their pool's limit, presumed equal to
        # ours): publishing faster only loses groups, so this node waits instead.
        self.own_rate = RateLimiter(settings["rate_per_author"], settings["burst_per_author"])
        shown = [str(a) for a in announce] or [str(a) for a in interface_addresses(self.listen)]
        self.reachability, self.reason = reach.explain(
            settings.get("reachability", "auto"), announce, shown
        )
        if mapping is not None:
            self.reason = "upnp"
        STATE.reachability = self.reachability
        self.dht = None
        if settings["dht"]:
            # A private node asks the DHT but serves it not: public peers could not dial it
            mode = DHTMode.CLIENT if self.reachability == "private" else DHTMode.SERVER
            self.dht = SwarmDHT(self.host, mode, public=self.reachability == "public")
        # trap 18 (circuit relay v2): py-libp2p's relay is not wired into the host, and
        # its swarm never dials a /p2p-circuit address. Every node runs the relay
        # protocol for the STOP side (taking relayed connections; the library's own
        # listener never answers STOP, so it is not run), a public node also serves HOP
        # within the limits of net.relay_*, and circuits are dialled through the relay
        # transport directly. Its roles are STOP only: with CLIENT, each dial would also
        # reserve a slot on the relay.
        serve = self.reachability == "public" and settings.get("relay_reservations", 0) > 0
        limits = RelayLimits(
            duration=CIRCUIT_S,
            data=int(settings.get("relay_circuit_mb", 128)) * 2**20,
            max_circuit_conns=int(settings.get("relay_circuits", 16)),
            max_reservations=int(settings.get("relay_reservations", 0)),
        )
        self.circuit = CircuitV2Protocol(self.host, limits=limits, allow_hop=serve)
        self.circuits = CircuitV2Transport(
            self.host, self.circuit, RelayConfig(roles=RelayRole.STOP)
        )
        # trap 20: every node answers DCUtR; one with a relayed connection (a private
        # node's, to another) tries to replace it by a direct one through both NATs.
        self.dcutr = SwarmDCUtR(self.host)
        # trap 21: a public node answers AutoNAT dial-back requests on fresh connections;
        # one public by an address or a UPnP mapping (or --announce) asks peers to dial it
        # back (net/autonat.py, _check_reachability).
        check = settings.get("autonat", True)
        self.autonat = autonat.SwarmAutoNAT(
            self.host,
            serve=check and self.reachability in ("public", "local"),
            peer_every_s=settings.get("autonat_peer_every_s", autonat.PEER_EVERY_S),
        )
        self.checks_reachability = check and self.reason in ("address", "upnp", "announce")
        self.reason_at_start = self.reason  # what a node private by AutoNAT returns to
        self.autonat_answers: dict[str, int] = {}  # server IP -> its answer, last check
        self.autonat_failed_at: float | None = None  # the check's first failed dial-back
        self.autonat_verdict: str | None = None
        self.handing_over: set[ID] = set()  # peers whose pubsub stream is being moved
        self.relays: dict[ID, list[str]] = {}  # relay -> this node's addresses through it
        self.nursery: trio.Nursery | None = None  # for the reservations' refresh
        self.bootstrap: list[PeerInfo] = []
        self.resolved_at = -RESOLVE_EVERY_S
        self.alone_since: float | None = None  # set at the first discovery pass
        self.pass_s = 0.0  # how long the last discovery pass took
        # A pass dials this many peers at once, for at most this long (None: no bound).
        self.dial_concurrency = int(settings.get("dial_concurrency", DIAL_CONCURRENCY))
        self.dial_pass_s: float | None = settings.get("dial_pass_s", DIAL_PASS_S)
        self.dial_left = math.inf  # of the pass under way: its bootstrap and other dials share it
        self.me = self.host.get_id()
        self.my_shards = set(self.shards_of(self.me))
        # Bans end at a wall-clock time, nearest end first; those of earlier network
        # processes and node runs come back in the settings (peerstate.py).
        self.banned: OrderedDict[ID, float] = OrderedDict()
        now = time.time()
        saved = peerstate.deadlines(settings.get("banned"), now, peerstate.MAX_BANNED)
        for peer, until in saved.items():
            with contextlib.suppress(Exception):
                self.banned[ID.from_base58(peer)] = until
        self.pubsub.blacklisted_peers.update(self.banned)
        # Score penalties outlive a peer's connection (the library forgets a score on
        # disconnect, and a restart of this process forgets them all): recalled when the
        # peer is added again, remembered when it is forgotten and each second.
        self.penalties = peerstate.Penalties(
            settings.get("penalties"), now, decay=SCORE_DECAY, limit=MAX_PENALISED
        )
        self._penalties_sent = -1
        self.gossipsub.on_add_peer = self._recall_penalties
        self.pubsub.on_forget = self._remember_penalties
        self.pubsub.refuse_topics = self._refuse_topics
        self.backoff: dict[ID, tuple[float, float]] = {}  # peer -> (next try, delay)
        self.refusals: dict[tuple[str, str], int] = {}  # (author, reason) -> n, bounded
        self.no_pubsub_since: dict[ID, float] = {}
        self.pubsub.own_peer_maps.append(self.no_pubsub_since)
        self.older_noticed: dict[ID, None] = {}  # peers said to run an older DHT
        self.pubsub.own_peer_maps.append(self.older_noticed)

    # --- shards (docs/scale.md) -------------------------------------------------------

    def shards_of(self, peer: ID) -> tuple[int, ...]:
        """The shards ``peer`` joins, by the swarm's rule (wire.shards_of): any node
        computes them from the peer's ID, so it knows whom to dial for its own."""
        return wire.shards_of(peer.to_bytes(), self.shard_count, self.shards_joined)

    def topic_peers(self) -> set[ID]:
        """Peers subscribed to any topic this node joined."""
        return {p for topic in self.topics for p in self.pubsub.peer_topics.get(topic, ())}

    # --- the validator ---------------------------------------------------------------

    def validate(self, forwarder: ID, msg: Any) -> bool:
        """The wire module's strict decoding and size cap, then the author's rate (once
        for a message on two of this node's topics)."""
        if self.judged[0] is msg:
            return self.judged[1]
        valid = self._validate(forwarder, msg)
        self.judged = (msg, valid)
        return valid

    def _validate(self, forwarder: ID, msg: Any) -> bool:
        author = ID(msg.from_id)
        if author == self.me:
            return True
        result = wire.decode(msg.data)  # refuses above wire.MAX_MESSAGE_BYTES first
        if isinstance(result, wire.Rejection):
            COUNTERS.rejected += 1
            count_refusal(self.refusals, author.pretty(), result.reason)
            if result.ignored:
                self._excuse(msg)
            log.info(
                "message refused",
                author=author.pretty(),
                via=forwarder.pretty(),
                reason=result.reason,
                outcome="ignored" if result.ignored else "rejected",
            )
            return False
        if not self.limiter.allow(author.pretty(), time.monotonic()):
            COUNTERS.rate_limited += 1
            count_refusal(self.refusals, author.pretty(), "rate_limited")
            self._excuse(msg)
            return False
        return True

    def _excuse(self, msg: Any) -> None:
        """This refusal is nobody's fault: no score lost, now or for later copies."""
        self.scorer.excused = True
        self._forget_copies(msg)

    def _forget_copies(self, msg: Any) -> None:
        """Later copies of ``msg`` are dropped unchecked and at no cost."""
        self.pubsub.excused[self.pubsub.get_message_id(msg)] = None
        while len(self.pubsub.excused) > EXCUSED_MEMORY:
            self.pubsub.excused.popitem(last=False)

    def _refuse_topics(self, forwarder: ID, msg: Any) -> bool:
        """protocol/SPEC.md section 2.2, *A message's topics*: refuse a message whose
        topic list repeats a topic, names a topic not of this swarm, or none this node
        joined. The author signed the list; only an author that sends it itself is
        charged (once): a relay of another version forwards such messages in good faith."""
        topics = list(msg.topicIDs)
        reason = wire.topics_refusal(topics, self.topic, self.topics)
        if reason is None:
            return False
        author = ID(msg.from_id)
        COUNTERS.rejected += 1
        count_refusal(self.refusals, author.pretty(), reason)
        log.info(
            "message refused",
            author=author.pretty(),
            via=forwarder.pretty(),
            reason=reason,
            topics=[t[:100] for t in topics[:4]],
            outcome="rejected" if forwarder == author else "ignored",
        )
        if forwarder == author:
            self.scorer.charge(forwarder, self.home)
        self._forget_copies(msg)
        return True

    # --- score penalties across connections and restarts ----------------------------

    def _remember_penalties(self, peer: ID) -> None:
        """Hold ``peer``'s penalties as its score has them (not a banned peer's: the ban
        is its punishment, and its score is forgotten with it)."""
        if peer == self.me or self.pubsub.is_peer_blacklisted(peer):
            return
        counts = self.scorer.invalid_messages.get(peer, {})
        invalid = sum(counts.get(topic, 0.0) for topic in self.topics)
        behaviour = self.scorer.behavior_penalty.get(peer, 0.0)
        self.penalties.put(peer.pretty(), invalid, behaviour, time.time())

    def _recall_penalties(self, peer: ID) -> None:
        """A peer added again takes back the penalties it left with, decayed since."""
        invalid, behaviour = self.penalties.get(peer.pretty(), time.time())
        if invalid > 0.0:
            counts = self.scorer.invalid_messages[peer]
            counts[self.home] = max(counts.get(self.home, 0.0), invalid)
        if behaviour > 0.0:
            self.scorer.behavior_penalty[peer] = max(
                self.scorer.behavior_penalty.get(peer, 0.0), behaviour
            )

    # --- loops -----------------------------------------------------------------------

    async def run(self, commands: ipc.FrameReader) -> None:
        # trap 9: pubsub and gossipsub run before the host listens or dials
        async with (
            background_trio_service(self.pubsub),
            background_trio_service(self.gossipsub),
        ):
            await self.pubsub.wait_until_ready()
            subscriptions = []
            for topic in self.topics:
                self.pubsub.set_topic_validator(topic, self.validate, False)
                subscriptions.append(await self.pubsub.subscribe(topic))
            async with (
                self.host.run(listen_addrs=self.listen),
                contextlib.AsyncExitStack() as stack,
            ):
                if self.dht is not None:
                    await stack.enter_async_context(background_trio_service(self.dht))
                await stack.enter_async_context(background_trio_service(self.circuit))
                await stack.enter_async_context(background_trio_service(self.dcutr))
                await self.out.send(
                    [
                        "ready",
                        self.me.pretty(),
                        [str(a) for a in self.host.get_addrs()],
                        [str(a) for a in self.host.get_transport_addrs()],
                    ]
                )
                log.info(
                    "network ready",
                    peer_id=self.me.pretty(),
                    addrs=[str(a) for a in self.host.get_addrs()],
                    topics=self.topics,
                    reachability=self.reachability,
                    reason=self.reason,
                )
                if self.reachability == "private":
                    log.info(
                        "this node is private: it has only LAN addresses, so peers elsewhere "
                        "cannot dial it directly; it dials out, is reached through public "
                        "nodes' relays, asks the DHT as a client and shows peers outside its "
                        "LAN no LAN address. To be public, turn UPnP on in the router, or "
                        "forward the port and pass --announce /ip4/<public IP>/tcp/<port>."
                    )
                async with trio.open_nursery() as nursery:
                    self.nursery = nursery
                    for subscription in subscriptions:
                        nursery.start_soon(self._deliver, subscription)
                    nursery.start_soon(self._report)
                    nursery.start_soon(self._discover)
                    if self.mapping is not None:
                        nursery.start_soon(self._keep_mapping)
                    if self.checks_reachability:
                        nursery.start_soon(self._check_reachability)
                    await self._obey(commands)
                    nursery.cancel_scope.cancel()

    async def _obey(self, commands: ipc.FrameReader) -> None:
        """Publish and penalise on the parent's word; exit when the parent is gone."""
        while True:
            frame = await commands.receive()
            if frame is None:
                # Tearing the services down politely can take seconds, and peers see the
                # connections close either way.
                sys.stderr.flush()
                _exit(0)
            if frame[0] == "publish":
                while not self.own_rate.allow("", time.monotonic()):
                    await trio.sleep(1.0 / self.own_rate.rate)
                await self._backpressure()
                turn, self.next_topic = self.next_topic, self.next_topic + 1
                topics = [self.publish_topics[turn % len(self.publish_topics)]]
                if self.topics_before:
                    topics.append(self.topics_before[turn % len(self.topics_before)])
                await self.pubsub.publish(topics, frame[1])
                COUNTERS.published += 1
            elif frame[0] == "penalise":
                # Only a peer with a pubsub stream: a score is forgotten with the peer, and
                # one kept for an author who is not a peer would never be.
                with contextlib.suppress(Exception):
                    author = ID.from_base58(frame[1])
                    if author in self.pubsub.peers:
                        self.scorer.charge(author, self.home)

    async def _keep_mapping(self) -> None:
        """Renew the router's port mapping at half its lease (it lapses if this process
        dies without deleting it)."""
        assert self.mapping is not None
        while True:
            await trio.sleep(upnp.RENEW_S)
            why = await upnp.call(self.mapping.renew)
            if why is not None:
                log.warning(
                    "UPnP: the router did not renew the port mapping; peers may not reach "
                    "this node at its announced address until it is mapped again",
                    addr=self.mapping.addr,
                    reason=why,
                )

    async def _backpressure(self) -> None:
        """trap 4: wait (bounded) until every live peer's outbound queue has room, so
        that a publish is queued for every peer instead of dropped for some. Only peers
        with a stream, connected and not banned count: a queue nobody drains would hold
        every publish the whole wait."""
        deadline = trio.current_time() + BACKPRESSURE_WAIT_S
        limit = int(OUTBOUND_QUEUE * BACKPRESSURE_FILL)
        while trio.current_time() < deadline:
            if all(len(q) < limit for q in self.pubsub.live_queues()):
                return
            COUNTERS.backpressure_waits += 1
            await trio.sleep(0.02)
        log.warning("peers are slow to take messages; publishing anyway")

    async def _deliver(self, subscription: Any) -> None:
        while True:
            msg = await subscription.get()
            author = ID(msg.from_id)
            if author == self.me:
                continue
            if self.topics_before:  # a message on two topics reaches both subscriptions
                msg_id = self.pubsub.get_message_id(msg)
                if msg_id in self.delivered:
                    continue
                self.delivered[msg_id] = None
                while len(self.delivered) > EXCUSED_MEMORY:
                    self.delivered.popitem(last=False)
            COUNTERS.received += 1
            await self.out.send(["message", msg.data, author.pretty()])

    async def _report(self) -> None:
        while True:
            for peer in list(self.pubsub.peers):
                self._remember_penalties(peer)
            self._prefer_direct()
            for peer in self._ban_low_scores():
                # The library resets only the pubsub stream it opened: close the whole
                # connection, so the peer's own stream to us goes too.
                with trio.move_on_after(DIAL_TIMEOUT_S), contextlib.suppress(Exception):
                    await self.host.disconnect(peer)
            await self.out.send(["stats", self.stats()])
            await trio.sleep(1.0)

    def stats(self) -> dict[str, Any]:
        topic_peers = self.topic_peers()
        meshes = [len(self.gossipsub.mesh.get(topic, ())) for topic in self.topics]
        live = {self.me, *self.pubsub.peers, *self.host.get_connected_peers()}
        return {
            "peers": len(topic_peers),
            "connected": len(self.host.get_connected_peers()),
            "mesh": min(meshes),  # the least of its topics'
            "meshes": meshes,  # per joined topic, home first
            "shards": sorted(self.my_shards) if self.shard_count > 1 else [],
            "shard_count": self.shard_count,
            "received": COUNTERS.received,
            "rejected": COUNTERS.rejected,
            "rate_limited": COUNTERS.rate_limited,
            "published": COUNTERS.published,
            # per (author, reason) since the last report, then forgotten here
            "refusals": [[a, r, n] for (a, r), n in self._take_refusals().items()],
            "bytes_in": COUNTERS.bytes_in,
            "bytes_out": COUNTERS.bytes_out,
            "bad_frames": COUNTERS.bad_frames,
            "backpressure_waits": COUNTERS.backpressure_waits,
            # peer -> when its ban ends (wall clock): the parent keeps them (peerstate.py)
            "banned": {p.pretty(): until for p, until in self.banned.items()},
            "scores": {
                p.pretty(): round(score, 2)
                for p in topic_peers
                if (score := self.scorer.score(p, self.topics)) < 0
            },
            # where state is held for peers neither connected nor in pubsub: a leak
            "stale_state": {p.pretty(): v for p, v in self.pubsub.stale_state(live).items()},
            "backoff": len(self.backoff),
            "reachability": self.reachability,
            "reachability_reason": self.reason,
            # what peers' dial-backs showed (net/autonat.py): public, private or None
            "autonat": self.autonat_verdict,
            "autonat_answers": dict(self.autonat_answers),
            "autonat_served": dict(self.autonat.dial_backs),
            "discovery_pass_s": round(self.pass_s, 3),
            "relays": len(self.relays),
            "routing_table": self.dht.get_routing_table_size() if self.dht is not None else 0,
            "dht_lan_addrs": self._dht_lan_addrs(),
            **self._connection_kinds(),
            **self._penalties_news(),
        }

    def _dht_lan_addrs(self) -> int:
        if self.dht is None:
            return 0
        with contextlib.suppress(Exception):
            return self.dht.lan_addrs_held()
        return 0

    def _conns(self, peer: ID) -> list[Any]:
        conns = self.host.get_network().connections.get(peer) or []
        return conns if isinstance(conns, list) else [conns]

    def _connection_kinds(self) -> dict[str, Any]:
        """Connections to peers, direct or through a relay (a /p2p-circuit address), in
        all and per peer ([direct, relayed])."""
        links = {}
        for peer in list(self.host.get_network().connections):
            relayed = sum(map(is_relayed, self._conns(peer)))
            links[peer.pretty()] = [len(self._conns(peer)) - relayed, relayed]
        return {
            "connections_direct": sum(d for d, _ in links.values()),
            "connections_relayed": sum(r for _, r in links.values()),
            "links": links,
            "hole_punches": self.dcutr.punched,
            "hole_punches_failed": self.dcutr.failed,
            "hole_punch_s": round(self.dcutr.punch_s, 3),
        }

    def _prefer_direct(self) -> None:
        """trap 20: a pubsub stream on a relayed connection moves to a direct one when
        there is one (after a hole punch), and one on a closed connection to another
        that is left (the library keeps a peer with a dead stream when one connection of
        two closes)."""
        if self.nursery is None:
            return
        for peer, stream in list(self.pubsub.peers.items()):
            if peer in self.handing_over:
                continue
            conns = [c for c in self._conns(peer) if not c.is_closed]
            on = next((c for c in conns if c.muxed_conn is stream.muxed_conn), None)
            dead = on is None and bool(conns)
            if dead or (on is not None and is_relayed(on) and not all(map(is_relayed, conns))):
                self.handing_over.add(peer)
                self.nursery.start_soon(self._hand_over, peer)

    async def _hand_over(self, peer: ID) -> None:
        try:
            with trio.move_on_after(DIAL_TIMEOUT_S):
                if await self.pubsub.hand_over(peer):
                    stream = self.pubsub.peers[peer]
                    on = [c for c in self._conns(peer) if c.muxed_conn is stream.muxed_conn]
                    kind = "relayed" if any(map(is_relayed, on)) else "direct"
                    log.info(
                        "pubsub stream moved to another connection", peer=peer.pretty(), kind=kind
                    )
        except Exception as exc:
            log.debug("pubsub hand-over failed", peer=peer.pretty(), error=str(exc)[:200])
        finally:
            self.handing_over.discard(peer)

    def _penalties_news(self) -> dict[str, Any]:
        """The remembered penalties, when they changed since the last report."""
        if self.penalties.version == self._penalties_sent:
            return {}
        self._penalties_sent = self.penalties.version
        return {"penalties": self.penalties.state(time.time())}

    def _take_refusals(self) -> dict[tuple[str, str], int]:
        out, self.refusals = self.refusals, {}
        return out

    def _ban_low_scores(self) -> list[ID]:
        """A peer below the graylist threshold is banned for BAN_S: forgotten at once
        (``SwarmPubsub.forget_peer``: stream, queue, mesh, router state, score), its
        messages (as forwarder or author) dropped, its new streams reset, and not
        dialled. The peers banned now are returned, for the caller to disconnect.

        A banned peer can make the node hold nothing new (its RPCs and streams are
        refused), and it is forgotten again when it disconnects; when its ban ends (or is
        evicted beyond MAX_BANNED) it is forgotten once more, which then finds nothing.
        A ban ends at a wall-clock time, and outlives this process and the node's (the
        parent keeps it: peerstate.py); its score penalties go with the ban."""
        now = time.time()
        threshold = self.scorer.params.graylist_threshold
        new = []
        for peer in list(self.topic_peers()):
            if peer not in self.banned and self.scorer.score(peer, self.topics) < threshold:
                self.banned[peer] = now + BAN_S
                self.pubsub.add_to_blacklist(peer)  # forgets it (_teardown_if_connected)
                self.penalties.drop(peer.pretty())
                self.backoff.pop(peer, None)
                new.append(peer)
                sc = self.scorer
                log.warning(
                    "peer banned for invalid messages",
                    peer=peer.pretty(),
                    seconds=BAN_S,
                    # what its score is made of: invalid messages (per topic) and the kinds
                    # of behaviour penalty (py-libp2p's)
                    invalid=round(sum(sc.invalid_messages.get(peer, {}).values()), 2),
                    behaviour=round(sc.behavior_penalty.get(peer, 0.0), 2),
                    graft_flood=round(sc.graft_flood_penalties.get(peer, 0.0), 2),
                    iwant_spam=round(sc.iwant_spam_penalties.get(peer, 0.0), 2),
                    ihave_spam=round(sc.ihave_spam_penalties.get(peer, 0.0), 2),
                    equivocation=round(sc.equivocation_penalties.get(peer, 0.0), 2),
                )
        while len(self.banned) > peerstate.MAX_BANNED:
            self._unban(self.banned.popitem(last=False)[0])
        for peer, until in list(self.banned.items()):
            if until <= now:
                del self.banned[peer]
                self._unban(peer)
        return new

    def _unban(self, peer: ID) -> None:
        self.pubsub.forget_peer(peer)  # while still banned: it has no pubsub stream
        self.pubsub.remove_from_blacklist(peer)

    async def _discover(self) -> None:
        """trap 10 / 15: re-dial bootstrap peers, announce the swarm in the DHT (a public
        node) and dial its other members, and dial peers mDNS put in the peerstore. A
        pass spends at most DIAL_PASS_S dialling, DIAL_CONCURRENCY peers at once."""
        # The swarm's key (every node's, also before shards), and in a sharded swarm each
        # joined shard's: a node finds its shards' members among their providers.
        keys = [dht_key(t) for t in self.topics if t != self.topic] + [dht_key(self.topic)]
        last_provide, provided_to, provided_relayed = -PROVIDE_EVERY_S, set(), STATE.relayed
        last_lookup = -LOOKUP_EVERY_S
        self.alone_since = trio.current_time()
        while True:
            began = trio.current_time()
            await self._resolve_bootstrap()
            connected = set(self.host.get_connected_peers())
            self._notice_alone(connected)
            for info in self.bootstrap:
                self.host.get_peerstore().add_addrs(info.peer_id, info.addrs, 3600)
            boot = {i.peer_id for i in self.bootstrap} - connected - {self.me}
            # One dialling budget a pass (SPEC.md section 2: 10 s), at most half of it for
            # the bootstrap peers, in a new order each pass: dead ones can neither starve
            # the swarm's other peers nor always hide the same live bootstrap peer.
            self.dial_left = self.dial_pass_s if self.dial_pass_s is not None else math.inf
            await self._dial_all(random.sample(list(boot), len(boot)), force=True, share=0.5)
            await self._drop_stale(connected)
            # With nobody connected there is nobody to ask (the DHT would spend its whole
            # bound dialling the peerstore, which the dial loop below does anyway).
            if self.dht is not None and self.host.get_connected_peers():
                self.dht.drop_departed()
                with trio.move_on_after(DIAL_TIMEOUT_S * 2):
                    for peer in self.host.get_connected_peers():
                        self._notice_older(peer)
                        with contextlib.suppress(Exception):
                            await self.dht.add_peer(peer)
                with trio.move_on_after(DIAL_TIMEOUT_S * 2):
                    # Announce again every PROVIDE_EVERY_S, as soon as new peers connect (an
                    # announcement made while alone reached nobody), and when this node's
                    # relayed addresses changed.
                    due = trio.current_time() - last_provide >= PROVIDE_EVERY_S
                    fresh = due or not connected <= provided_to or provided_relayed != STATE.relayed
                    # a private node announces only its addresses through relays
                    dialable = self.reachability != "private" or STATE.relayed
                    if connected and fresh and dialable:
                        for key in keys:
                            with contextlib.suppress(Exception):
                                if await self.dht.provide(key):
                                    last_provide, provided_to = trio.current_time(), connected
                                    provided_relayed = STATE.relayed
                    due = trio.current_time() - last_lookup >= LOOKUP_EVERY_S
                    if due or self._short_of_members(connected):
                        last_lookup = trio.current_time()
                        await self._look_up(keys)
            if self.reachability == "private":
                await self._reserve()
            await self._dial_known(skip=boot)
            self.pass_s = trio.current_time() - began
            await trio.sleep(self.s["redial_s"])

    async def _look_up(self, keys: list[str]) -> None:
        """Put the providers of ``keys`` (the swarm's and its shards' members) in the
        peerstore, for the dial loop."""
        for key in keys:
            with contextlib.suppress(Exception):
                for info in await self.dht.find_providers(key, 50):
                    if info.peer_id != self.me and info.addrs:
                        self.host.get_peerstore().add_addrs(info.peer_id, info.addrs, 3600)

    def _short_of_members(self, connected: set[ID]) -> bool:
        """Whether one of this node's topics has fewer than the mesh degree of its members
        connected (in a swarm of one topic, every peer is one)."""
        members: Counter[int] = Counter()
        for peer in connected:
            members.update(self.my_shards.intersection(self.shards_of(peer)))
        return any(members[i] < int(self.s["mesh_degree"]) for i in self.my_shards)

    async def _resolve_bootstrap(self) -> None:
        """Bootstrap addresses as dialable peers: /dnsaddr/ and /dns*/ names looked up
        (net/dnsaddr.py) at start and every RESOLVE_EVERY_S, so that a swarm's organiser
        can move its bootstrap nodes without a release. A failed lookup keeps the last
        answer."""
        if trio.current_time() - self.resolved_at < RESOLVE_EVERY_S or not self.s["bootstrap"]:
            return
        self.resolved_at = trio.current_time()
        addrs = list(self.s["bootstrap"])
        if any(not a.startswith(("/ip4/", "/ip6/")) for a in addrs):  # names to look up
            addrs = await trio.to_thread.run_sync(
                dnsaddr.resolve, addrs, list(self.s.get("nameservers") or [])
            )
        infos: dict[ID, PeerInfo] = {}
        for text in addrs:
            try:
                info = info_from_p2p_addr(multiaddr.Multiaddr(text))
            except Exception as exc:
                log.warning("bootstrap address skipped", addr=text, error=str(exc)[:200])
                continue
            if info.peer_id in infos:
                infos[info.peer_id].addrs.extend(info.addrs)
            else:
                infos[info.peer_id] = info
        if infos or not self.bootstrap:
            self.bootstrap = list(infos.values())

    def _notice_alone(self, connected: set[ID]) -> None:
        """Say once, in one line with what to do, that no peer was found."""
        if connected or self.alone_since is None:
            self.alone_since = None
            return
        if trio.current_time() - self.alone_since < self.s.get("alone_notice_s", ALONE_NOTICE_S):
            return
        self.alone_since = None
        if not self.s["bootstrap"]:
            log.warning(
                "no peer found: no bootstrap address is set and nobody answered on this "
                "LAN (mDNS); training alone until a peer appears. To join a swarm, pass "
                "--swarm-file FILE from its organiser, or --bootstrap /ip4/A.B.C.D/tcp/PORT/p2p/ID"
            )
        else:
            log.warning(
                "no peer found: none of the bootstrap peers answered; training alone and "
                "trying again. Check the addresses and that this machine may dial out",
                bootstrap=list(self.s["bootstrap"]),
                resolved=[str(a) for i in self.bootstrap for a in i.addrs],
            )

    async def _reserve(self) -> None:
        """A private node keeps reservations on RELAYS connected public peers that serve
        relaying, and gives peers its addresses through them (STATE.relayed): peers that cannot
        dial it directly dial it there. A relay that left takes its addresses with it."""
        connected = set(self.host.get_connected_peers())
        for relay in [r for r in self.relays if r not in connected]:
            del self.relays[relay]
        store = self.host.get_peerstore()
        for peer in connected:
            if len(self.relays) >= RELAYS or self.nursery is None:
                break
            try:
                serves = str(HOP_PROTOCOL_ID) in (store.get_protocols(peer) or ())
                addrs = [str(a) for a in store.addrs(peer) if not reach.is_lan_addr(str(a))]
            except Exception:
                continue
            if peer in self.relays or not serves or not addrs:
                continue
            ok = False
            with trio.move_on_after(DIAL_TIMEOUT_S), contextlib.suppress(Exception):
                stream = await self.host.new_stream(peer, [HOP_PROTOCOL_ID])
                ok = await self.circuits.reserve(stream, peer, self.nursery)
                await stream.close()
            if ok:
                at = [a.removesuffix(f"/p2p/{peer.pretty()}") for a in addrs]
                self.relays[peer] = [f"{a}/p2p/{peer.pretty()}/p2p-circuit" for a in at]
                log.info("relay reserved", relay=peer.pretty(), addrs=self.relays[peer])
        STATE.relayed = [a for addrs in self.relays.values() for a in addrs]

    # --- AutoNAT (trap 21, net/autonat.py) --------------------------------------------

    async def _check_reachability(self) -> None:
        """Ask connected public peers to dial this node back until their answers agree
        (autonat.verdict), act on it, and ask again every autonat.RECHECK_S while public,
        every autonat.RECHECK_PRIVATE_S while private by AutoNAT."""
        while True:
            found = await self._ask_until_sure()
            if found != self.autonat_verdict:
                await self._act_on(found)
            if self.reachability == "private":
                every = self.s.get("autonat_recheck_private_s", autonat.RECHECK_PRIVATE_S)
            else:
                every = self.s.get("autonat_recheck_s", autonat.RECHECK_S)
            await trio.sleep(every)

    async def _ask_until_sure(self) -> str:
        """Each AutoNAT server among connected peers asked once, as they connect (those
        connected together, at once); with one network's failure alone, the verdict waits
        autonat.ALONE_S for a peer outside the LAN to dial in."""
        self.autonat_answers = {}
        asked: set[ID] = set()
        dialled_in = False
        while True:
            new = [p for p in self._autonat_servers() if p not in asked][: autonat.SERVERS]
            asked.update(new)
            async with trio.open_nursery() as nursery:
                for peer in new:
                    nursery.start_soon(self._ask_dial_back, peer)
            if self.autonat_failed_at is None and autonat.FAILED in self.autonat_answers.values():
                self.autonat_failed_at = trio.current_time()
            dialled_in = dialled_in or self._dialled_in_from_outside()
            waited = trio.current_time() - (self.autonat_failed_at or math.inf)
            unreached = not dialled_in and waited >= self.s.get("autonat_alone_s", autonat.ALONE_S)
            found = autonat.verdict(self.autonat_answers.items(), unreached=unreached)
            if found is not None:
                self.autonat_failed_at = None
                return found
            await trio.sleep(max(1.0, self.s["redial_s"]))

    def _dialled_in_from_outside(self) -> bool:
        """Whether a peer outside the LAN holds a direct connection that it dialled to
        this node: one that could dial it."""
        for peer in list(self.host.get_network().connections):
            for conn in self._conns(peer):
                with contextlib.suppress(Exception):
                    inbound = conn.direction == Direction.INBOUND
                    ips = [reach.ip_of(str(a)) for a in conn.get_transport_addresses() or ()]
                    if (
                        inbound
                        and not is_relayed(conn)
                        and any(ip and not reach.is_lan(ip) for ip in ips)
                    ):
                        return True
        return False

    def _autonat_servers(self) -> list[ID]:
        """Connected peers that answer AutoNAT, over a direct connection."""
        store = self.host.get_peerstore()
        servers = []
        for peer in self.host.get_connected_peers():
            with contextlib.suppress(Exception):
                if str(autonat.PROTOCOL) in (store.get_protocols(peer) or ()) and any(
                    not is_relayed(c) for c in self._conns(peer)
                ):
                    servers.append(peer)
        return servers

    async def _ask_dial_back(self, peer: ID) -> None:
        """One server's answer, kept by its IP (several identities on one host count
        once); a server that does not answer counts for nothing."""
        ip = next(
            (
                reach.ip_of(str(a))
                for c in self._conns(peer)
                if not is_relayed(c)
                for a in (c.get_transport_addresses() or ())
            ),
            None,
        )
        if ip is None:
            return
        with contextlib.suppress(Exception):
            status, _ = await self.autonat.query_server(peer, timeout=autonat.ASK_S)
            if (
                status in (autonat.OK, autonat.FAILED)
                and self.autonat_answers.get(ip) != autonat.OK
            ):
                self.autonat_answers[ip] = status

    async def _act_on(self, found: str) -> None:
        """A node public by its address or a UPnP mapping that peers cannot dial becomes
        private; one public by --announce stays so and says which address failed."""
        self.autonat_verdict = found
        addrs = [str(a).split("/p2p/")[0] for a in self.host.get_addrs()]
        if found == "public" and self.reason == "autonat":
            await self._public_again()
            return
        if found == "public":
            log.info(
                "AutoNAT: peers dialled this node back: it is public", answers=self.autonat_answers
            )
            return
        if self.reason == "announce":
            log.warning(
                "AutoNAT: peers could not dial this node at its announced addresses; check "
                "that the router forwards the port and the firewall lets it in",
                announced=addrs,
                answers=self.autonat_answers,
            )
            return
        # the addresses peers elsewhere failed at; LAN peers still see the LAN ones
        STATE.unreachable.update(a for a in addrs if not reach.is_lan_addr(a))
        self.reachability, self.reason = "private", "autonat"
        STATE.reachability = "private"
        if self.dht is not None:
            with contextlib.suppress(Exception):
                await self.dht.switch_mode(DHTMode.CLIENT)
            self.dht.public = False
        if self.circuit.allow_hop:
            self.host.remove_stream_handler(HOP_PROTOCOL_ID)
            self.circuit.allow_hop = False
        self.host.remove_stream_handler(autonat.PROTOCOL)
        with contextlib.suppress(Exception):
            await push_identify_to_peers(self.host)  # peers forget the addresses and the DHT
        log.warning(
            "AutoNAT: peers could not dial this node back, so it is private: a firewall or "
            "the router blocks its port. It now asks the DHT as a client, relays nothing and "
            "is reached through public nodes' relays. To be public, open the TCP port (or "
            "forward it): it asks peers again every few minutes.",
            recheck_s=self.s.get("autonat_recheck_private_s", autonat.RECHECK_PRIVATE_S),
            unreachable=addrs,
            answers=self.autonat_answers,
        )

    async def _public_again(self) -> None:
        """A node private by AutoNAT that peers now dial back: public as at start."""
        STATE.unreachable.clear()
        self.reachability, self.reason = "public", self.reason_at_start
        STATE.reachability = "public"
        self.relays.clear()
        STATE.relayed = []
        if self.dht is not None:
            with contextlib.suppress(Exception):
                await self.dht.switch_mode(DHTMode.SERVER)
            self.dht.public = True
        if self.s.get("relay_reservations", 0) > 0:
            self.circuit.allow_hop = True
            self.host.set_stream_handler(HOP_PROTOCOL_ID, self.circuit._handle_hop_stream)
        self.host.set_stream_handler(autonat.PROTOCOL, self.autonat.handle_stream)
        with contextlib.suppress(Exception):
            await push_identify_to_peers(self.host)
        log.warning(
            "AutoNAT: peers now dial this node back, so it is public again: it serves the "
            "DHT and relays, and shows peers its addresses",
            answers=self.autonat_answers,
        )

    async def _drop_stale(self, connected: set[ID]) -> None:
        """A connection whose pubsub stream never came up (a handshake lost under load)
        carries nothing: drop it, so that the next pass dials afresh."""
        now = time.monotonic()
        for peer in list(self.no_pubsub_since):
            if peer not in connected or peer in self.pubsub.peers:
                del self.no_pubsub_since[peer]
        for peer in connected:
            if peer in self.pubsub.peers:
                continue
            since = self.no_pubsub_since.setdefault(peer, now)
            if now - since > STALE_S:
                log.info("dropping a connection without pubsub", peer=peer.pretty())
                del self.no_pubsub_since[peer]
                with trio.move_on_after(DIAL_TIMEOUT_S), contextlib.suppress(Exception):
                    await self.host.disconnect(peer)

    async def _dial_known(self, *, skip: set[ID]) -> None:
        """Dial the peers in the peerstore that are not connected, banned, backing off
        or in ``skip`` (dialled already in this pass)."""
        store = self.host.get_peerstore()
        connected = set(self.host.get_connected_peers())
        known = store.peers_with_addrs()
        prune_backoff(self.backoff, time.monotonic(), set(known) - set(self.banned), MAX_BACKOFF)
        room = self.s["max_peers"] - len(connected)
        now = time.monotonic()
        fresh = [
            p
            for p in known
            if p != self.me
            and p not in connected
            and p not in self.banned
            and p not in skip
            and self.backoff.get(p, (0.0, 0.0))[0] <= now
            and not self._foreign(p)
        ]
        await self._dial_all(self._shard_first(fresh, connected, room))

    def _foreign(self, peer: ID) -> bool:
        """Whether identify showed that ``peer`` speaks none of the swarm's protocols (its
        pubsub, its DHT): an IPFS node that dialled this one, say. Such a peer is not
        dialled for the swarm; one not identified yet (a bootstrap address, a provider,
        a peer mDNS found) is."""
        try:
            protocols = self.host.get_peerstore().get_protocols(peer) or []
        except Exception:  # not in the peerstore
            return False
        return bool(protocols) and not any(p in protocols for p in (*PROTOCOLS, DHT_PROTOCOL))

    def _notice_older(self, peer: ID) -> None:
        """Say once per connection that ``peer`` runs the DHT of sapo-node 0.3 and before
        (IPFS's protocol id): groups still pass, but the DHTs are apart (SPEC.md
        section 2, *Discovery*)."""
        if peer in self.older_noticed:
            return
        try:
            protocols = self.host.get_peerstore().get_protocols(peer) or []
        except Exception:
            return
        older = LIBRARY_DHT_PROTOCOL in protocols and DHT_PROTOCOL not in protocols
        if older and any(p in protocols for p in PROTOCOLS):
            self.older_noticed[peer] = None
            log.warning(
                "a peer runs an older sapo-node (its DHT is IPFS's /ipfs/kad/1.0.0): "
                "groups pass, but neither finds the other's peers through the DHT or "
                "mDNS; it should upgrade",
                peer=peer.pretty(),
            )

    def _shard_first(self, fresh: list[ID], connected: set[ID], room: int) -> list[ID]:
        """Of ``fresh`` peers, those to dial: ``room`` of them, peers that share a shard
        with this node first; and beyond ``room``, members of a joined shard that has
        fewer than the mesh degree connected (up to that many), so that a node whose
        connections are full of other shards' peers still meshes on each of its own."""
        if self.shard_count <= 1:
            return fresh[: max(room, 0)]
        degree = int(self.s["mesh_degree"])
        members = {i: 0 for i in self.my_shards}
        for peer in connected:
            for i in self.my_shards.intersection(self.shards_of(peer)):
                members[i] += 1
        mine = [p for p in fresh if self.my_shards.intersection(self.shards_of(p))]
        taken = set(mine)
        ordered = mine + [p for p in fresh if p not in taken]
        chosen = ordered[: max(room, 0)]
        for peer in mine[max(room, 0) :]:
            short = [i for i in self.my_shards.intersection(self.shards_of(peer))
                     if members[i] < degree]  # fmt: skip
            if short:
                chosen.append(peer)
                for i in short:
                    members[i] += 1
        return chosen

    async def _dial_all(self, peers: list[ID], *, force: bool = False, share: float = 1.0) -> None:
        """Dial ``peers``, DIAL_CONCURRENCY at once, for at most ``share`` of what is left
        of the pass's DIAL_PASS_S: addresses that lead nowhere (a NAT'd peer's LAN
        address, a node that left) cost a pass at most that long in all, however many
        there are, and their peers back off."""
        if not peers:
            return
        slots = trio.CapacityLimiter(self.dial_concurrency)

        async def one(peer: ID) -> None:
            async with slots:
                await self._dial(peer, force=force)

        started = trio.current_time()
        with trio.move_on_after(self.dial_left * share):
            async with trio.open_nursery() as nursery:
                for peer in peers:
                    nursery.start_soon(one, peer)
        self.dial_left = max(0.0, self.dial_left - (trio.current_time() - started))

    async def _dial(self, peer: ID, *, force: bool = False) -> bool:
        now = time.monotonic()
        next_try, delay = self.backoff.get(peer, (0.0, self.s["redial_s"]))
        if not force and now < next_try:
            return False
        info = self.host.get_peerstore().peer_info(peer)
        # The library refuses every dial to a peer for 60 s after one failed (its
        # "negative cache"), so a peer back from a restart went unheard for a minute;
        # our own backoff decides when to try again.
        with contextlib.suppress(Exception):
            self.host.get_network().unblock_peer(peer)
        circuits = [str(a) for a in info.addrs if "/p2p-circuit" in str(a)]
        direct = [a for a in info.addrs if "/p2p-circuit" not in str(a)]
        # A private node dials a peer it cannot reach directly through a relay (a public
        # one is dialled by such peers itself). A direct address of a peer that has
        # relayed ones is a guess (one a punch learnt, say), and a home router drops a
        # dial to it unanswered: it gets half the time, so that the relays get theirs.
        circuits = circuits if self.reachability == "private" else []
        with trio.move_on_after(DIAL_TIMEOUT_S / 2 if circuits else DIAL_TIMEOUT_S):
            try:
                if direct:
                    await self.host.connect(PeerInfo(peer, direct))
                    self.backoff.pop(peer, None)
                    return True
            except Exception as exc:
                log.debug("dial failed", peer=peer.pretty(), error=str(exc)[:200])
        with trio.move_on_after(DIAL_TIMEOUT_S):
            for addr in circuits:
                if f"/p2p/{self.me.pretty()}/" in addr:
                    continue  # a circuit through this node
                target = (
                    addr
                    if addr.endswith(f"/p2p/{peer.pretty()}")
                    else f"{addr}/p2p/{peer.pretty()}"
                )
                try:
                    await self.circuits.dial(multiaddr.Multiaddr(target))
                    self.backoff.pop(peer, None)
                    return True
                except Exception as exc:
                    log.debug("relayed dial failed", peer=peer.pretty(), error=str(exc)[:200])
        self.backoff[peer] = (now + delay, min(delay * 2, 300.0))
        return False


def prune_backoff(
    backoff: dict[Any, tuple[float, float]], now: float, dialable: set[Any], limit: int
) -> None:
    """Forget the redial delays of peers that cannot be dialled now (their addresses
    expired, or they are banned) and of peers whose next try is more than the longest
    delay (300 s) past (nobody tried: they start afresh); then, past ``limit``, those
    due soonest.

    >>> b = {"gone": (0.0, 1.0), "old": (10.0, 2.0), "due": (900.0, 4.0), "later": (990.0, 8.0)}
    >>> prune_backoff(b, 1000.0, {"old", "due", "later"}, 1)
    >>> b
    {'later': (990.0, 8.0)}
    """
    for peer in [
        p for p, (next_try, _) in backoff.items() if p not in dialable or now - next_try > 300.0
    ]:
        del backoff[peer]
    if len(backoff) > limit:
        for peer in sorted(backoff, key=lambda p: backoff[p][0])[: len(backoff) - limit]:
            del backoff[peer]


async def _main(in_fd: int, out_fd: int) -> int:
    commands = ipc.FrameReader(trio.lowlevel.FdStream(in_fd))
    out = ipc.FrameWriter(trio.lowlevel.FdStream(out_fd))
    first = await commands.receive()
    if first is None or first[0] != "settings":
        return 2
    settings = first[1]
    configure_logging(json_logs=settings.get("json_logs", False))
    try:
        patches.apply()  # a py-libp2p they do not fit: one line, as the fatal error
        check_ports_free([multiaddr.Multiaddr(a) for a in settings["listen"]])
        mapping = await _map_port(settings)
        network = Network(settings, out, mapping)
    except (NetError, ValueError) as exc:
        await out.send(["fatal", str(exc)])
        return 1
    failure = None
    try:
        await network.run(commands)
    except* ipc.PeerGone:  # the node exited without a word: nothing left to serve
        pass
    except* OSError as group:  # listen failures surface here
        failure = f"cannot listen on {settings['listen']}: {group.exceptions[0]}"
    if failure is None:
        return 0
    await out.send(["fatal", failure])
    return 1


async def _map_port(settings: dict[str, Any]) -> upnp.Mapping | None:
    """A node that would be private, with net.upnp on, asks its home router to map its
    TCP listen port (at most upnp.DISCOVER_S). Given a mapping, it announces the router's
    external address (so it reads public, reason upnp), deletes the mapping when it stops,
    and renews it meanwhile (Network._keep_mapping). One log line either way."""
    if not settings.get("upnp") or settings["announce"] or settings.get("reachability") != "auto":
        return None
    shown = announced_addresses(settings["listen"], [])
    if reach.decide("auto", [], shown) != "private":
        return None
    ports = [
        int(parts[4])
        for parts in (a.split("/") for a in settings["listen"])
        if len(parts) > 4 and parts[1] == "ip4" and parts[3] == "tcp"
    ]
    if not ports or ports[0] == 0:
        log.info(
            "UPnP not tried: the TCP listen port is chosen at start (port 0); give a "
            "fixed one (net.listen) for the router to map",
            listen=settings["listen"],
        )
        return None
    result = await upnp.open_mapping(ports[0])
    if isinstance(result, str):
        log.info("UPnP: no port mapping, this node stays private", reason=result)
        return None
    log.info(
        "UPnP: the router maps a TCP port to this node, which is public at its address",
        addr=result.addr,
        to=f"{result.lan_ip}:{result.port}",
        lease_s=upnp.LEASE_S,
    )
    settings["announce"] = [result.addr]
    _AT_EXIT.append(lambda: upnp.delete_now(result))
    # The parent stops this process with SIGUSR1 (main): delete the mapping first.
    signal.signal(signal.SIGUSR1, lambda *_: _exit(0))
    return result


_AT_EXIT: list[Any] = []  # bounded cleanups before this process exits (a UPnP mapping's)


def _run_at_exit() -> None:
    """The cleanups in _AT_EXIT, once (each bounded by itself)."""
    while _AT_EXIT:
        with contextlib.suppress(Exception):
            _AT_EXIT.pop()()


def _exit(code: int) -> None:
    """Exit now, after the cleanups in _AT_EXIT."""
    _run_at_exit()
    os._exit(code)


def _watch_parent(parent_pid: int) -> None:
    """Exit as soon as the parent is gone, even while the event loop is busy (a publish
    waiting out backpressure reads no command, and so no end of stdin, for 10 s)."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    _exit(0)


def main() -> None:
    # Frames own stdout; anything printed by a library goes to stderr instead.
    out_fd = os.dup(1)
    os.dup2(2, 1)
    # The parent decides when to stop: a SIGINT or SIGTERM sent to the whole process
    # group reaches this process too, and dying of it made the node restart its network
    # while stopping. The parent stops it with SIGUSR1 (its default action ends it; with
    # a UPnP mapping, _map_port's handler deletes the mapping first).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    # py-libp2p logs routine events (a failed dial, a stream refused by a busy peer) as
    # errors, several lines each. What matters is logged here in our own words (bad
    # frames, bans, restarts); SAPO_LIBP2P_LOG=DEBUG shows the library's own logs.
    level = os.environ.get("SAPO_LIBP2P_LOG", "CRITICAL").upper()
    for name in ("libp2p", "multiaddr", "zeroconf", "aioquic", "async_service"):
        logging.getLogger(name).setLevel(level)
    code = trio.run(_main, 0, out_fd)
    _run_at_exit()  # a fatal error after a mapping
    sys.exit(code)


if __name__ == "__main__":
    main()
