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

The addresses' form is checked by ``sapo_node.dialaddr``, which the config uses too
without loading this module. This runs in the network process, which never imports
torch; dnspython is imported only when a name is resolved.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import structlog

from sapo_node.dialaddr import IP_KINDS, Target, Unsupported, parse, parse_nameserver

if TYPE_CHECKING:
    import dns.resolver

log = structlog.get_logger(__name__)

MAX_LOOKUPS = 32
MAX_ADDRS = 64
_RECORDS_OF = {"dns4": ("A",), "dns6": ("AAAA",), "dns": ("A", "AAAA")}
_IP_OF_RECORD = {"A": "ip4", "AAAA": "ip6"}
_PREFIX = "dnsaddr="
# What this process has warned about (a name and why it failed): the re-resolution every
# few minutes logs the same failure again at debug level only.
MAX_WARNED = 256
_WARNED_BEFORE: set[tuple[str, str]] = set()


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
        if target.kind in IP_KINDS:
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
