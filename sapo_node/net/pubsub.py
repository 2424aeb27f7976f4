"""The network's pubsub behaviour: GossipSub with the swarm's scoring, bans and limits.

The library's Pubsub, GossipSub and scorer, subclassed where py-libp2p 0.8.1 falls short
of a swarm (each place in docs/libp2p.md, *Pubsub*), and :class:`Pubsub`, the part of
the network (net/network.py) that validates, publishes, delivers, penalises and bans.
Where the library forgets a peer in pieces (a ban, a disconnect after one),
``SwarmPubsub.forget_peer`` forgets it everywhere at once, and the network's stats
report any per-peer state still held for a peer that is gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import weakref
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

import structlog
import trio
from libp2p.peer.id import ID
from libp2p.pubsub import pubsub as pubsub_module
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.score import PeerScorer, ScoreParams, TopicScoreParams
from libp2p.pubsub.validators import signature_validator

from sapo_node.intake import peerstate, wire
from sapo_node.intake.pool import RateLimiter
from sapo_node.logs import QuietLog
from sapo_node.net import (
    count_refusal,
    patches,
)
from sapo_node.net.patches import OUTBOUND_QUEUE
from sapo_node.net.state import COUNTERS

log = structlog.get_logger("sapo_node.net")

PROTOCOLS = ["/meshsub/1.2.0", "/meshsub/1.1.0", "/meshsub/1.0.0"]


BACKPRESSURE_FILL = 0.5  # publish waits while a peer's queue is fuller than this


BACKPRESSURE_WAIT_S = 10.0


# A receiver resets the stream of a peer that sends an RPC above this, dropping it from
# pubsub. js-libp2p sends up to 4 MiB, so the limit is above that, and the real cap
# (wire's, under 1 MiB) is enforced in the validator, where an oversized message is
# refused instead of cutting the link (docs/libp2p.md#message-size).
INBOUND_RPC_LIMIT = 8 * 2**20


# Digests of (author, seqno) kept for the equivocation check, where the library kept every
# whole message it saw, forever.
EQUIVOCATION_MEMORY = 8192


EXCUSED_MEMORY = 8192  # signed messages refused through no sender's fault (id, digest)


BAN_S = 600.0  # a peer whose score falls below the graylist threshold is ignored this long


MAX_PENALISED = 10_000  # peers whose score penalties are remembered beyond their connection


SCORE_DECAY = 0.999  # per 1 s heartbeat, of invalid messages and behaviour penalties


# Message ids of valid messages are remembered this long (refreshed on each sighting):
# memory is bounded by the authors' rate limit times this. Content duplicates are the
# pool's job, for its max_age_s.
SEEN_TTL_S = 120


# A refusal that costs its forwarder nothing (a relayed message its author got wrong,
# another version's) is logged at most once per forwarder this often: a peer holding
# many keys can sign such messages under each and forward them at will. The counters
# (COUNTERS.rejected, the refusals by author and reason) count every one.
REFUSAL_LOG_S = 60.0


MAX_QUIET_FORWARDERS = 1024  # forwarders whose refusal lines are held back, remembered


def signed_digest(msg: Any) -> bytes:
    """A digest of what an author signs of a message (its author, seqno, data and topic
    list). Once the signature is checked, no one but the author can make another message
    with this digest; the library's message id (author + seqno) anyone can claim."""
    h = hashlib.sha256()
    for part in (msg.from_id, msg.seqno, msg.data, *(t.encode() for t in msg.topicIDs)):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.digest()


class SwarmScorer(PeerScorer):
    """The library's scorer, except that for one message a forwarder is charged at most
    once, and not at all when the validator *ignored* the message (another version, a
    rate limit): only a sender's fault is counted.

    py-libp2p charges the forwarder of a refused message once for each entry of the
    message's topic list, which the author chooses and signs: with ``[A, A]`` each
    refusal cost an honest relay twice, and the excuse covered one entry.
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
        messages instead of every whole message forever (docs/libp2p.md#equivocation-memory)."""
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
        # Messages refused through no fault of whoever relays them (another version, the
        # author over its rate), only once their signature is checked: message id ->
        # ``signed_digest``. Further copies (same digest) are dropped unchecked and at no
        # cost, where the library would answer from its validation cache and charge each
        # honest relay as for an invalid message. The id finds the entry cheaply; the
        # digest, which no one but the author can match, decides.
        self.excused: OrderedDict[bytes, bytes] = OrderedDict()
        # seqnos from nanoseconds: the library's, from seconds, made a node restarted
        # within seconds reuse seqnos peers had seen, and its messages were dropped as
        # duplicates (docs/libp2p.md#sequence-numbers)
        self.counter = time.time_ns()
        self._write_locks: weakref.WeakKeyDictionary[Any, trio.Lock] = weakref.WeakKeyDictionary()
        self.writing = 0  # writes to peers' streams in hand (``drained``)
        # The network loop's own per-peer maps, forgotten with the library's state.
        self.own_peer_maps: list[dict[ID, Any]] = []
        self.on_forget: Any = None  # called with a peer just before it is forgotten
        # called with (forwarder, message) once its signature is checked, before the
        # library's checks: True if it refused the message for its topic list
        # (PubsubBehaviour._refuse_topics)
        self.refuse_topics: Any = None

    # --- forgetting a peer -------------------------------------------------------------
    #
    # py-libp2p 0.8.1 forgets a peer in pieces. A ban (``add_to_blacklist``) drops the
    # peer's stream and subscriptions but keeps its outbound queue, its place in the mesh
    # and fanout and the router's state (protocol, IDONTWANT, scores): GossipSub went on
    # queueing an IDONTWANT for every message to it, and nothing drained the queue. When
    # the peer then disconnects, ``_handle_dead_peer`` returns early for a peer without a
    # stream, so that state stayed for good; at half the queue full, backpressure held
    # every own publish 10 s, and own publishing stopped. So a ban and a
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

    def drained(self) -> bool:
        """Whether everything queued for live peers is written to their streams: their
        queues are empty and no write is in hand (a sending task pops a message and
        starts its write without yielding in between)."""
        return self.writing == 0 and not any(len(q) for q in self.live_queues())

    async def hand_over(self, peer: ID) -> bool:
        """Move this node's pubsub stream to ``peer`` onto the connection the swarm now prefers
        (a direct one over a relayed one: docs/libp2p.md#hole-punching), keeping the peer's
        place in the mesh and what its queue holds; the old stream is closed once its writer
        is done, which the peer reads as an end of that stream only. True if moved."""
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
        """One writer at a time per stream: the queue and the replay interleaved large
        frames on one yamux stream, which crashed the receiving side
        (docs/libp2p.md#serialised-writes)."""
        lock = self._write_locks.setdefault(stream, trio.Lock())
        self.writing += 1
        try:
            async with lock:
                ok = await super().write_msg(stream, rpc_msg)
        finally:
            self.writing -= 1
        if ok:
            COUNTERS.bytes_out += rpc_msg.ByteSize()
        return ok

    async def stream_handler(self, stream: Any) -> None:
        """A malformed frame resets that peer's stream, never the whole host: in the
        library a decode error leaves the stream handler and ends the host's event loop
        (docs/libp2p.md#malformed-frames).

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
        """Each received message is checked in a task of its own, outside the stream handler
        (docs/libp2p.md#malformed-frames), and an exception there (a junk public key in a message,
        say) ends the whole host. Such a message is dropped and counted as a bad frame.

        The library drops, unvalidated and at no cost, messages from a peer whose score
        is below the publish threshold, so invalid messages alone could never take a
        peer down to the graylist and the ban. Here each such message costs as an
        invalid one: a peer that goes on sending once refused is banned.

        Nothing a message says is believed before its signature is checked here (the
        library checks it only after its own gates, and again): not its topic list, and
        not its id, which a forger could otherwise have excused ahead of the author's
        real message, and so silence the author."""
        excused = self.excused.get(self.get_message_id(msg))
        if excused is not None and excused == signed_digest(msg):
            return
        scorer = self.router.scorer
        fresh = (
            not self.is_peer_blacklisted(msg_forwarder)
            and not self.is_peer_blacklisted(ID(msg.from_id))
            and not self._is_msg_seen(msg)
        )
        if fresh and not self._signed(msg_forwarder, msg):
            return
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

    def _signed(self, forwarder: ID, msg: Any) -> bool:
        """The author's signature holds (or signing is off). A message whose signature
        fails is its forwarder's fault, whoever it names as author: honest peers check
        signatures before they forward (strict signing). It is counted as a bad frame
        and costs the forwarder as an invalid message; it is logged at debug only, since
        a forger chooses how many there are."""
        if not self.strict_signing:
            return True
        try:
            if signature_validator(msg):
                return True
        except Exception:  # a key that does not parse
            pass
        COUNTERS.bad_frames += 1
        log.debug("message with a bad signature", via=str(forwarder))
        if self.router.scorer is not None:
            self.router.scorer.charge(forwarder, msg.topicIDs[0] if msg.topicIDs else "")
        return False


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


class PubsubBehaviour:
    """The network's pubsub behaviour, one of the parts net/network.py's Network is made
    of: the validator (wire decoding, the authors' rates, the topic list), publishing
    with backpressure, delivery to the node, the parent's penalties, and bans. Its state,
    made in ``_init_pubsub``: ``gossipsub``, ``scorer``, ``pubsub``, the rate limiters,
    ``banned``, ``penalties`` and ``refusals``; it reads the network's ``host``, ``me``
    and ``topics``."""

    def _init_pubsub(self, settings: dict[str, Any]) -> None:
        """GossipSub, its scorer and pubsub; the authors' rates; bans and score penalties
        kept across connections and restarts."""
        # a message on two topics meets the validator once per topic and reaches both
        # subscriptions: it is checked and handed on once
        self.judged: tuple[Any, bool] = (None, False)
        self.delivered: OrderedDict[bytes, None] = OrderedDict()
        self.next_topic = 0  # own groups go to the joined topics in turn
        degree = settings["mesh_degree"]
        self.gossipsub = SwarmGossipSub(
            protocols=PROTOCOLS,
            degree=degree,
            degree_low=max(1, degree * 2 // 3),
            degree_high=degree * 2,
            # The library's heartbeat is 120 s, and adaptive gossip stretches it further in
            # a swarm smaller than the mesh degree: meshes would take minutes to form and
            # repair (docs/libp2p.md#heartbeat).
            heartbeat_interval=1,
            heartbeat_initial_delay=0.1,
            adaptive_gossip_enabled=False,
            # The library's spam protection stops forwarding, silently, past 10 messages a
            # second per topic per forwarder, own publishes included; each author is
            # rate-limited in the validator instead (docs/libp2p.md#spam-protection).
            spam_protection_enabled=False,
            score_params=score_params(),
            eclipse_protection_enabled=False,
        )
        self.scorer = SwarmScorer(self.gossipsub.scorer.params, self.topics)
        self.gossipsub.scorer = self.scorer
        # The default message id (author + seqno) is kept: the library's message cache
        # ignores a custom id function, and SPEC section 2 requires the default of every
        # implementation so that gossip recovery works between them.
        self.pubsub = SwarmPubsub(
            self.host,
            self.gossipsub,
            strict_signing=True,  # the author is the signer; unsigned messages are dropped
            max_inbound_rpc_size=INBOUND_RPC_LIMIT,
            seen_ttl=SEEN_TTL_S,
            validation_cache_size=4096,
        )
        patches.check_state(self.pubsub, patches.PUBSUB_STATE, "Pubsub")
        patches.check_state(self.gossipsub, patches.ROUTER_STATE, "GossipSub")
        patches.check_state(self.scorer, patches.SCORER_STATE, "PeerScorer")
        self.limiter = RateLimiter(settings["rate_per_author"], settings["burst_per_author"])
        # Peers refuse an author above this rate (their pool's limit, presumed equal to
        # ours): publishing faster only loses groups, so this node waits instead.
        self.own_rate = RateLimiter(settings["rate_per_author"], settings["burst_per_author"])
        self.refusals: dict[tuple[str, str], int] = {}  # (author, reason) -> n, bounded
        self.quiet_refusals = QuietLog(REFUSAL_LOG_S, MAX_QUIET_FORWARDERS)
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

    def topic_peers(self) -> set[ID]:
        """Peers subscribed to any topic this node joined."""
        return {p for topic in self.topics for p in self.pubsub.peer_topics.get(topic, ())}

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
            self._log_refusal(forwarder, author, result.reason, charged=not result.ignored)
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
        """Later copies of ``msg``, whose signature is checked, are dropped unchecked and
        at no cost."""
        self.pubsub.excused[self.pubsub.get_message_id(msg)] = signed_digest(msg)
        while len(self.pubsub.excused) > EXCUSED_MEMORY:
            self.pubsub.excused.popitem(last=False)

    def _refuse_topics(self, forwarder: ID, msg: Any) -> bool:
        """protocol/SPEC.md section 2.2, *A message's topics*: refuse a message whose
        topic list repeats a topic, names a topic not of this swarm, or none this node
        joined. Called once the signature is checked: the author signed the list, so a
        refusal counts against the author, and only an author that sends it itself is
        charged (once): a relay of another version forwards such messages in good faith."""
        topics = list(msg.topicIDs)
        reason = wire.topics_refusal(topics, self.topic, self.topics)
        if reason is None:
            return False
        author = ID(msg.from_id)
        COUNTERS.rejected += 1
        count_refusal(self.refusals, author.pretty(), reason)
        self._log_refusal(
            forwarder,
            author,
            reason,
            charged=forwarder == author,
            topics=[t[:100] for t in topics[:4]],
        )
        if forwarder == author:
            self.scorer.charge(forwarder, self.home)
        self._forget_copies(msg)
        return True

    def _log_refusal(
        self, forwarder: ID, author: ID, reason: str, charged: bool, **fields: Any
    ) -> None:
        """The line for a refused message. One its forwarder is charged for is logged
        each time (a few, then the forwarder is banned); one nobody pays for at most
        once per forwarder each REFUSAL_LOG_S, the next saying how many were not logged
        (``not_logged``)."""
        if not charged:
            held = self.quiet_refusals.take(forwarder, time.monotonic())
            if held is None:
                return
            if held:
                fields["not_logged"] = held
        log.info(
            "message refused",
            author=author.pretty(),
            via=forwarder.pretty(),
            reason=reason,
            outcome="rejected" if charged else "ignored",
            **fields,
        )

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

    async def _backpressure(self) -> None:
        """Wait (bounded) until every live peer's outbound queue has room
        (docs/libp2p.md#outbound-queues), so that a publish is queued for every peer instead of
        dropped for some. Only peers with a stream, connected and not banned count: a queue nobody
        drains would hold every publish the whole wait."""
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
