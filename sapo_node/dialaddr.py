"""The addresses a config tells a node to reach, checked for form: a bootstrap peer's
multiaddr (``/ip4/``, ``/ip6/``, ``/dns4/``, ``/dns6/``, ``/dns/`` with ``/tcp/PORT/p2p/ID``,
or ``/dnsaddr/NAME``) and a DNS server (``IP`` or ``IP:PORT``). Pure text, no lookup: the
config checks its values with it, and the network process resolves the names
(``net/dnsaddr.py``) from what it returns.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

DNS_PORT = 53
IP_KINDS = ("ip4", "ip6")
NAME_KINDS = ("dns4", "dns6", "dns")  # resolved through A and AAAA records
_PEER = re.compile(r"[1-9A-HJ-NP-Za-km-z]{1,128}|b[a-z2-7]{1,128}")  # base58btc, CID base32
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


class Unsupported(ValueError):
    """A well-formed multiaddr this node cannot dial (not TCP: QUIC, WebSocket, ...)."""


@dataclass(frozen=True)
class Target:
    """A bootstrap address, parsed: ``kind`` is ip4, ip6, dns4, dns6, dns or dnsaddr."""

    kind: str
    host: str
    port: int | None  # None for dnsaddr
    peer: str | None  # the /p2p/ ID; None only for a bare /dnsaddr/NAME

    def text(self) -> str:
        """The multiaddr, /p2p/ as the peer's protocol name."""
        where = f"/{self.kind}/{self.host}" + (f"/tcp/{self.port}" if self.port else "")
        return where + (f"/p2p/{self.peer}" if self.peer else "")


def parse(addr: str) -> Target:
    """``addr`` as a bootstrap address; ValueError (``Unsupported`` for another transport)
    says why it is none. ``/ipfs/`` is read as ``/p2p/``, its old name.

    >>> parse("/dnsaddr/bootstrap.example.org").kind
    'dnsaddr'
    >>> parse("/dns4/boot.example.org/tcp/4141/p2p/12D3KooWabc").text()
    '/dns4/boot.example.org/tcp/4141/p2p/12D3KooWabc'
    >>> parse("/ip4/127.0.0.1/udp/4001/quic-v1/p2p/12D3KooWabc")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    sapo_node.dialaddr.Unsupported: '/ip4/...' is not TCP: this node dials /tcp/PORT/p2p/...
    """
    parts = addr.split("/")
    if parts[0] or len(parts) < 3:
        raise ValueError(f"{addr!r} is not a multiaddr")
    kind, host, rest = parts[1], parts[2], parts[3:]
    peer = None
    if len(rest) >= 2 and rest[-2] in ("p2p", "ipfs"):
        peer, rest = _peer(addr, rest[-1]), rest[:-2]
    if kind == "dnsaddr":
        if rest:
            raise ValueError(f"{addr!r}: /dnsaddr/NAME may be followed only by /p2p/PEER_ID")
        return Target(kind, _name(addr, host), None, peer)
    if kind not in (*IP_KINDS, *NAME_KINDS):
        raise ValueError(f"{addr!r}: not /ip4, /ip6, /dns4, /dns6, /dns or /dnsaddr")
    host = _ip(addr, kind, host) if kind in IP_KINDS else _name(addr, host)
    if peer is None:
        raise ValueError(f"{addr!r} lacks /p2p/PEER_ID")
    if len(rest) != 2 or rest[0] != "tcp":
        raise Unsupported(f"{addr!r} is not TCP: this node dials /tcp/PORT/p2p/PEER_ID only")
    if not rest[1].isdigit() or not 0 < int(rest[1]) <= 65535:
        raise ValueError(f"{addr!r}: port {rest[1]!r} is not 1 to 65535")
    return Target(kind, host, int(rest[1]), peer)


def _peer(addr: str, text: str) -> str:
    if not _PEER.fullmatch(text):
        raise ValueError(f"{addr!r}: {text!r} is no peer ID (base58 or base32)")
    return text


def _name(addr: str, text: str) -> str:
    labels = text.removesuffix(".").split(".")
    if len(text) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"{addr!r}: {text!r} is no DNS name")
    return text


def _ip(addr: str, kind: str, text: str) -> str:
    try:
        ipaddress.IPv4Address(text) if kind == "ip4" else ipaddress.IPv6Address(text)
    except ValueError:
        raise ValueError(f"{addr!r}: {text!r} is no {kind} address") from None
    return text


def parse_nameserver(text: str) -> tuple[str, int]:
    """``IP`` or ``IP:PORT`` (IPv6 with a port in brackets) as (address, port); a
    nameserver is an address, since finding one by name would need DNS first.

    >>> parse_nameserver("127.0.0.1"), parse_nameserver("[::1]:5353")
    (('127.0.0.1', 53), ('::1', 5353))
    """
    try:
        return str(ipaddress.ip_address(text)), DNS_PORT
    except ValueError:
        pass
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    try:
        ipaddress.ip_address(host)
        good = bool(sep) and port.isdigit() and 0 < int(port) <= 65535
    except ValueError:
        good = False
    if not good:
        raise ValueError(f"{text!r} is not a nameserver: IP or IP:PORT (e.g. 1.1.1.1, [::1]:53)")
    return host, int(port)
