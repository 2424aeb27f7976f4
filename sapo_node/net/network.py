"""The network: one host driving the swarm's behaviours.

:class:`Network` builds the py-libp2p host and composes the behaviours, each a part of
its own with the state it keeps: pubsub (net/pubsub.py), discovery (net/discovery.py),
reachability (net/reachability.py). It runs their loops, obeys the node's commands
(publish, penalise) and reports its stats each second. The process around it is
net/host.py; what the behaviours share with the library's hooks is net/state.py.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import multiaddr
import structlog
import trio
from libp2p import new_host
from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.discovery.mdns.mdns import MDNSDiscovery
from libp2p.peer.id import ID
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service

from sapo_node.net import (
    identity,
    ipc,
    patches,
    upnp,
)
from sapo_node.net.discovery import (
    DIAL_TIMEOUT_S,
    MDNS_SERVICE,
    DiscoveryBehaviour,
)
from sapo_node.net.pubsub import (
    PubsubBehaviour,
)
from sapo_node.net.reachability import (
    ReachabilityBehaviour,
    interface_addresses,
)
from sapo_node.net.state import COUNTERS

log = structlog.get_logger("sapo_node.net")
REFUSED_NOTICE_S = 60.0  # connections refused at the limits: one log line at most this often


class Network(PubsubBehaviour, DiscoveryBehaviour, ReachabilityBehaviour):
    """The host, pubsub, DHT and the loops around them."""

    def __init__(
        self,
        settings: dict[str, Any],
        out: ipc.FrameWriter,
        mapping: upnp.Mapping | None = None,
        *,
        exit_now: Callable[[int], Any],
    ) -> None:
        """``exit_now``: ends the process at once when the parent is gone (its cleanups
        first; tearing the services down politely could take seconds)."""
        self.s, self.out = settings, out
        self.exit_now = exit_now
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
        self.shard_count = int(settings.get("shards", 1))
        self.shards_joined = int(settings.get("shards_joined", 1))
        self.key = identity.load(Path(settings["key"]))
        self.listen = [multiaddr.Multiaddr(a) for a in settings["listen"]]
        announce = [multiaddr.Multiaddr(a) for a in settings["announce"]]
        self.host = new_host(
            key_pair=self.key,
            # Noise only: the library's default list also offers secio and plaintext
            sec_opt={
                NOISE_PROTOCOL_ID: NoiseTransport(
                    self.key, noise_privkey=create_new_x25519_key_pair().private_key
                )
            },
            muxer_preference="YAMUX",
            listen_addrs=self.listen,
            announce_addrs=announce or None,
            addrs_factory=None if announce else interface_addresses,
            # docs/libp2p.md#connection-limits: net.max_connections in all, room kept
            # for the net.max_peers this node dials
            connection_config=patches.connection_config(
                settings["max_connections"], settings["max_peers"]
            ),
        )
        # docs/libp2p.md#connection-limits: each address's share of the accepted
        # connections, and a newcomer takes the slot of a peer that gives nothing (a
        # private node reserved on this node's relay keeps one)
        self.accepted = patches.guard_swarm(
            self.host.get_network(),
            per_ip=settings.get("max_inbound_per_ip"),
            per_net=settings.get("max_inbound_per_net"),
            gives=self._gives,
            reserved=self._holds_reservation,
            prune_after_s=settings.get("inbound_prune_after_s", patches.PRUNE_AFTER_S),
        )
        self.mdns: MDNSDiscovery | None = None
        if settings["mdns"]:
            # The swarm's service name, not IPFS's (the host's own mDNS takes none, so it
            # is made here; the host starts it when it listens); it announces the
            # interfaces' addresses, as go-libp2p does, not the raw listen ones (announce
            # ones are for peers elsewhere): docs/libp2p.md#mdns-addresses.
            transport_addrs = self.host.get_transport_addrs
            self.mdns = self.host.mDNS = MDNSDiscovery(
                self.host.get_network(),
                service_type=MDNS_SERVICE,
                host=SimpleNamespace(
                    get_transport_addrs=lambda: interface_addresses(transport_addrs())
                ),
            )
            # the peers it found are on this node's LAN (DiscoveryBehaviour.on_lan)
            patches.check_state(self.mdns.listener, ("discovered_services",), "mDNS's listener")
        self.me = self.host.get_id()
        # The behaviours, each with the state it keeps (net/pubsub.py, net/reachability.py,
        # net/discovery.py): the DHT's mode follows the reachability decided before it.
        self._init_pubsub(settings)
        self._init_reachability(settings, announce, mapping)
        self._init_discovery(settings)
        self.nursery: trio.Nursery | None = None  # for the behaviours' own tasks
        self.refused_said = (0, -REFUSED_NOTICE_S)  # inbound_refused when last logged, when

    async def run(self, commands: ipc.FrameReader) -> None:
        # Pubsub and gossipsub run before the host listens or dials: with peers dialled
        # first, the node never became ready (docs/libp2p.md#start-order)
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
                self.exit_now(0)
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
            elif frame[0] == "flush":
                # Every publish before this frame is in pubsub's queues: answer once
                # they are written to the peers' streams (at most frame[2] seconds).
                drained = await self._drained(float(frame[2]))
                await self.out.send(["flushed", frame[1], drained])
            elif frame[0] == "penalise":
                # Only a peer with a pubsub stream: a score is forgotten with the peer, and
                # one kept for an author who is not a peer would never be.
                with contextlib.suppress(Exception):
                    author = ID.from_base58(frame[1])
                    if author in self.pubsub.peers:
                        self.scorer.charge(author, self.home)

    async def _drained(self, within_s: float) -> bool:
        """Wait until no peer's outbound queue holds anything and no write to a peer's
        stream is in hand; False if that took longer than ``within_s``."""
        with trio.move_on_after(within_s):
            while not self.pubsub.drained():
                await trio.sleep(0.01)
            return True
        return False

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
            self._notice_refused()
            await self.out.send(["stats", self.stats()])
            await trio.sleep(1.0)

    def _gives(self, peer: ID) -> bool:
        """Whether ``peer`` gives this node anything: it is in one of its meshes, or
        delivered a message to it first (the scorer counts those while it is connected).
        When every inbound slot is taken, one that gives nothing makes room."""
        router = getattr(self, "gossipsub", None)
        if router is None:
            return True
        if any(peer in peers for peers in router.mesh.values()):
            return True
        scorer = router.scorer
        return (
            scorer is not None and sum(scorer.first_message_deliveries.get(peer, {}).values()) > 0
        )

    def _notice_refused(self) -> None:
        """Say, at most once in REFUSED_NOTICE_S, that connections dialled to this node
        were refused at its limits (docs/libp2p.md#connection-limits)."""
        (said, at), now = self.refused_said, time.monotonic()
        if COUNTERS.inbound_refused > said and now - at >= REFUSED_NOTICE_S:
            log.warning(
                "connections dialled to this node refused at its limit: raise "
                "net.max_connections if peers cannot join through it",
                refused=COUNTERS.inbound_refused - said,
                connections=len(self.host.get_network().get_connections()),
                max_connections=self.s["max_connections"],
                accepted_at_most=self.s["max_connections"] - self.s["max_peers"],
            )
            self.refused_said = (COUNTERS.inbound_refused, now)

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
            "inbound_refused": COUNTERS.inbound_refused,  # at net.max_connections' limits
            "inbound": sum(a.conn is not None for a in self.accepted),  # dialled to it, held
            "inbound_capped": COUNTERS.inbound_capped,  # of those, at an address's share
            "inbound_pruned": COUNTERS.inbound_pruned,  # closed for a newcomer: gave nothing
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
            "discovery_passes": self.passes,
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
