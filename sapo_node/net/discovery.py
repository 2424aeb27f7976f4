"""The network's discovery behaviour: dialling with backoff, bootstrap peers, the DHT.

:class:`Discovery` runs a pass every ``net.redial_s``: bootstrap peers (their names
looked up again every RESOLVE_EVERY_S) re-dialled, the swarm's topics announced in the
DHT by a public node and their providers looked up, and the peers known dialled, those
of this node's shards first, DIAL_CONCURRENCY at a time within DIAL_PASS_S; a peer that
fails backs off (docs/libp2p.md, *Host and discovery*). :class:`SwarmDHT` is the
library's Kademlia with a routing table of servers only (docs/libp2p.md#dht-routing-table).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import multiaddr
import structlog
import trio
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr

from sapo_node import addresses
from sapo_node.intake import wire
from sapo_node.net import dnsaddr, patches
from sapo_node.net.patches import DHT_PROTOCOL, LIBRARY_DHT_PROTOCOL
from sapo_node.net.pubsub import PROTOCOLS
from sapo_node.net.state import STATE

log = structlog.get_logger("sapo_node.net")

# The swarm's own mDNS service name (protocol/SPEC.md section 2, *Discovery*), not IPFS's
# _p2p._udp.local.: on it a node found the IPFS nodes on its LAN and dialled them (its DHT
# protocol id, DHT_PROTOCOL, is set in net/patches.py).
MDNS_SERVICE = "_sapo._udp.local."


MAX_BACKOFF = 10_000  # peers whose redial delay is remembered


DIAL_TIMEOUT_S = 5.0


DIAL_CONCURRENCY = 8  # dials at once in a discovery pass


DIAL_PASS_S = 2 * DIAL_TIMEOUT_S  # the most a pass spends dialling (peers that fail back off)


RESOLVE_EVERY_S = 600.0  # bootstrap names (/dnsaddr/, /dns4/) are looked up again this often


ALONE_NOTICE_S = 60.0  # a node still without a peer this long after start says so, once


STALE_S = 15.0  # a connection without a pubsub stream this long is dropped and redialled


# A public node announces its topics in the DHT again this often, and whenever peers it
# has not announced to connect (records live 48 h; each announcement is a lookup that
# every peer it asks pays for, and at 24 nodes the DHT was a large share of the CPU).
PROVIDE_EVERY_S = 600.0


# A node with at least the mesh degree of its topics' members connected looks their
# providers up this often, not every pass: each lookup costs every peer it asks, and at
# 24 nodes the DHT was a large share of a member's network CPU (docs/scale.md#shown-to-hold).
LOOKUP_EVERY_S = 60.0
# The most an announcement in the DHT or a lookup of its members takes; each runs in the
# background, one at a time (DiscoveryBehaviour._announce, _look_up).
DHT_QUERY_S = 45.0


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


class SwarmDHT(KadDHT):
    """py-libp2p's DHT puts a peer in its routing table when it opens a DHT stream ("so it
    MUST be a server": a client asks questions too) or before identify said what it
    speaks, and peers it merely heard of from others. A routing table that holds clients
    hands their addresses to everyone as the closest peers. Here a peer is taken only once
    identify says it serves the DHT, and, by a public node, only with an address outside
    the LAN ranges; a peer that lists an IPv4-mapped address is taken by no node: the
    table hands on every address a peer lists, and a mapped one leads whoever dials it
    to its own network (docs/libp2p.md#dht-routing-table). An asker outside this node's
    LAN (``on_lan``: patches.on_lan) is handed no address of another peer that leads
    inside (docs/libp2p.md#addresses-from-strangers)."""

    def __init__(
        self,
        host: Any,
        mode: DHTMode,
        *,
        public: bool,
        on_lan: Callable[[ID], bool] | None = None,
    ) -> None:
        super().__init__(host, mode)
        self.public = public
        self.on_lan = on_lan or (lambda peer: patches.on_lan(host.get_network(), peer))
        # A provider record is handed to whoever asks: a public node keeps only the
        # addresses that lead somewhere (an old or hostile node may still send LAN ones),
        # and what it provides shows no LAN address of a private node.
        patches.guard_dht(self, self.admits, lambda: self.public)

    def _add_closer_peers_to_response(
        self, response: Any, closest_peers: Any, exclude_peer_id: ID | None = None
    ) -> None:
        """The library's closer peers (FIND_NODE, GET_PROVIDERS, GET_VALUE answers, with
        each peer's addresses from the peerstore), less, for an asker outside this node's
        LAN (``exclude_peer_id``; unknown counts as outside), each address of another peer
        that leads inside: the peerstore keeps those of a peer on this node's LAN
        (addresses.from_others). A peer left with none is left out. Its signed record went
        through the peerstore's guard (patches.guard_peerstore)."""
        super()._add_closer_peers_to_response(response, closest_peers, exclude_peer_id)
        if exclude_peer_id is not None and self.on_lan(exclude_peer_id):
            return
        me = self.host.get_id().to_bytes()
        for i in reversed(range(len(response.closerPeers))):
            peer = response.closerPeers[i]
            if peer.id == me:
                continue  # its own addresses: identify's rule (STATE.shown)
            kept = [a for a in peer.addrs if addresses.leads_outside(_text(a))]
            if not kept:
                del response.closerPeers[i]
            elif len(kept) < len(peer.addrs):
                del peer.addrs[:]
                peer.addrs.extend(kept)

    def lan_addrs_held(self) -> int:
        """LAN addresses this DHT would hand out: its routing table's peers' and those in
        its provider records (0 on a public node, whatever its peers are)."""
        store = self.host.get_peerstore()
        addrs = [str(a) for p in self.routing_table.get_peer_ids() for a in store.addrs(p)]
        for records in self.provider_store.providers.values():
            addrs += [str(a) for r in records.values() for a in r.addresses]
        return sum(map(addresses.is_lan_addr, addrs))

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
        if any(map(addresses.is_mapped_addr, addrs)):
            return False
        if not self.public:
            return bool(addrs)
        return any(addresses.ip_of(a) is not None and not addresses.is_lan_addr(a) for a in addrs)


def _text(addr: bytes) -> str:
    """A multiaddr's bytes as text ('' when they do not parse: leads nowhere)."""
    try:
        return str(multiaddr.Multiaddr(addr))
    except Exception:
        return ""


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


class DiscoveryBehaviour:
    """The network's discovery behaviour, one of the parts net/network.py's Network is
    made of: the discovery pass, its dials and their backoff, bootstrap peers, the DHT.
    Its state, made in ``_init_discovery``: ``dht``, ``bootstrap``, ``backoff``,
    ``my_shards``, the pass's bounds and ``add_given``; it reads the network's ``host``,
    ``me``, ``topics``, ``reachability`` and ``mdns``, guards the host's peerstore, runs
    its DHT queries in the network's ``nursery``, and reserves relays in a private node's
    pass."""

    def _init_discovery(self, settings: dict[str, Any]) -> None:
        """The DHT (a server on a node others can dial), bootstrap peers, and the dial
        loop's bounds and backoff."""
        # The peerstore keeps no address that leads into this node's LAN at a stranger's
        # word, and the swarm dials what it keeps (docs/libp2p.md#addresses-from-strangers);
        # bootstrap addresses, the user's, go in through the library's own add_addrs.
        self.add_given = patches.guard_peerstore(
            self.host.get_peerstore(), lambda: self.reachability == "local", self.on_lan
        )
        self.dht = None
        if settings["dht"]:
            # A private node asks the DHT but serves it not: public peers could not dial it
            mode = DHTMode.CLIENT if self.reachability == "private" else DHTMode.SERVER
            self.dht = SwarmDHT(
                self.host, mode, public=self.reachability == "public", on_lan=self.on_lan
            )
        self.bootstrap: list[PeerInfo] = []
        self.resolved_at = -RESOLVE_EVERY_S
        self.alone_since: float | None = None  # set at the first discovery pass
        self.pass_s = 0.0  # how long the last discovery pass took
        self.passes = 0  # discovery passes ended
        # A pass dials this many peers at once, for at most this long (None: no bound).
        self.dial_concurrency = int(settings.get("dial_concurrency", DIAL_CONCURRENCY))
        self.dial_pass_s: float | None = settings.get("dial_pass_s", DIAL_PASS_S)
        self.dial_left = math.inf  # of the pass under way: its bootstrap and other dials share it
        self.my_shards = set(self.shards_of(self.me))
        self.backoff: dict[ID, tuple[float, float]] = {}  # peer -> (next try, delay)
        self.no_pubsub_since: dict[ID, float] = {}
        self.pubsub.own_peer_maps.append(self.no_pubsub_since)
        self.older_noticed: dict[ID, None] = {}  # peers said to run an older DHT
        self.pubsub.own_peer_maps.append(self.older_noticed)
        # The last announcement in the DHT: when, to which peers, with which relayed
        # addresses; and whether one, or a lookup, is under way (_announce, _look_up).
        self.provided: tuple[float, set[ID], list[str]] = (-PROVIDE_EVERY_S, set(), [])
        self.announcing = self.looking_up = False

    def on_lan(self, peer: ID) -> bool:
        """Whether ``peer`` is on this node's LAN or machine: mDNS found it (the network's
        ``mdns``), or it holds a direct connection from a LAN address (patches.on_lan)."""
        if self.mdns is not None:
            with contextlib.suppress(RuntimeError):  # mDNS's thread changed it meanwhile
                found = list(self.mdns.listener.discovered_services.values())
                if any(p == peer for p, _ in found):
                    return True
        return patches.on_lan(self.host.get_network(), peer)

    def trusts(self, peer: ID) -> bool:
        """Whether this node dials any address others give for ``peer``, LAN and loopback
        ones included: it is local, or ``peer`` is on its LAN (addresses.from_others)."""
        return self.reachability == "local" or self.on_lan(peer)

    def shards_of(self, peer: ID) -> tuple[int, ...]:
        """The shards ``peer`` joins, by the swarm's rule (wire.shards_of): any node
        computes them from the peer's ID, so it knows whom to dial for its own."""
        return wire.shards_of(peer.to_bytes(), self.shard_count, self.shards_joined)

    async def _discover(self) -> None:
        """Re-dial bootstrap peers, announce the swarm in the DHT (a public node) and dial
        its other members, and dial peers mDNS put in the peerstore. A pass spends at most
        DIAL_PASS_S dialling, DIAL_CONCURRENCY peers at once. Bootstrap peers are dialled
        every pass because the library drops one after 3 failed dials and never tries it
        again: a swarm that met through one hub would split for good when the hub went
        (docs/libp2p.md#bootstrap-re-dial)."""
        # The swarm's key (every node's, also before shards), and in a sharded swarm each
        # joined shard's: a node finds its shards' members among their providers.
        keys = [dht_key(t) for t in self.topics if t != self.topic] + [dht_key(self.topic)]
        last_lookup = -LOOKUP_EVERY_S
        self.alone_since = trio.current_time()
        while True:
            began = trio.current_time()
            await self._resolve_bootstrap()
            connected = set(self.host.get_connected_peers())
            self._notice_alone(connected)
            for info in self.bootstrap:
                self.add_given(info.peer_id, info.addrs, 3600)
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
                    last_provide, provided_to, provided_relayed = self.provided
                    due = trio.current_time() - last_provide >= PROVIDE_EVERY_S
                    fresh = due or not connected <= provided_to or provided_relayed != STATE.relayed
                    # a private node announces only its addresses through relays
                    dialable = self.reachability != "private" or STATE.relayed
                    if connected and fresh and dialable and not self.announcing and self.nursery:
                        self.announcing = True
                        self.nursery.start_soon(self._announce, keys, connected)
                    due = trio.current_time() - last_lookup >= LOOKUP_EVERY_S
                    short = self._short_of_members(connected)
                    if (due or short) and not self.looking_up and self.nursery:
                        last_lookup = trio.current_time()
                        self.looking_up = True
                        self.nursery.start_soon(self._look_up, keys)
            if self.reachability == "private":
                await self._reserve()
            await self._dial_known(skip=boot)
            self.pass_s = trio.current_time() - began
            self.passes += 1
            await trio.sleep(self.s["redial_s"])

    async def _announce(self, keys: list[str], connected: set[ID]) -> None:
        """Provide ``keys`` in the DHT, in the background and for DHT_QUERY_S at most: the
        library's lookup and its ADD_PROVIDER messages wait out peers that lead nowhere
        (10 s a dial, a lookup up to 30 s), such as a node that read public and that
        AutoNAT has since found unreachable; a pass must not wait with them, nor cut the
        announcement of a node's relayed addresses short every time
        (docs/libp2p.md#provider-lookups)."""
        relayed = list(STATE.relayed)
        try:
            with trio.move_on_after(DHT_QUERY_S):
                for key in keys:
                    with contextlib.suppress(Exception):
                        if await self.dht.provide(key):
                            self.provided = (trio.current_time(), connected, relayed)
        finally:
            self.announcing = False

    async def _look_up(self, keys: list[str]) -> None:
        """Put the providers of ``keys`` (the swarm's and its shards' members) in the
        peerstore, for the dial loop; in the background and for DHT_QUERY_S at most, as
        an announcement (_announce)."""
        try:
            with trio.move_on_after(DHT_QUERY_S):
                for key in keys:
                    with contextlib.suppress(Exception):
                        for info in await patches.find_providers(self.dht, key, 50):
                            if info.peer_id != self.me and info.addrs:
                                store = self.host.get_peerstore()
                                store.add_addrs(info.peer_id, info.addrs, 3600)
        finally:
            self.looking_up = False

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
