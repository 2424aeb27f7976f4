"""Every change the network makes to py-libp2p's internals, in one place, checked.

The network process (``net/host.py``) calls :func:`apply` once, before it builds the
host. It refuses, in one line (:class:`PatchError`, which the process sends its parent
as its fatal error), to run on a py-libp2p other than :data:`LIBP2P_VERSION`, or when a
symbol the node replaces, or a method its subclasses of the library's classes override,
is gone: a patch that silently stops applying after an upgrade is the worst outcome.
docs/libp2p.md#patches lists each patch, what it fixes and its upstream status.

Three kinds of change:

- module functions and classes replaced (:data:`REPLACED`), in the module that defines
  them and in every loaded py-libp2p module that imported them (those that should see
  the node's version), or in one module only (those meant for one user);
- methods overridden by the node's subclasses (``net/pubsub.py``, ``net/discovery.py``,
  ``net/reachability.py``, ``net/autonat.py``): :data:`OVERRIDDEN` names each, and
  :func:`apply` checks the library still has it (a renamed one would no longer be called);
- hooks set on one object (the DHT's routing table and provider store): :func:`guard_dht`,
  with the same checks; :func:`find_providers` sets one for the length of a call;
  :func:`guard_swarm` (the swarm's inbound handler and auto-connector), with the swarm's
  limits from :func:`connection_config`; :func:`guard_peerstore` (what the peerstore
  keeps of the addresses others give, and the signed records it hands on).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import multiaddr
import structlog
import trio

from sapo_node import addresses
from sapo_node.net import NetError
from sapo_node.net.state import COUNTERS, STATE

LIBP2P_VERSION = "0.8.1"
# RPCs a peer's outbound queue holds: the library's 32 dropped a burst beyond them,
# silently (docs/libp2p.md#outbound-queues).
OUTBOUND_QUEUE = 512
# The swarm's DHT protocol id (protocol/SPEC.md section 2, *Discovery*), for the library's
# IPFS one: on that, the swarm's DHT joined the public IPFS DHT.
# docs/libp2p.md#the-dhts-protocol-id
DHT_PROTOCOL = "/sapo/kad/1.0.0"
LIBRARY_DHT_PROTOCOL = "/ipfs/kad/1.0.0"
DOCS = "docs/libp2p.md#patches"
# An accepted peer that gives nothing (no mesh, no delivery) keeps its slot this long
# before a newcomer may take it: time to join a mesh, and no churn from a flood of dials.
PRUNE_AFTER_S = 60.0
PRUNE_WAIT_S = 2.0  # a newcomer waits this long for the slot of the peer pruned for it


class PatchError(NetError):
    """py-libp2p is not what the patches were written for (one line)."""


@dataclass(frozen=True)
class Replaced:
    """``module.name`` replaced by ``make()``'s result; ``everywhere``: also in every
    loaded py-libp2p module that holds the original (imported it by name)."""

    module: str
    name: str
    anchor: str  # its section in docs/libp2p.md
    everywhere: bool


# library class -> the methods the node's subclasses override or call as their own
OVERRIDDEN: dict[str, tuple[str, ...]] = {
    "libp2p.pubsub.pubsub:Pubsub": (
        "push_msg", "stream_handler", "write_msg", "handle_subscription", "_handle_dead_peer",
        "_teardown_if_connected", "_clear_pending_announce_retries_for_peer",
        "_forget_all_subscriptions", "_peer_is_connected", "_is_msg_seen",
        "handle_sending_messages", "get_hello_packet", "is_peer_blacklisted",
    ),
    "libp2p.pubsub.gossipsub:GossipSub": (
        "add_peer", "remove_peer", "handle_rpc", "handle_prune", "_check_equivocation",
    ),
    "libp2p.pubsub.score:PeerScorer": (
        "on_invalid_message", "allow_publish", "penalize_behavior", "penalize_equivocation",
    ),
    "libp2p.pubsub.rpc_queue:RpcQueue": ("close",),
    "libp2p.relay.circuit_v2.dcutr:DCUtRProtocol": (
        "initiate_hole_punch", "_perform_hole_punch", "_schedule_relay_close",
        "_close_relayed_conns_after_grace", "_get_observed_addrs",
    ),
    "libp2p.host.autonat.autonat:AutoNATService": (
        "handle_stream", "_try_dial", "_handle_request", "_observed_ip", "_filter_by_observed_ip",
    ),
    "libp2p.kad_dht.kad_dht:KadDHT": ("_add_closer_peers_to_response",),
    "libp2p.kad_dht.routing_table:RoutingTable": ("add_peer",),
    "libp2p.kad_dht.provider_store:ProviderStore": ("add_provider",),
    "libp2p.network.swarm:Swarm": ("unblock_peer",),
}  # fmt: skip

# Attributes the node reads or resets on the library's objects, checked on each object
# as the network builds it (they are set in ``__init__``, not on the class).
PUBSUB_STATE = (
    "peers", "peer_queues", "peer_topics", "counter", "blacklisted_peers",
    "_peer_added_events", "_subscription_events", "_peer_subscription_count",
    "_replayed_recent_topics", "_pending_announce_retries",
)  # fmt: skip
ROUTER_STATE = (
    "mesh", "fanout", "back_off", "peer_protocol", "dont_send_message_ids",
    "_pending_messages", "_pending_control", "iwant_request_limits",
    "ihave_message_limits", "graft_flood_tracking", "equivocation_detection", "scorer",
)  # fmt: skip
SCORER_STATE = (
    "params", "time_in_mesh", "first_message_deliveries", "mesh_message_deliveries",
    "invalid_messages", "behavior_penalty", "app_specific_scores", "ip_by_peer",
    "graft_flood_penalties", "iwant_spam_penalties", "ihave_spam_penalties",
    "equivocation_penalties",
)  # fmt: skip

REPLACED = (
    # bytes received on pubsub streams are counted (the stats' bytes_in)
    Replaced("libp2p.pubsub.pubsub", "read_varint_prefixed_bytes_limited", "message-size", False),
    Replaced("libp2p.pubsub.pubsub", "RpcQueue", "outbound-queues", False),
    Replaced(
        "libp2p.identity.identify.identify", "_mk_identify_protobuf",
        "addresses-shown-to-peers", True,
    ),
    Replaced("libp2p.peer.peerstore", "env_to_send_in_RPC", "addresses-shown-to-peers", True),
    # Kademlia's protocol id: kad_dht, peer_routing, provider_store and value_store import
    # it by name; routing_table reads common's when it checks a peer serves the DHT
    Replaced("libp2p.kad_dht.common", "PROTOCOL_ID", "the-dhts-protocol-id", True),
)  # fmt: skip

# Modules known to import a symbol replaced everywhere: imported before the scan.
_USERS = (
    "libp2p.identity.identify_push.identify_push",
    "libp2p.pubsub.pubsub",
    "libp2p.pubsub.gossipsub",
    "libp2p.pubsub.floodsub",
    "libp2p.kad_dht.kad_dht",
    "libp2p.kad_dht.peer_routing",
    "libp2p.kad_dht.provider_store",
    "libp2p.kad_dht.value_store",
)

_original: dict[tuple[str, str], Any] = {}  # (module, name) -> the library's own


def installed_version() -> str:
    return importlib.metadata.version("libp2p")


def apply() -> None:
    """Check py-libp2p and apply every module-level patch (again: a no-op). Raises
    :class:`PatchError`, one line, when the library is not what they were written for."""
    found = installed_version()
    if found != LIBP2P_VERSION:
        raise PatchError(
            f"py-libp2p {found} is installed; the network's patches were written for "
            f"{LIBP2P_VERSION} ({DOCS}): install libp2p=={LIBP2P_VERSION}"
        )
    for where, names in OVERRIDDEN.items():
        cls = _symbol(*where.split(":"))
        missing = [n for n in names if not callable(getattr(cls, n, None))]
        if missing:
            raise PatchError(_missing(where.replace(":", "."), missing))
    for name in _USERS:
        importlib.import_module(name)
    if _original:
        return  # applied: the library's own are kept in _original
    found_all = {(t.module, t.name): _symbol(t.module, t.name) for t in REPLACED}
    kad = found_all[("libp2p.kad_dht.common", "PROTOCOL_ID")]
    if kad != LIBRARY_DHT_PROTOCOL:  # another id: the library's DHT is not what we patch
        raise PatchError(_missing("libp2p.kad_dht.common", [f"PROTOCOL_ID {LIBRARY_DHT_PROTOCOL}"]))
    _original.update(found_all)
    replacements = _replacements()
    for target in REPLACED:
        new, original = replacements[target.name], _original[(target.module, target.name)]
        setattr(sys.modules[target.module], target.name, new)
        for module in _holders(original) if target.everywhere else ():
            namespace = vars(sys.modules[module])
            for name in [n for n, value in namespace.items() if value is original]:
                setattr(sys.modules[module], name, new)


def still_holding() -> list[str]:
    """``module.name`` of each loaded py-libp2p module that still holds a library
    function :func:`apply` replaces there (empty once applied)."""
    out = []
    for target in REPLACED:
        original = _original.get((target.module, target.name))
        if original is None:
            out.append(f"{target.module}.{target.name} (not applied)")
            continue
        if target.everywhere:
            out += [f"{m}.{target.name}" for m in _holders(original)]
        elif getattr(sys.modules[target.module], target.name) is original:
            out.append(f"{target.module}.{target.name}")
    return sorted(out)


def warn_unless_holding() -> list[str]:
    """What :func:`still_holding` finds, in one warning line if anything: the network
    process asks once its parts are built, when the library modules it uses are loaded.
    A module found there imported a replaced function in a way :func:`apply` did not
    foresee (a library change, most likely) and uses the library's own: the line names
    it for whoever runs the node, and the network runs on."""
    stale = still_holding()
    if stale:
        structlog.get_logger("sapo_node.net").warning(
            f"py-libp2p patches do not hold everywhere ({DOCS})", still_the_librarys=stale
        )
    return stale


def check_state(obj: Any, names: Iterable[str], what: str) -> None:
    """The attributes ``names`` the node uses on the library's object ``obj``."""
    missing = [n for n in names if not hasattr(obj, n)]
    if missing:
        raise PatchError(_missing(what, missing))


def guard_dht(dht: Any, admits: Callable[[Any], bool], public: Callable[[], bool]) -> None:
    """docs/libp2p.md#dht-routing-table: the routing table takes a peer only when
    ``admits`` it (identify says it serves the DHT, from an address others can dial);
    the provider store keeps no IPv4-mapped address, and a public node's none in the LAN
    ranges (addresses.is_lan: judged by the IPv4 address an IPv6 one embeds); and what this
    node provides shows only what a stranger may see."""
    from libp2p.peer.peerinfo import PeerInfo

    check_state(dht, ("routing_table", "provider_store", "host"), "the DHT")
    table, store = dht.routing_table, dht.provider_store
    check_state(store, ("add_provider", "host", "providers"), "the DHT's provider store")
    library_add, library_provide = table.add_peer, store.add_provider

    async def add_peer(peer: Any, *, skip_server_mode_check: bool = False) -> bool:
        peer_id = peer.peer_id if isinstance(peer, PeerInfo) else peer
        if not admits(peer_id):
            return False
        return await library_add(peer, skip_server_mode_check=True)

    def add_provider(key: bytes, provider: Any) -> None:
        addrs = [a for a in provider.addrs if not addresses.is_mapped_addr(str(a))]
        if public():
            addrs = [a for a in addrs if not addresses.is_lan_addr(str(a))]
        if addrs:
            library_provide(key, PeerInfo(provider.peer_id, addrs))

    table.add_peer = add_peer
    store.add_provider = add_provider
    store.host = StrangerFacingHost(store.host)


def on_lan(swarm: Any, peer: Any) -> bool:
    """Whether ``peer`` holds a direct connection with this node whose other end is an
    address in the LAN ranges: it is on this node's LAN, or on this machine. A relayed
    connection does not count (its socket is the relay's)."""
    from libp2p.connection_types import ConnectionType

    for conn in swarm.get_connections(peer):
        with contextlib.suppress(Exception):
            muxed = conn.muxed_conn
            remote = muxed.get_remote_address()
            direct = muxed.get_connection_type() != ConnectionType.RELAYED
            if direct and remote and addresses.is_lan(remote[0]):
                return True
    return False


def guard_peerstore(
    store: Any, local: Callable[[], bool], on_lan: Callable[[Any], bool]
) -> Callable[..., None]:
    """docs/libp2p.md#addresses-from-strangers: of the addresses others give for a peer
    (identify, a DHT answer, a signed peer record, a hole punch, peer exchange: each is
    put in the peerstore through ``add_addrs``), the peerstore keeps those
    addresses.from_others allows: LAN and loopback ones and names only when this node is
    ``local`` or the peer is ``on_lan``. The swarm dials what the peerstore holds
    (discovery's dials, the DHT's lookups, a relay's, peer exchange's), so none leads
    into this node's LAN at a stranger's word. And unless the node is local, it hands on
    (``get_peer_record``: the DHT's answers and peer exchange attach them whole) no signed
    peer record that lists an address leading inside, which it cannot cut. Returns the
    library's own ``add_addrs``, for the addresses the user gave (bootstrap)."""
    check_state(store, ("add_addrs", "get_peer_record"), "the peerstore")
    library_add, library_record = store.add_addrs, store.get_peer_record

    def add_addrs(peer_id: Any, addrs: Iterable[Any], ttl: int = 0) -> None:
        given = list(addrs)
        kept = addresses.from_others(given, lambda: local() or on_lan(peer_id))
        if kept or not given:
            library_add(peer_id, kept, ttl)

    def get_peer_record(peer_id: Any) -> Any:
        envelope = library_record(peer_id)
        if envelope is None or local():
            return envelope
        try:
            listed = [str(a) for a in envelope.record().addrs]
        except Exception:  # a record that does not decode is handed to nobody
            return None
        return envelope if all(map(addresses.leads_outside, listed)) else None

    store.add_addrs, store.get_peer_record = add_addrs, get_peer_record
    return library_add


async def find_providers(dht: Any, key: str, count: int) -> list[Any]:
    """docs/libp2p.md#provider-lookups: the providers of ``key``. The library answers
    from this node's own provider records whenever it holds one, asking nobody, and a
    node that announced itself always holds its own: a DHT client (a private node), whose
    records are only its own and those it kept from when it served, never again found
    a member in the DHT. A client asks the network; a server keeps the library's way
    (peers' announcements reach it)."""
    from libp2p.kad_dht.kad_dht import DHTMode

    check_state(dht, ("mode", "provider_store", "find_providers"), "the DHT")
    store = dht.provider_store
    check_state(store, ("get_providers",), "the DHT's provider store")
    if dht.mode != DHTMode.CLIENT:
        return await dht.find_providers(key, count)
    store.get_providers = lambda _key: []  # the lookup's local shortcut, for this call
    try:
        return await dht.find_providers(key, count)
    finally:
        del store.get_providers


def connection_config(max_connections: int, dialled: int) -> Any:
    """docs/libp2p.md#connection-limits: the swarm's limits, for ``new_host``. The library
    refuses a connection past ``max_connections``, dialled or accepted, when it registers
    it; its inbound limiter (``max_connections`` less ``min_connections``) keeps
    ``dialled`` connections for the node's own dials; the pruner, which starts above the
    high watermark, never runs (nothing registers above it)."""
    from libp2p.network.config import ConnectionConfig

    return ConnectionConfig(
        max_connections=max_connections,
        min_connections=dialled,
        low_watermark=dialled,
        high_watermark=max_connections,
    )


@dataclass(eq=False)  # each is one connection: found by identity
class Accepted:
    """A connection dialled to this node, from when it is accepted until it closes:
    where from (its IP as addresses.judged writes it, and addresses.network_of), since when,
    and, once the handshake named it, its peer and swarm connection."""

    ip: str
    net: str
    since: float
    peer: Any = None
    conn: Any = None
    pruned: bool = False


def over_cap(held: list[Accepted], new: Accepted, per_ip: int | None, per_net: int | None) -> bool:
    """Whether ``new`` would pass its address's share of the accepted connections:
    ``per_ip`` from one IP, ``per_net`` from one /24 or /48 (None: no cap).

    >>> at = lambda ip: Accepted(ip, addresses.network_of(ip), 0.0)
    >>> held = [at("198.18.0.1"), at("198.18.0.2")]
    >>> over_cap(held, at("198.18.0.1"), 1, 8), over_cap(held, at("198.18.0.3"), 1, 2)
    (True, True)
    >>> over_cap(held, at("198.18.1.1"), 1, 2), over_cap(held, at("198.18.0.3"), None, None)
    (False, False)
    """
    same_ip = sum(a.ip == new.ip for a in held)
    same_net = sum(a.net == new.net for a in held)
    return (per_ip is not None and same_ip >= per_ip) or (
        per_net is not None and same_net >= per_net
    )


def least_giving(
    held: list[Accepted],
    now: float,
    gives: Callable[[Any], bool],
    after_s: float,
    reserved: Callable[[Any], bool] = lambda peer: False,
) -> Accepted | None:
    """The accepted connection to close for a newcomer when every slot is taken: one
    whose peer gives this node nothing (``gives``: no mesh, no delivery) though it has
    had ``after_s`` to; of those, one from the network (/24, /48) that holds the most,
    the oldest first. A peer that holds a reservation on this node's relay (``reserved``)
    keeps its oldest connection: peers reach it through this node. None when every one
    gives, is kept or is too new.

    >>> old = lambda ip, t, peer: Accepted(ip, addresses.network_of(ip), t, peer, object())
    >>> held = [old("198.18.0.1", 0.0, "a"), old("198.18.1.1", 5.0, "b")]
    >>> held.append(old("198.18.1.2", 9.0, "c"))
    >>> least_giving(held, 100.0, lambda p: False, 60.0).peer  # the /24 holding two
    'b'
    >>> least_giving(held, 100.0, lambda p: p != "a", 60.0).peer
    'a'
    >>> least_giving(held, 100.0, lambda p: False, 60.0, reserved=lambda p: p == "b").peer
    'c'
    >>> least_giving(held, 50.0, lambda p: False, 60.0) is None  # none had its time
    True
    """
    nets = Counter(a.net for a in held)
    idle = [
        a
        for a in held
        if a.conn is not None and not a.pruned and now - a.since >= after_s and not gives(a.peer)
    ]
    kept: dict[Any, Accepted] = {}  # each reservation holder's oldest connection
    for a in sorted(idle, key=lambda a: a.since):
        if a.peer not in kept and reserved(a.peer):
            kept[a.peer] = a
    closable = [a for a in idle if kept.get(a.peer) is not a]
    return min(closable, key=lambda a: (-nets[a.net], a.since), default=None)


def guard_swarm(
    swarm: Any,
    *,
    per_ip: int | None = None,
    per_net: int | None = None,
    gives: Callable[[Any], bool] = lambda peer: True,
    reserved: Callable[[Any], bool] = lambda peer: False,
    prune_after_s: float = PRUNE_AFTER_S,
) -> list[Accepted]:
    """docs/libp2p.md#connection-limits: an accepted connection holds its inbound slot
    while it lives (the library's handler holds it until the swarm stops, so a node that
    had accepted its share, in all its life, accepted no more). One IP holds at most
    ``per_ip`` accepted connections and one /24 or /48 ``per_net`` (an IPv6 address
    that embeds an IPv4 one counts as it: addresses.network_of), so that one host with many
    identities cannot take every slot. When every slot is taken, a newcomer takes the
    slot of a peer that gives nothing (:func:`least_giving`), but not the oldest
    connection of a peer ``reserved`` on this node's relay: that one still counts in its
    address's share, and the relay's limit (net.relay_reservations) bounds how many are
    kept so. A connection refused for want of a slot, at ``max_connections`` or at its
    address's cap is counted (``inbound_refused``, ``inbound_capped``), one closed for a
    newcomer too (``inbound_pruned``). A direct connection from outside the LAN accepted
    while the node is public is noted (``STATE.dialled_in_at``): AutoNAT's evidence that
    peers can dial it. The library's auto-connector dials nobody: discovery dials, within
    ``net.max_peers``. Returns the list of accepted connections it keeps."""
    from libp2p.abc import IMuxedConn
    from libp2p.network.connection.raw_connection import RawConnection

    check_state(
        swarm,
        (
            "_handle_inbound_connection", "_inbound_limiter", "_build_remote_multiaddr",
            "connection_gate", "connection_config", "upgrade_inbound_raw_conn",
            "get_connections", "auto_connector",
        ),
        "the swarm",
    )  # fmt: skip
    check_state(swarm.auto_connector, ("maybe_connect",), "the swarm's auto-connector")
    library_inbound, slots = swarm._handle_inbound_connection, swarm._inbound_limiter
    held: list[Accepted] = []

    def take_slot() -> bool:
        if len(swarm.get_connections()) >= swarm.connection_config.max_connections:
            return False
        return _acquired(slots)

    async def make_room() -> bool:
        """Close the connection of a peer that gives nothing, and take its slot."""
        gone = least_giving(held, trio.current_time(), gives, prune_after_s, reserved)
        if gone is None:
            return False
        gone.pruned = True
        COUNTERS.inbound_pruned += 1
        with contextlib.suppress(Exception):
            await gone.conn.close()
        with trio.move_on_after(PRUNE_WAIT_S):
            # its slot comes back as it starts closing; the swarm lets it go just after
            while gone.conn in swarm.get_connections() or not take_slot():
                await trio.sleep(0.02)
            return True
        return False

    def refuse(capped: bool = False) -> None:
        COUNTERS.inbound_refused += 1
        COUNTERS.inbound_capped += capped

    async def handle_inbound(conn: Any, maddr: multiaddr.Multiaddr) -> None:
        if isinstance(conn, IMuxedConn):  # QUIC and its kind: the node listens on TCP only
            await library_inbound(conn, maddr)
            return
        remote = None
        with contextlib.suppress(Exception):
            remote = swarm._build_remote_multiaddr(conn)
        ip = addresses.ip_of(str(remote)) if remote is not None else None
        seen = addresses.judged(ip) if ip else None  # ::ffff:a.b.c.d counts as a.b.c.d
        where = str(seen) if seen else "unknown"
        me = Accepted(where, addresses.network_of(where), trio.current_time())
        if over_cap(held, me, per_ip, per_net):
            refuse(capped=True)
            with contextlib.suppress(Exception):
                await conn.close()
            return
        held.append(me)  # counted from now: a crowd dialling at once sees its own
        try:
            if not take_slot() and not await make_room():
                refuse()
                with contextlib.suppress(Exception):
                    await conn.close()
                return
            raw = None
            try:
                if remote is not None and not await swarm.connection_gate.is_allowed(remote):
                    await conn.close()
                    return
                raw = RawConnection(conn, False)
                muxed = await swarm.upgrade_inbound_raw_conn(raw, maddr)
                for live in swarm.get_connections(muxed.peer_id):
                    if live.muxed_conn is muxed:
                        me.peer, me.conn = muxed.peer_id, live
                        if STATE.reachability == "public" and ip and not addresses.is_lan(ip):
                            STATE.dialled_in_at = time.monotonic()
                        await live.event_closed.wait()
                        break
            except Exception:
                with contextlib.suppress(Exception):
                    await (raw or conn).close()
            finally:
                slots.release()
        finally:
            held.remove(me)

    async def dial_nobody() -> None:
        return None

    swarm._handle_inbound_connection = handle_inbound
    swarm.auto_connector.maybe_connect = dial_nobody
    return held


def _acquired(slots: trio.CapacityLimiter) -> bool:
    try:
        slots.acquire_nowait()
    except trio.WouldBlock:
        return False
    return True


class StrangerFacingHost:
    """The host as a stranger may see it: its ``get_addrs`` are only the addresses a
    stranger may see (``STATE.shown``), everything else is the host's own. The DHT's
    provider store and the signed peer record put ``host.get_addrs()`` whole into what
    they send, so they are given this instead."""

    def __init__(self, host: Any) -> None:
        self._host = host

    def get_addrs(self) -> list[multiaddr.Multiaddr]:
        addrs = [str(a) for a in self._host.get_addrs()]
        return [multiaddr.Multiaddr(a) for a in STATE.shown(addrs, None)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._host, name)


# --- the replacements ------------------------------------------------------------------


def _replacements() -> dict[str, Any]:
    read = _original[("libp2p.pubsub.pubsub", "read_varint_prefixed_bytes_limited")]
    queue = _original[("libp2p.pubsub.pubsub", "RpcQueue")]
    identify = _original[("libp2p.identity.identify.identify", "_mk_identify_protobuf")]
    record = _original[("libp2p.peer.peerstore", "env_to_send_in_RPC")]

    async def counting_read(stream: Any, limit: int) -> bytes:
        data = await read(stream, limit)
        COUNTERS.bytes_in += len(data)
        return data

    class SwarmQueue(queue):  # type: ignore[misc,valid-type]
        def __init__(self, max_size: int = OUTBOUND_QUEUE, *args: Any, **kwargs: Any) -> None:
            super().__init__(max_size, *args, **kwargs)

    def identify_for(host: Any, observed: multiaddr.Multiaddr | None) -> Any:
        """The library's identify message, with the addresses this peer may see."""
        message = identify(host, observed)
        addrs = [str(multiaddr.Multiaddr(a)) for a in message.listen_addrs]
        keep = STATE.shown(addrs, addresses.ip_of(str(observed)) if observed else None)
        if keep != addrs:
            del message.listen_addrs[:]
            message.listen_addrs.extend(multiaddr.Multiaddr(a).to_bytes() for a in keep)
            message.ClearField("signedPeerRecord")
        return message

    def shown_record(host: Any) -> tuple[bytes, bool]:
        """The signed peer record py-libp2p attaches to pubsub, DHT and identify messages,
        over what a stranger may see instead of ``host.get_addrs()`` whole."""
        return record(StrangerFacingHost(host))

    return {
        "read_varint_prefixed_bytes_limited": counting_read,
        "RpcQueue": SwarmQueue,
        "_mk_identify_protobuf": identify_for,
        "env_to_send_in_RPC": shown_record,
        "PROTOCOL_ID": DHT_PROTOCOL,
    }


def _symbol(module: str, name: str) -> Any:
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise PatchError(_missing(module, [name])) from None
    return found


def _holders(original: Any) -> list[str]:
    return [
        name
        for name, module in list(sys.modules.items())
        if (name == "libp2p" or name.startswith("libp2p."))
        and any(value is original for value in vars(module).values())
    ]


def _missing(where: str, names: list[str]) -> str:
    return (
        f"py-libp2p {installed_version()} has no {', '.join(names)} in {where}: the "
        f"network's patches no longer apply ({DOCS})"
    )
