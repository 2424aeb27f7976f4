"""Whether peers elsewhere can dial this node, and which addresses each peer may see.

A node behind a home router knows only its LAN addresses. Given to the DHT and to
identify, they reached every public node, which handed them on to everyone: each peer
then spent its dial loop on 192.168.x addresses that lead nowhere. So a node
decides its reachability once, at start (:func:`decide`):

- ``public``: peers anywhere can dial it: it was given addresses to announce (a
  forwarded port, a VPS), an interface has an address outside the LAN ranges below, or
  its home router mapped a port for it (UPnP, net/upnp.py: it announces the router's
  external address). Its DHT is a server and it announces the swarm.
- ``private``: behind NAT (every address is a LAN address, no UPnP mapping). Its DHT is a client, it
  announces nothing, and peers outside its LAN never see its LAN addresses
  (:func:`shown`). It dials out and takes part; mDNS still finds it on its LAN.
- ``local``: it listens on loopback only. Everyone who can reach it is on this machine
  and can dial it, so it serves the DHT as a public node does.

"LAN" here is the ranges no router forwards: RFC 1918, carrier-grade NAT (100.64/10),
link-local, loopback and their IPv6 kin, and any range ``net.lan_ranges`` adds (a site
numbered out of other space: :func:`count_as_lan`). Every other address counts as
reachable. An IPv6 address that embeds an IPv4 one is judged by that IPv4 address
(:func:`judged`): an IPv4-mapped one (``::ffff:0:0/96``, what a dual-stack socket shows
for an IPv4 peer), a NAT64 one (``64:ff9b::/96``) and a 6to4 one (``2002::/16``). So
``::ffff:127.0.0.1``, ``64:ff9b::c0a8:101`` and ``2002:a00:1::1`` are LAN, and each
counts in its IPv4 /24 wherever addresses are grouped by network. An IPv4-mapped address
is never handed on, whatever it embeds (:func:`is_mapped_addr`): a node announces IPv4
as ``/ip4/``, and a peer's stack dials a mapped address as the IPv4 one, on its own
network.

What others say of a peer's addresses is a stranger's word: of those, a node keeps and
dials only the ones that lead away from its own network (:func:`from_others`): an IP
outside the LAN ranges, not a LAN or loopback one, nor a name that may resolve to one;
unless it is local, or the peer is on its LAN. Else a hostile peer could make it open
connections to ports of its choosing on its LAN or machine
(docs/libp2p.md#addresses-from-strangers).

The network-namespace tests use 198.18.0.0/16 as their internet and
198.19.0.0/16, given as ``net.lan_ranges`` to every node they start, for the LANs behind
their routers (docs/development.md).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from typing import Literal, TypeVar

Reachability = Literal["public", "private", "local"]
A = TypeVar("A")  # an address: a multiaddr or its text

_LAN = tuple(
    ipaddress.ip_network(n)
    for n in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "169.254.0.0/16",
        "127.0.0.0/8",
        "0.0.0.0/8",
        "fc00::/7",
        "fe80::/10",
        "::1/128",
        "::/128",
    )
)
IPV4_PREFIX, IPV6_PREFIX = 24, 48  # an operator's network (network_of)
_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_added: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()  # net.lan_ranges


def count_as_lan(ranges: Iterable[str]) -> None:
    """Count ``ranges`` (CIDR networks, ``net.lan_ranges``) as LAN too, besides the
    built-in ones, in this process from now on (the network process and ``sapo-node
    identity`` call it with the config's). Raises ValueError on a malformed one.

    >>> count_as_lan(["198.19.0.0/16"]); is_lan("198.19.1.2"), is_lan("198.18.1.2")
    (True, False)
    >>> count_as_lan([]); is_lan("198.19.1.2")
    False
    """
    global _added
    _added = tuple(ipaddress.ip_network(r) for r in ranges)


def ip_of(addr: str) -> str | None:
    """The IP of an ``/ip4/...`` or ``/ip6/...`` multiaddr, else None.

    >>> ip_of("/ip4/192.168.1.20/tcp/4141/p2p/12D3KooW"), ip_of("/dnsaddr/example.org")
    ('192.168.1.20', None)
    """
    parts = str(addr).split("/")
    if len(parts) > 2 and parts[1] in ("ip4", "ip6"):
        return parts[2]
    return None


def judged(ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address ``ip`` is judged as: the IPv4 address an IPv4-mapped, NAT64 or 6to4
    address embeds, else ``ip`` itself; None when it is not an IP.

    >>> [str(judged(x)) for x in ("::ffff:10.0.0.1", "64:ff9b::7f00:1", "2002:c0a8:101::1")]
    ['10.0.0.1', '127.0.0.1', '192.168.1.1']
    >>> str(judged("2001:db8::1")), judged("example.org")
    ('2001:db8::1', None)
    """
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return None
    if addr.version == 4:
        return addr
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr in _NAT64:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return addr.sixtofour or addr


def network_of(ip: str) -> str:
    """The network ``ip`` belongs to, taken as one operator's: its /24 (IPv4) or /48
    (IPv6). An AutoNAT server's network votes once (net/autonat.py), and a network's
    peers share its inbound slots (net.max_inbound_per_net). An IPv6 address that
    embeds an IPv4 one (IPv4-mapped, as a dual-stack listener sees every IPv4 peer;
    NAT64; 6to4) is in that IPv4 address's /24 (:func:`judged`); not an IP: itself.

    >>> network_of("198.18.4.2"), network_of("2001:db8:1:2::7")
    ('198.18.4.0/24', '2001:db8:1::/48')
    >>> network_of("::ffff:198.18.0.1"), network_of("::ffff:203.0.113.9")
    ('198.18.0.0/24', '203.0.113.0/24')
    >>> network_of("2002:cb00:7101::1"), network_of("2002:cb00:71ff::1")  # 6to4: one /24
    ('203.0.113.0/24', '203.0.113.0/24')
    """
    addr = judged(ip)
    if addr is None:
        return ip
    prefix = IPV4_PREFIX if addr.version == 4 else IPV6_PREFIX
    return str(ipaddress.ip_network(f"{addr}/{prefix}", strict=False))


def is_lan(ip: str) -> bool:
    """Whether ``ip`` is an address no router forwards (or not an IP at all); one that
    embeds an IPv4 address is judged by it (:func:`judged`).

    >>> [is_lan(x) for x in ("192.168.1.2", "100.64.0.9", "127.0.0.1", "198.18.0.1", "8.8.8.8")]
    [True, True, True, False, False]
    >>> [is_lan(x) for x in ("::ffff:10.0.0.1", "::ffff:127.0.0.1", "::ffff:192.168.1.1")]
    [True, True, True]
    >>> [is_lan(x) for x in ("64:ff9b::a00:1", "2002:7f00:1::1", "2002:c612:1::1")]
    [True, True, False]
    >>> is_lan("::ffff:8.8.8.8")
    False
    """
    addr = judged(ip)
    if addr is None:
        return True
    return any(addr in net for net in (*_LAN, *_added) if net.version == addr.version)


def is_mapped_addr(addr: str) -> bool:
    """Whether a multiaddr's IP is an IPv4-mapped IPv6 address (``::ffff:0:0/96``),
    which the node never admits, stores or announces.

    >>> is_mapped_addr("/ip6/::ffff:127.0.0.1/tcp/4141"), is_mapped_addr("/ip6/::1/tcp/4141")
    (True, False)
    """
    ip = ip_of(addr)
    try:
        return ip is not None and ipaddress.ip_address(ip) in _MAPPED
    except ValueError:
        return False


def is_lan_addr(addr: str) -> bool:
    """Whether a multiaddr is an IP address in the LAN ranges (a name is not).

    >>> is_lan_addr("/ip4/10.1.0.2/tcp/4141"), is_lan_addr("/dns4/boot.example.org/tcp/4141")
    (True, False)
    """
    ip = ip_of(addr)
    return ip is not None and is_lan(ip)


def leads_outside(addr: str) -> bool:
    """Whether a multiaddr that a stranger gave leads away from this node's own network:
    an IP address outside the LAN ranges (one that embeds an IPv4 address is judged by
    it), or a circuit through a relay named by its ID alone (the relay is dialled at its
    own addresses, each judged so). A LAN or loopback address would let a stranger steer
    the node's dials to a port of its choosing on the node's LAN or machine; a name
    (``/dns4/...``) may resolve to one.

    >>> [leads_outside(a) for a in ("/ip4/198.18.0.9/tcp/4141", "/ip4/192.168.1.1/tcp/80",
    ...     "/ip4/127.0.0.1/tcp/22", "/ip6/::ffff:10.0.0.1/tcp/8080", "/dns4/localhost/tcp/22")]
    [True, False, False, False, False]
    >>> leads_outside("/ip4/198.18.0.1/tcp/4141/p2p/12D3KooWR/p2p-circuit")
    True
    """
    ip = ip_of(addr)
    if ip is not None:
        return not is_lan(ip)
    return str(addr).startswith("/p2p/")


def from_others(addrs: list[A], trusted: Callable[[], bool]) -> list[A]:
    """Of the addresses of a peer that others gave (the peer itself in identify, or any
    peer in a DHT answer, a signed peer record, a hole punch's CONNECT, peer exchange),
    those this node keeps and may dial: each that leads outside (:func:`leads_outside`),
    and the others too when ``trusted()``: this node is local (all it reaches is on this
    machine), or the peer is on its LAN (mDNS found it, or it holds a direct connection
    from a LAN address). ``trusted`` is asked only when an address leads inside.

    >>> given = ["/ip4/198.18.0.9/tcp/4141", "/ip4/10.0.0.1/tcp/8080"]
    >>> from_others(given, lambda: False), from_others(given, lambda: True) == given
    (['/ip4/198.18.0.9/tcp/4141'], True)
    """
    kept = [a for a in addrs if leads_outside(str(a))]
    if len(kept) == len(addrs) or not trusted():
        return kept
    return list(addrs)


def is_loopback(ip: str) -> bool:
    addr = judged(ip)
    return addr is not None and addr.is_loopback


def decide(setting: str, announce: Iterable[str], addrs: Iterable[str]) -> Reachability:
    """This node's reachability: ``setting`` (net.reachability) unless it is ``auto``;
    then public with addresses to announce or one outside the LAN ranges, local when
    every address is loopback, private otherwise. ``addrs`` are the addresses the node
    would give peers (wildcards already replaced by the interfaces' addresses).

    >>> decide("auto", [], ["/ip4/192.168.1.20/tcp/4141"])
    'private'
    >>> decide("auto", ["/ip4/203.0.113.7/tcp/4141"], ["/ip4/192.168.1.20/tcp/4141"])
    'public'
    >>> decide("auto", [], ["/ip4/127.0.0.1/tcp/4141"])
    'local'
    >>> decide("auto", [], ["/ip4/198.18.0.2/tcp/4141"])
    'public'
    >>> decide("private", ["/ip4/203.0.113.7/tcp/4141"], [])
    'private'
    """
    return explain(setting, announce, addrs)[0]


def explain(
    setting: str, announce: Iterable[str], addrs: Iterable[str]
) -> tuple[Reachability, str]:
    """:func:`decide`, with the reason shown in the log and ``/status``: ``config``
    (net.reachability set), ``announce``, ``address`` (one outside the LAN ranges),
    ``loopback`` or ``nat``. (``upnp`` is the network process's: a router mapped a port
    and its external address is announced, net/upnp.py.)

    >>> explain("auto", [], ["/ip4/192.168.1.20/tcp/4141"])
    ('private', 'nat')
    >>> explain("auto", ["/ip4/203.0.113.7/tcp/4141"], [])
    ('public', 'announce')
    """
    if setting != "auto":
        return setting, "config"  # type: ignore[return-value]
    if list(announce):
        return "public", "announce"
    ips = [ip for ip in map(ip_of, addrs) if ip is not None]
    if any(not is_lan(ip) for ip in ips):
        return "public", "address"
    if ips and all(is_loopback(ip) for ip in ips):
        return "local", "loopback"
    return "private", "nat"


def shown(reachability: Reachability, addrs: list[str], peer_ip: str | None) -> list[str]:
    """The addresses this node shows a peer whose connection comes from ``peer_ip``:
    all of them to a peer on its LAN (or on this machine), none of its LAN addresses to
    a peer elsewhere when it is private (they would lead that peer, and everyone it
    tells, nowhere). A peer whose address is unknown counts as elsewhere. An IPv4-mapped
    address is shown to nobody.

    >>> lan = ["/ip4/192.168.1.20/tcp/4141", "/ip4/127.0.0.1/tcp/4141"]
    >>> shown("private", lan, "198.18.0.1"), shown("private", lan, "192.168.1.9") == lan
    ([], True)
    >>> shown("public", ["/ip6/::ffff:198.18.0.2/tcp/4141"], None)
    []
    """
    addrs = [a for a in addrs if not is_mapped_addr(a)]
    if reachability != "private" or (peer_ip is not None and is_lan(peer_ip)):
        return addrs
    return [a for a in addrs if not is_lan_addr(a)]
