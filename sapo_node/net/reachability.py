"""The network's reachability behaviour: what peers can reach, and how they reach it.

Relay reservations for a private node (circuit relay v2), hole punching (DCUtR) and the
pubsub stream's move onto a direct connection, AutoNAT checks of a public node, the
router's port mapping (UPnP, net/upnp.py) and the addresses shown to peers
(net/state.py, addresses.py). Each is in docs/libp2p.md, *Reachability*.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from typing import Any

import multiaddr
import structlog
import trio
from libp2p.identity.identify_push import push_identify_to_peers
from libp2p.kad_dht.kad_dht import DHTMode
from libp2p.peer.id import ID
from libp2p.rcmgr import Direction
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport

from sapo_node import addresses
from sapo_node.net import autonat, patches, upnp
from sapo_node.net.discovery import DIAL_TIMEOUT_S
from sapo_node.net.state import STATE

log = structlog.get_logger("sapo_node.net")

RELAYS = 2  # relays a private node keeps a reservation on


CIRCUIT_S = 3600  # a relayed connection lasts at most this long (then it is dialled again)


RELAY_GRACE_S = 10.0  # a relayed connection closes this long after a punch replaced it


def is_relayed(conn: Any) -> bool:
    """A connection through a circuit relay: its transport address is a /p2p-circuit one."""
    with contextlib.suppress(Exception):
        return any("/p2p-circuit" in str(a) for a in conn.get_transport_addresses() or ())
    return False


def holds_reservation(circuit: CircuitV2Protocol, peer: ID) -> bool:
    """Whether ``peer`` holds a live reservation on this node's relay: the node relays
    (``allow_hop``), and the library keeps one for ``peer`` that has not expired, while
    ``peer`` is still connected (``has_reservation``: two dictionary lookups). A private
    node reached through this relay: closing its connection cuts it off from every peer
    that dials it here."""
    return bool(circuit.allow_hop) and circuit.resource_manager.has_reservation(peer)


class SwarmDCUtR(DCUtRProtocol):
    """The library's DCUtR, with a shorter wait before the relayed connection closes
    (pubsub moves within a second), and without LAN addresses in what it tells a peer
    when it has no outside address to predict: the peer is not on its LAN
    (docs/libp2p.md#hole-punching). A punch dials, of the addresses the peer's CONNECT
    gives, only those addresses.from_others allows (``trusts``: whether this node dials
    any address of that peer; docs/libp2p.md#addresses-from-strangers)."""

    def __init__(
        self,
        host: Any,
        relay_grace_s: float = RELAY_GRACE_S,
        *,
        trusts: Callable[[ID], bool],
    ) -> None:
        super().__init__(host)
        self.relay_grace_s = relay_grace_s
        self.trusts = trusts
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

    async def _perform_hole_punch(
        self, peer_id: ID, addrs: list[Any], *args: Any, **kwargs: Any
    ) -> bool:
        began = time.monotonic()
        addrs = addresses.from_others(addrs, lambda: self.trusts(peer_id))
        ok = await super()._perform_hole_punch(peer_id, addrs, *args, **kwargs)
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
        await super()._close_relayed_conns_after_grace(peer_id, min(grace, self.relay_grace_s))

    async def _get_observed_addrs(self) -> list[bytes]:
        """What a punch's CONNECT tells the peer to dial: the library's list, less LAN
        addresses while private. The addresses AutoNAT found unreachable
        (``STATE.unreachable``, which identify hides) stay: they are what a punch dials,
        both sides at once, through a NAT or a firewall that drops only connections it
        did not see leave. Two firewalled nodes (tests/support/nat_alone.py) each send
        exactly that address, and punch through; without it the list is empty and the
        punch fails."""
        addrs = await super()._get_observed_addrs()
        if STATE.reachability != "private":
            return addrs
        return [a for a in addrs if not addresses.is_lan_addr(str(multiaddr.Multiaddr(a)))]


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
    """A wildcard listen address is announced as each interface's address: the library
    announced 0.0.0.0, which no peer can dial (docs/libp2p.md#announced-addresses)."""
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


ANNOUNCE_PLACEHOLDER = "/ip4/<public IP>/tcp/<port>"


def announce_hint(
    verdict: str, reason: str, announced: list[str], reached: list[str]
) -> str | None:
    """The address to tell the user to pass as ``--announce``, or None: AutoNAT found
    this node public (``verdict``), it was not given ``--announce`` (``reason``), and it
    announces no address peers elsewhere reach it at. ``reached``: the addresses AutoNAT
    servers dialled it back at; the one most of them reached is suggested. Without one,
    the hint is due when every announced address is a LAN one, with a placeholder.
    A router that forwards the port to the node's inside address, which it announces:
    peers elsewhere are given only that address, and dial it in vain.

    >>> inside = ["/ip4/198.19.1.2/tcp/4141"]  # a home network numbered outside the LAN ranges
    >>> router = ["/ip4/198.18.0.7/tcp/4141"]  # where a server dialled it back
    >>> announce_hint("public", "address", inside, router)
    '/ip4/198.18.0.7/tcp/4141'
    >>> announce_hint("public", "address", router, router)  # a VPS: nothing to say
    >>> announce_hint("public", "nat", ["/ip4/192.168.1.20/tcp/4141"], [])
    '/ip4/<public IP>/tcp/<port>'
    >>> announce_hint("public", "announce", inside, router)  # the user chose
    >>> announce_hint("private", "address", inside, [])
    """
    if verdict != "public" or reason in ("announce", "config"):
        return None
    outside = [
        a for a in reached if (ip := addresses.ip_of(a)) is not None and not addresses.is_lan(ip)
    ]
    if outside:
        announced_ips = {addresses.ip_of(a) for a in announced}
        if any(addresses.ip_of(a) in announced_ips for a in outside):
            return None
        return max(sorted(set(outside)), key=outside.count)
    if any(not addresses.is_lan_addr(a) for a in announced):
        return None
    return ANNOUNCE_PLACEHOLDER


class ReachabilityBehaviour:
    """The network's reachability behaviour, one of the parts net/network.py's Network is
    made of: whether peers elsewhere can dial this node, relay reservations, the pubsub
    stream's move onto a direct connection, AutoNAT checks and the router's mapping. Its
    state, made in ``_init_reachability``: ``reachability`` and ``reason`` (shared with
    the library's hooks through net/state.py), ``circuit``, ``circuits``, ``dcutr``,
    ``autonat`` and its answers, ``relays``, ``mapping``."""

    def _init_reachability(
        self, settings: dict[str, Any], announce: list[Any], mapping: upnp.Mapping | None
    ) -> None:
        """Whether peers elsewhere can dial this node (addresses.py), and the relay, DCUtR
        and AutoNAT services that follow from it; ``mapping``: a port the home router maps
        to this node (UPnP)."""
        self.mapping = mapping
        shown = [str(a) for a in announce] or [str(a) for a in interface_addresses(self.listen)]
        self.reachability, self.reason = addresses.explain(
            settings.get("reachability", "auto"), announce, shown
        )
        if mapping is not None:
            self.reason = "upnp"
        STATE.reachability = self.reachability
        # Circuit relay v2 (docs/libp2p.md#circuit-relay): py-libp2p's relay is not wired
        # into the host, and its swarm never dials a /p2p-circuit address. Every node runs the relay
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
        # holds_reservation asks the relay's reservations, which ask the swarm's connections
        patches.check_state(self.circuit, ("allow_hop", "resource_manager"), "the relay")
        patches.check_state(
            self.circuit.resource_manager, ("has_reservation",), "the relay's reservations"
        )
        patches.check_state(self.host.get_network(), ("connections",), "the swarm")
        self.circuits = CircuitV2Transport(
            self.host, self.circuit, RelayConfig(roles=RelayRole.STOP)
        )
        # Every node answers DCUtR (docs/libp2p.md#hole-punching); one with a relayed
        # connection (a private node's, to another) tries to replace it by a direct one
        # through both NATs.
        self.dcutr = SwarmDCUtR(
            self.host,
            relay_grace_s=settings.get("relay_grace_s", RELAY_GRACE_S),
            trusts=self.trusts,
        )
        # A public node answers AutoNAT dial-back requests on fresh connections
        # (docs/libp2p.md#autonat-dial-back); one public by an address or a UPnP mapping (or
        # --announce) asks peers to dial it back (net/autonat.py, _check_reachability).
        check = settings.get("autonat", True)
        self.autonat = autonat.SwarmAutoNAT(
            self.host,
            serve=check and self.reachability in ("public", "local"),
            peer_every_s=settings.get("autonat_peer_every_s", autonat.PEER_EVERY_S),
            connect_s=settings.get("autonat_connect_s", autonat.CONNECT_S),
        )
        self.checks_reachability = check and self.reason in ("address", "upnp", "announce")
        self.reason_at_start = self.reason  # what a node private by AutoNAT returns to
        self.autonat_answers: dict[str, int] = {}  # server IP -> its answer, last check
        self.autonat_reached: dict[str, str] = {}  # server IP -> where it dialled back
        self.autonat_failed_at: float | None = None  # the check's first failed dial-back
        self.autonat_verdict: str | None = None
        self.handing_over: set[ID] = set()  # peers whose pubsub stream is being moved
        self.relays: dict[ID, list[str]] = {}  # relay -> this node's addresses through it

    def _holds_reservation(self, peer: ID) -> bool:
        """Whether ``peer`` holds a live reservation on this node's relay
        (:func:`holds_reservation`); False before the relay is built."""
        circuit = getattr(self, "circuit", None)
        return circuit is not None and holds_reservation(circuit, peer)

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
        """A pubsub stream on a relayed connection moves to a direct one when there is one
        (after a hole punch: docs/libp2p.md#hole-punching), and one on a closed connection to
        another that is left (the library keeps a peer with a dead stream when one connection
        of two closes)."""
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
                addrs = [
                    str(a)
                    for a in store.addrs(peer)
                    if not addresses.is_lan_addr(str(a)) and not addresses.is_mapped_addr(str(a))
                ]
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
        """Each AutoNAT server among connected peers asked, as they connect (those
        connected together, at once), and again every autonat.PEER_EVERY_S (a server's
        own rate) while the answers leave it unsure; with one network's failure alone,
        the verdict waits autonat.ALONE_S for a peer outside the LAN to dial in."""
        self.autonat_answers, self.autonat_reached = {}, {}
        asked: dict[ID, float] = {}  # server -> when it was last asked
        again_s = self.s.get("autonat_retry_s", autonat.PEER_EVERY_S)
        dialled_in, began = False, time.monotonic()
        while True:
            now = trio.current_time()
            servers = self._autonat_servers()
            new = [p for p in servers if now - asked.get(p, -math.inf) >= again_s]
            asked.update(dict.fromkeys(new[: autonat.SERVERS], now))
            async with trio.open_nursery() as nursery:
                for peer in new[: autonat.SERVERS]:
                    nursery.start_soon(self._ask_dial_back, peer)
            if self.autonat_failed_at is None and autonat.FAILED in self.autonat_answers.values():
                self.autonat_failed_at = trio.current_time()
            # while private, an inbound connection is a hole punch: no evidence
            public = self.reachability == "public"
            dialled_in = dialled_in or (public and self._dialled_in_from_outside(began))
            waited = trio.current_time() - (self.autonat_failed_at or math.inf)
            unreached = not dialled_in and waited >= self.s.get("autonat_alone_s", autonat.ALONE_S)
            found = autonat.verdict(
                self.autonat_answers.items(),
                unreached=unreached,
                dialled_in=dialled_in,
                reached_before=STATE.dialled_in_at > -math.inf,
            )
            if found is not None:
                self.autonat_failed_at = None
                return found
            await trio.sleep(max(1.0, self.s["redial_s"]))

    def _dialled_in_from_outside(self, since: float = math.inf) -> bool:
        """Whether a peer outside the LAN holds a direct connection that it dialled to
        this node, or dialled one since ``since`` (time.monotonic; patches.guard_swarm
        notes each): one that could dial it."""
        if STATE.dialled_in_at >= since:
            return True
        for peer in list(self.host.get_network().connections):
            for conn in self._conns(peer):
                with contextlib.suppress(Exception):
                    inbound = conn.direction == Direction.INBOUND
                    ips = [addresses.ip_of(str(a)) for a in conn.get_transport_addresses() or ()]
                    if (
                        inbound
                        and not is_relayed(conn)
                        and any(ip and not addresses.is_lan(ip) for ip in ips)
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
                addresses.ip_of(str(a))
                for c in self._conns(peer)
                if not is_relayed(c)
                for a in (c.get_transport_addresses() or ())
            ),
            None,
        )
        if ip is None:
            return
        with contextlib.suppress(Exception):
            status, at = await self.autonat.query_server(peer, timeout=autonat.ASK_S)
            if (
                status in (autonat.OK, autonat.FAILED)
                and self.autonat_answers.get(ip) != autonat.OK
            ):
                self.autonat_answers[ip] = status
            if status == autonat.OK and at:
                self.autonat_reached[ip] = str(multiaddr.Multiaddr(at))[:200]

    async def _act_on(self, found: str) -> None:
        """A node public by its address or a UPnP mapping that peers cannot dial becomes
        private; one public by --announce stays so and says which address failed. One
        that peers dialled back at an address it does not announce is told to announce it
        (announce_hint). Called once per change of verdict."""
        self.autonat_verdict = found
        addrs = [str(a).split("/p2p/")[0] for a in self.host.get_addrs()]
        if found == "public":
            again = self.reason == "autonat"
            if again:
                await self._public_again()
            hint = announce_hint(found, self.reason, addrs, list(self.autonat_reached.values()))
            if hint is not None:
                log.warning(
                    "AutoNAT: peers dialled this node back, so it is public, but it announces "
                    "no address they reached it at, and peers elsewhere cannot dial the ones "
                    "it gives them: a router forwards its port. Pass the address they reached "
                    "as --announce",
                    announce=hint,
                    announced=addrs,
                    reached=sorted(set(self.autonat_reached.values())),
                    answers=self.autonat_answers,
                )
            elif not again:
                log.info(
                    "AutoNAT: peers dialled this node back: it is public",
                    answers=self.autonat_answers,
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
        STATE.unreachable.update(a for a in addrs if not addresses.is_lan_addr(a))
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
