"""AutoNAT v1: whether peers elsewhere can really dial this node.

A node with an address outside the LAN ranges (a VPS) or a port mapped by its home
router (UPnP) reads public at start (addresses.py). A firewall, a cloud security group
or a router that ignores its own mapping can make that false: peers would then dial
an address that leads nowhere, and the node would serve the DHT and relays to nobody.
So such a node asks public peers to dial it back, on py-libp2p's AutoNAT v1
(``/libp2p/autonat/1.0.0``), and acts on their answers (``Network._check_reachability``):

- Answers count by the server's network, a /24 for IPv4 and a /48 for IPv6 (one
  operator's block, one vote, however many addresses it holds), and by majority
  (:func:`verdict`). AGREE such networks failed to dial it and more of them failed than
  succeeded: it becomes private (reason ``autonat``): DHT client, no relay service, its
  unreachable addresses hidden from peers, a relay reservation instead. A node public
  because it was given ``--announce`` stays public (the user said so) and its log says
  which announced address peers could not dial.
- at least as many networks dialled it back as failed: it is public, confirmed
  (``/status``: ``autonat``).
- a node that a peer outside the LAN has dialled directly since it started (while
  public) needs more: failures are what a liar can give, so it turns private only
  when, besides, no such peer dialled in for ALONE_S after the first failure (as below),
  and one that dials in during the check makes it public, whatever the networks say.
  Two cheap networks that answer "failed" cannot demote a node peers reach.
- a swarm with a single public node has one network to ask. When it failed, none
  succeeded and for ALONE_S after that answer no peer outside the LAN has connected to
  this node directly (which a peer that could dial it would have done), that one answer
  is enough: a firewalled VPS, or a home IPv6 address behind the router's firewall,
  turns private rather than serve the DHT to nobody. (A private node's inbound
  connections are hole punches, not evidence.)

While unsure, a node asks each server again every PEER_EVERY_S, the server's own rate.

A node private by AutoNAT asks again every RECHECK_PRIVATE_S and turns public again
when the answers say so: one demoted by lying servers, or by a failure that has since
passed (a firewall opened), recovers without a restart once honest networks are as many.
A public one asks again every RECHECK_S (a firewall can change).

The library's server answers a dial-back request with ``host.connect``, which returns
at once when a connection to the asker is open, and it always is: the request came over
it. Every asker heard OK, firewalled or not (docs/libp2p.md#autonat-dial-back).
:class:`SwarmAutoNAT` dials back on a fresh TCP connection from an ephemeral port
(never the connection the request came on, nor the listen port, which a NAT keeping
ports would map to that same connection), and counts it a success only when the Noise
handshake proves the asker's peer ID. It dials only addresses on the asker's observed
IP (the library's rule: no amplification), only for the peer that asked, and within
rate limits (a peer's request once a minute, PER_MINUTE requests in all). An asker
none of whose addresses is on that IP is behind NAT (its inside range outside the LAN
ranges, so it read public): the library refused it and it never had a verdict; here
its observed IP is dialled at the ports it gave (:func:`dial_candidates`), which fails
unless its router forwards them.

Dial-backs from distinct networks are what the verdict counts: one operator of many
identities or addresses counts once. A lying server can only say "failed" (a majority
of networks, at least AGREE, demote a node until the next check; it then reaches the
swarm through relays) or "OK" (the node stays as it started).
"""

from __future__ import annotations

import contextlib
import ipaddress
import time
from collections.abc import Iterable

import multiaddr
import structlog
import trio
from libp2p.host.autonat.autonat import AUTONAT_PROTOCOL_ID, AutoNATService, _is_relayed_stream
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.io.trio import TrioTCPStream
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.peer.id import ID
from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes_limited

from sapo_node.addresses import network_of  # a server's network (a /24, a /48): one vote

log = structlog.get_logger("sapo_node.net")

PROTOCOL = AUTONAT_PROTOCOL_ID
AGREE = 2  # networks (a /24, a /48) whose dial-backs failed, that make a node private
ALONE_S = 120.0  # one network's failure, then this long with no peer dialling in: private
RECHECK_PRIVATE_S = 600.0  # a node private by AutoNAT asks again this often
SERVERS = 4  # peers asked in one check
CONNECT_S = 5.0  # a dial-back's TCP connect: a firewall that drops shows here
HANDSHAKE_S = 15.0  # then its Noise handshake (an asker on a loaded machine is slow)
ASK_S = 90.0  # an asker's bound on a server's answer (MAX_ADDRS dial-backs, 60 s at most)
MAX_MESSAGE = 64 * 1024  # an AutoNAT request's bound (the library's)
MAX_ADDRS = 3  # addresses a server dials back per request
PEER_EVERY_S = 60.0  # a peer's requests are served at most this often
PER_MINUTE = 30  # requests served a minute, all peers together
RECHECK_S = 3600.0  # a public node asks again this often (a firewall can change)
OK, FAILED = int(Message.OK), int(Message.E_DIAL_ERROR)


class SwarmAutoNAT(AutoNATService):
    """py-libp2p's AutoNAT service with its dial-back fixed: the server's dial-back is a
    fresh connection that proves the asker's identity, only for the asker itself, and
    rate-limited (docs/libp2p.md#autonat-dial-back). ``serve`` says whether this node
    answers (a public node)."""

    def __init__(
        self,
        host,
        *,
        serve: bool,
        peer_every_s: float = PEER_EVERY_S,
        connect_s: float = CONNECT_S,
    ) -> None:
        """``connect_s``: how long a dial-back's TCP connect may take (CONNECT_S)."""
        super().__init__(host, serve=serve)
        if not connect_s > 0:
            raise ValueError(f"a dial-back's connect timeout must be > 0 s, not {connect_s!r}")
        self.peer_every_s = peer_every_s
        self.connect_s = connect_s
        self.served: dict[ID, float] = {}  # asker -> when its last request was served
        self.minute: list[float] = []
        self.dial_backs = {"ok": 0, "failed": 0, "refused": 0}

    async def handle_stream(self, stream) -> None:
        """The library's handler, with the rate limits and the asker check."""
        asker = stream.muxed_conn.peer_id
        now = time.monotonic()
        self.minute = [t for t in self.minute if now - t < 60.0]
        if (
            now - self.served.get(asker, -self.peer_every_s) < self.peer_every_s
            or len(self.minute) >= PER_MINUTE
        ):
            self.dial_backs["refused"] += 1
            with contextlib.suppress(Exception):
                await stream.reset()
            return
        self.served[asker] = now
        self.minute.append(now)
        while len(self.served) > 4096:
            self.served.pop(next(iter(self.served)))
        try:
            request = Message()
            request.ParseFromString(await read_varint_prefixed_bytes_limited(stream, MAX_MESSAGE))
            if request.type == Message.DIAL and ID(request.dial.peer.id) != asker:
                response = Message()
                response.type = Message.DIAL_RESPONSE
                response.dialResponse.status = Message.E_DIAL_REFUSED
                response.dialResponse.statusText = "a peer may ask a dial-back for itself only"
            else:
                response = await self._handle_request(
                    request, self._observed_ip(stream), _is_relayed_stream(stream)
                )
            status = int(response.dialResponse.status)
            self.dial_backs[{OK: "ok", FAILED: "failed"}.get(status, "refused")] += 1
            await stream.write(encode_varint_prefixed(response.SerializeToString()))
        except Exception as e:  # a malformed request, a peer gone
            log.debug("AutoNAT request not answered", peer=asker.pretty(), error=str(e))
        finally:
            with contextlib.suppress(Exception):
                await stream.close()

    @staticmethod
    def _filter_by_observed_ip(addrs: list[bytes], observed_ip: str | None) -> list[bytes]:
        """The library's rule, which refuses an asker none of whose addresses is on its
        observed IP, with :func:`dial_candidates` instead."""
        return dial_candidates(addrs, observed_ip)

    async def _try_dial(self, peer_id: ID, addrs: list[bytes]) -> bytes | None:
        """A new TCP connection from an ephemeral port, and a Noise handshake
        that proves ``peer_id``; then closed. None if no address answered so."""
        upgrader = self.host.get_network().upgrader
        for raw in addrs[:MAX_ADDRS]:
            target = tcp_target(raw)
            if target is None:
                continue
            stream = None
            with trio.move_on_after(self.connect_s), contextlib.suppress(OSError):
                stream = await trio.open_tcp_stream(*target)
            if stream is None:
                continue
            conn = RawConnection(TrioTCPStream(stream), True)
            secured = None
            with trio.move_on_after(HANDSHAKE_S), contextlib.suppress(Exception):
                secured = await upgrader.upgrade_security(conn, True, peer_id)
            with contextlib.suppress(Exception):
                await (secured or conn).close()
            if secured is not None:
                return raw
        return None


def tcp_target(raw: bytes) -> tuple[str, int] | None:
    """(ip, port) of an ``/ip4|ip6/.../tcp/...`` address, else None (a relayed one, a
    name: not dialled back).

    >>> tcp_target(multiaddr.Multiaddr("/ip4/198.18.4.2/tcp/4141").to_bytes())
    ('198.18.4.2', 4141)
    >>> tcp_target(multiaddr.Multiaddr("/ip4/198.18.0.1/tcp/4001/p2p-circuit").to_bytes())
    """
    try:
        addr = multiaddr.Multiaddr(raw)
        protocols = [p.name for p in addr.protocols()]
        if "p2p-circuit" in protocols or "tcp" not in protocols:
            return None
        ip = next(addr.value_for_protocol(p) for p in ("ip4", "ip6") if p in protocols)
        return str(ip), int(addr.value_for_protocol("tcp"))
    except Exception:
        return None


def dial_candidates(addrs: list[bytes], observed_ip: str | None) -> list[bytes]:
    """The addresses a server dials back for an asker whose connection comes from
    ``observed_ip``, given the ``addrs`` it asked to be dialled at: those on that IP
    (no amplification: only the asker's own IP is ever dialled), or, when none is, that
    IP at each TCP port it gave. An asker behind NAT knows only its inside address; where
    that lies outside the LAN ranges it reads public and asks, and a server that refused
    it (as the library does) left it without a verdict for good. Dialling its router at
    its port fails unless the router forwards that port, which is the answer it needs.

    >>> ma = lambda *a: [multiaddr.Multiaddr(x).to_bytes() for x in a]
    >>> show = lambda raws: [str(multiaddr.Multiaddr(x)) for x in raws]
    >>> show(dial_candidates(ma("/ip4/198.19.1.2/tcp/4141"), "198.18.1.2"))  # behind NAT
    ['/ip4/198.18.1.2/tcp/4141']
    >>> show(dial_candidates(ma("/ip4/198.18.1.2/tcp/4141", "/ip4/198.18.9.9/tcp/1"), "198.18.1.2"))
    ['/ip4/198.18.1.2/tcp/4141']
    >>> dial_candidates(ma("/ip4/198.19.1.2/tcp/4141"), None)
    []
    """
    if observed_ip is None:
        return []
    on_ip = AutoNATService._filter_by_observed_ip(addrs, observed_ip)
    if on_ip:
        return on_ip
    try:
        version = ipaddress.ip_address(observed_ip).version
    except ValueError:
        return []
    ports = list(dict.fromkeys(t[1] for t in map(tcp_target, addrs) if t is not None and t[1] > 0))
    return [
        multiaddr.Multiaddr(f"/ip{version}/{observed_ip}/tcp/{port}").to_bytes() for port in ports
    ]


def verdict(
    answers: Iterable[tuple[str, int]],
    *,
    unreached: bool = False,
    dialled_in: bool = False,
    reached_before: bool = False,
) -> str | None:
    """The reachability that servers' answers show, as (server IP, status) pairs, each
    network (network_of) voting once, OK if any of its servers dialled back: ``public``
    when at least one network dialled back and as many as failed; ``private`` when more
    failed than dialled back, and at least AGREE did, or one did and ``unreached`` (ALONE_S
    passed since with no peer outside the LAN dialling in); None while unsure (refusals
    and errors count for nothing).

    Failures are what a liar can give; a connection a peer outside the LAN dialled to
    this node is what it cannot take away. So ``dialled_in`` (one did during the check)
    makes the node ``public`` whatever the networks say, and a node ``reached_before``
    (one did since it started) turns private only ``unreached``, however many networks
    failed: two cheap networks cannot demote it at every check.

    >>> verdict([("198.18.0.1", FAILED), ("198.18.1.1", FAILED)])
    'private'
    >>> verdict([("198.18.0.1", FAILED), ("198.18.0.2", FAILED)]) is None  # one /24
    True
    >>> verdict([("2001:db8:0:1::1", FAILED), ("2001:db8:0:2::1", FAILED)]) is None  # one /48
    True
    >>> verdict([("198.18.0.1", FAILED), ("198.18.1.1", OK)])
    'public'
    >>> verdict([("198.18.0.1", FAILED), ("198.18.1.1", FAILED), ("198.18.2.1", OK)])
    'private'
    >>> verdict([("198.18.0.1", FAILED)]) is None, verdict([("198.18.0.1", FAILED)], unreached=True)
    (True, 'private')
    >>> two = [("198.18.0.1", FAILED), ("198.18.1.1", FAILED)]
    >>> verdict(two, dialled_in=True), verdict(two, reached_before=True)
    ('public', None)
    >>> verdict(two, reached_before=True, unreached=True)
    'private'
    """
    votes: dict[str, int] = {}
    for ip, status in answers:
        if status in (OK, FAILED) and votes.get(network_of(ip)) != OK:
            votes[network_of(ip)] = status
    ok = sum(status == OK for status in votes.values())
    failed = len(votes) - ok
    if ok and ok >= failed:
        return "public"
    if failed > ok and dialled_in:
        return "public"
    if failed > ok and (unreached or (failed >= AGREE and not reached_before)):
        return "private"
    return None
