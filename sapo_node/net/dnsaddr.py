"""Bootstrap names turned into addresses a node can dial: ``/dnsaddr/`` as IPFS resolves
it, ``/dns4/``, ``/dns6/`` and ``/dns/`` through A and AAAA records.

A swarm's organiser publishes names, not addresses (docs/operations.md, "Publishing a
swarm"): the TXT records of ``_dnsaddr.NAME``, each ``dnsaddr=<multiaddr>``, list its
bootstrap peers, so they change without a release. A record may itself be a
``/dnsaddr/`` name; ``/dnsaddr/NAME/p2p/ID`` keeps only the addresses of peer ID (a
nested name without ``/p2p/`` inherits the filter).

Whoever answers DNS decides what comes back, so one configured address is bounded: at
most ``MAX_LOOKUPS`` queries (go-libp2p's basic host allows 32 resolution steps a peer),
at most ``MAX_ADDRS`` addresses out and ``MAX_ADDRS`` records read from an answer, a name
met again on its own path is a loop and is not followed, and ``timeout`` seconds for all
its lookups together. DNS trouble never raises: a name that cannot be resolved is logged
with the reason (a warning the first time in this process, a debug line when it fails
the same way again) and skipped, so one dead name costs only its own addresses.

This runs in the network process, which never imports torch; dnspython is imported only
when a name is resolved, since the config imports ``parse_nameserver`` from here.
"""

from __future__ import annotations

import ipaddress
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    import dns.resolver

log = structlog.get_logger(__name__)

MAX_LOOKUPS = 32
MAX_ADDRS = 64
DNS_PORT = 53
_IP_KINDS = ("ip4", "ip6")
_RECORDS_OF = {"dns4": ("A",), "dns6": ("AAAA",), "dns": ("A", "AAAA")}
_IP_OF_RECORD = {"A": "ip4", "AAAA": "ip6"}
_PEER = re.compile(r"[1-9A-HJ-NP-Za-km-z]{1,128}|b[a-z2-7]{1,128}")  # base58btc, CID base32
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_PREFIX = "dnsaddr="
# What this process has warned about (a name and why it failed): the re-resolution every
# few minutes logs the same failure again at debug level only.
MAX_WARNED = 256
_WARNED_BEFORE: set[tuple[str, str]] = set()


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
    sapo_node.net.dnsaddr.Unsupported: '/ip4/...' is not TCP: this node dials /tcp/PORT/p2p/...
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
    if kind not in (*_IP_KINDS, *_RECORDS_OF):
        raise ValueError(f"{addr!r}: not /ip4, /ip6, /dns4, /dns6, /dns or /dnsaddr")
    host = _ip(addr, kind, host) if kind in _IP_KINDS else _name(addr, host)
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


def resolve(
    addrs: list[str], nameservers: list[str] | None = None, timeout: float = 5.0
) -> list[str]:
    """Dialable ``/ip4|ip6/A/tcp/PORT/p2p/ID`` addresses of bootstrap ``addrs``, in
    their order, without duplicates; ``/ip4/`` and ``/ip6/`` ones pass unchanged.

    ``nameservers``: ``IP`` or ``IP:PORT`` strings; none: the system's resolver
    (/etc/resolv.conf). ``timeout``: seconds for one configured address, all its lookups
    together. Never raises for DNS trouble: what fails is logged and skipped.
    """
    run = _Resolution(nameservers or [], timeout)
    out: dict[str, None] = {}
    for addr in addrs:
        if addr.startswith(("/ip4/", "/ip6/")):
            out.setdefault(addr)
            continue
        for found in run.addresses(addr):
            out.setdefault(found)
    return list(out)


class _Resolution:
    """One ``resolve`` call: its resolver, its answers (each name asked once) and its
    warnings (each once)."""

    def __init__(self, nameservers: list[str], timeout: float) -> None:
        self.nameservers = nameservers
        self.timeout = timeout
        self.resolver: dns.resolver.Resolver | None = None
        self.answers: dict[tuple[str, str], list[str]] = {}
        self.warned: set[tuple[str, str]] = set()
        self.lookups = 0
        self.deadline = 0.0

    def warn(self, name: str, reason: str) -> None:
        if (name, reason) in self.warned:
            return
        self.warned.add((name, reason))
        if (name, reason) in _WARNED_BEFORE:  # a name that keeps failing: warned once
            log.debug("bootstrap name skipped", name=name, reason=reason)
            return
        if len(_WARNED_BEFORE) < MAX_WARNED:
            _WARNED_BEFORE.add((name, reason))
        log.warning("bootstrap name skipped", name=name, reason=reason)

    def addresses(self, addr: str) -> list[str]:
        """What one configured address resolves to, within its bounds."""
        try:
            target = parse(addr)
        except ValueError as exc:
            self.warn(addr, str(exc))
            return []
        self.lookups, self.deadline = 0, time.monotonic() + self.timeout
        warned = len(self.warned)
        out: list[str] = []
        self._expand(target, target.peer, (), out)
        if not out and len(self.warned) == warned:
            of = f" of peer {target.peer}" if target.peer else ""
            self.warn(addr, f"resolved to no address{of}")
        return out

    def _expand(
        self, target: Target, peer: str | None, path: tuple[str, ...], out: list[str]
    ) -> None:
        """Append what ``target`` resolves to (only peer ``peer``'s addresses, if given);
        ``path``: the /dnsaddr/ names that led here."""
        if peer is not None and target.peer not in (None, peer):
            return
        if target.kind in _IP_KINDS:
            self._add(out, target.text(), path)
        elif target.kind in _RECORDS_OF:
            for record in _RECORDS_OF[target.kind]:
                for ip in self._lookup(target.host, record):
                    found = Target(_IP_OF_RECORD[record], ip, target.port, target.peer)
                    self._add(out, found.text(), path)
        elif target.host.lower().rstrip(".") in path:
            self.warn(target.host, f"a loop: {' -> '.join(path)} -> {target.host}")
        else:
            inner = (*path, target.host.lower().rstrip("."))
            for record in self._lookup(f"_dnsaddr.{target.host}", "TXT"):
                if len(out) >= MAX_ADDRS:
                    self.warn(path[0] if path else target.host, f"more than {MAX_ADDRS} addresses")
                    return
                if not record.startswith(_PREFIX):
                    continue  # other TXT records share the name
                try:
                    child = parse(record.removeprefix(_PREFIX))
                except Unsupported:
                    continue
                except ValueError as exc:
                    self.warn(f"_dnsaddr.{target.host}", f"malformed record: {exc}")
                    continue
                self._expand(child, peer or target.peer, inner, out)

    def _add(self, out: list[str], addr: str, path: tuple[str, ...]) -> None:
        if len(out) < MAX_ADDRS:
            out.append(addr)
        else:
            self.warn(path[0] if path else addr, f"more than {MAX_ADDRS} addresses")

    def _lookup(self, name: str, record: str) -> list[str]:
        """The records of ``name`` (TXT: each record's strings joined), [] on failure."""
        if self.lookups >= MAX_LOOKUPS:
            self.warn(name, f"more than {MAX_LOOKUPS} DNS lookups for one address")
            return []
        self.lookups += 1  # answered from memory too: names that fan out to the same names
        key = (name.lower().rstrip("."), record)
        if key in self.answers:
            return self.answers[key]
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            self.warn(name, f"no answer within {self.timeout:g} s")
            return []
        import dns.exception

        try:
            answer = self._resolver().resolve(
                name, record, lifetime=remaining, search=False, raise_on_no_answer=False
            )
        except dns.exception.DNSException as exc:
            self.warn(name, self._reason(exc))
            found: list[str] = []
        else:
            rrset = list(answer.rrset or ())
            if len(rrset) > MAX_ADDRS:
                self.warn(name, f"more than {MAX_ADDRS} records: the rest skipped")
            found = [_text_of(rdata) for rdata in rrset[:MAX_ADDRS]]
        self.answers[key] = found
        return found

    def _resolver(self) -> dns.resolver.Resolver:
        import dns.nameserver
        import dns.resolver

        if self.resolver is None:  # the system's: NoResolverConfiguration is a DNSException
            configure = not self.nameservers
            resolver = dns.resolver.Resolver(configure=configure)
            if not configure:
                resolver.nameservers = [
                    dns.nameserver.Do53Nameserver(*parse_nameserver(text))
                    for text in self.nameservers
                ]
            self.resolver = resolver
        return self.resolver

    def _reason(self, exc: Exception) -> str:
        import dns.resolver

        if isinstance(exc, dns.resolver.NXDOMAIN):
            return "no such name (NXDOMAIN)"
        if isinstance(exc, dns.resolver.LifetimeTimeout):
            return f"no answer within {self.timeout:g} s"
        if isinstance(exc, dns.resolver.NoNameservers):
            return "no nameserver answered: " + str(exc).split(": ", 1)[-1]
        return f"{type(exc).__name__}: {exc}".splitlines()[0]


def _text_of(rdata: Any) -> str:
    if hasattr(rdata, "strings"):  # TXT: one record may be split in strings of 255 bytes
        return b"".join(rdata.strings).decode("utf-8", errors="replace")
    return rdata.address
