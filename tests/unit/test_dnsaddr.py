"""Bootstrap names resolved against a real DNS server on 127.0.0.1 (dnspython answers from
a zone defined in each test), never a mock of the resolver."""

from __future__ import annotations

import doctest
import socket
import threading
import time
from collections.abc import Callable, Iterator

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest
import structlog

from sapo_node import dialaddr
from sapo_node.dialaddr import parse, parse_nameserver
from sapo_node.net import dnsaddr
from sapo_node.net.dnsaddr import MAX_ADDRS, MAX_LOOKUPS, resolve

A = "12D3KooW" + "A" * 44
B = "12D3KooW" + "B" * 44
C = "12D3KooW" + "C" * 44


def ip(last: int, peer: str, port: int = 4141) -> str:
    return f"/ip4/127.0.0.{last}/tcp/{port}/p2p/{peer}"


def txt(*records: str) -> list[str]:
    return [f'"{r}"' for r in records]


class DnsServer:
    """Answers UDP queries from ``zone`` ({(name, type): [rdata text], or "SERVFAIL"}): a
    name absent under every type is NXDOMAIN, a type absent under a known name an empty
    answer."""

    def __init__(self, zone: dict[tuple[str, str], list[str]]) -> None:
        self.zone = {
            (name.lower().rstrip(".") + ".", kind): rdata for (name, kind), rdata in zone.items()
        }
        self.queries: list[tuple[str, str]] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                data, peer = self.sock.recvfrom(65535)
            except TimeoutError:
                continue
            query = dns.message.from_wire(data)
            response = dns.message.make_response(query)
            question = query.question[0]
            name, kind = question.name.to_text().lower(), dns.rdatatype.to_text(question.rdtype)
            self.queries.append((name, kind))
            if self.zone.get((name, kind)) == "SERVFAIL":
                response.set_rcode(dns.rcode.SERVFAIL)
            elif (name, kind) in self.zone:
                rrset = dns.rrset.from_text(question.name, 60, "IN", kind, *self.zone[name, kind])
                response.answer.append(rrset)
            elif all(known != name for known, _ in self.zone):
                response.set_rcode(dns.rcode.NXDOMAIN)
            self.sock.sendto(response.to_wire(), peer)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=2.0)
        self.sock.close()
        assert not self.thread.is_alive()


@pytest.fixture
def serve() -> Iterator[Callable[[dict], DnsServer]]:
    """Start a DNS server on a zone; every one started stops at the test's end."""
    servers: list[DnsServer] = []

    def start(zone: dict) -> DnsServer:
        servers.append(DnsServer(zone))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def warnings(logs: list[dict]) -> list[dict]:
    return [e for e in logs if e["log_level"] == "warning"]


@pytest.fixture(autouse=True)
def _nothing_warned_before():
    """Each test as a fresh network process: no failure warned about yet."""
    dnsaddr._WARNED_BEFORE.clear()
    yield
    dnsaddr._WARNED_BEFORE.clear()


def test_doctests() -> None:
    assert doctest.testmod(dnsaddr).failed == 0
    assert doctest.testmod(dialaddr).failed == 0


def test_ip_addresses_pass_unchanged_and_ask_nothing(serve) -> None:
    server = serve({})
    addrs = [ip(1, A), "/ip6/::1/tcp/4141/p2p/" + B, ip(1, A)]
    assert resolve(addrs, [server.address]) == addrs[:2]
    assert resolve(addrs) == addrs[:2]  # no nameserver needed
    assert server.queries == []


def test_dnsaddr_with_two_records(serve) -> None:
    server = serve(
        {("_dnsaddr.boot.test", "TXT"): txt(f"dnsaddr={ip(1, A)}", f"dnsaddr={ip(2, B)}")}
    )
    with structlog.testing.capture_logs() as logs:
        found = resolve(["/dnsaddr/boot.test"], [server.address])
    assert sorted(found) == [ip(1, A), ip(2, B)]
    assert warnings(logs) == []


def test_p2p_suffix_keeps_only_that_peer(serve) -> None:
    zone = {("_dnsaddr.boot.test", "TXT"): txt(f"dnsaddr={ip(1, A)}", f"dnsaddr={ip(2, B)}")}
    server = serve(zone)
    assert resolve([f"/dnsaddr/boot.test/p2p/{B}"], [server.address]) == [ip(2, B)]
    with structlog.testing.capture_logs() as logs:
        assert resolve([f"/dnsaddr/boot.test/p2p/{C}"], [server.address]) == []
    assert "no address" in warnings(logs)[0]["reason"]


def test_nested_dnsaddr_and_order_without_duplicates(serve) -> None:
    zone = {
        ("_dnsaddr.boot.test", "TXT"): txt("dnsaddr=/dnsaddr/eu.boot.test", f"dnsaddr={ip(3, C)}"),
        ("_dnsaddr.eu.boot.test", "TXT"): txt(f"dnsaddr={ip(1, A)}"),
    }
    server = serve(zone)
    found = resolve([ip(9, B), "/dnsaddr/boot.test", ip(1, A)], [server.address])
    assert found[0] == ip(9, B) and sorted(found[1:]) == [ip(1, A), ip(3, C)]  # ip(1, A) once
    # the filter reaches through a nested name without /p2p/
    assert resolve([f"/dnsaddr/boot.test/p2p/{A}"], [server.address]) == [ip(1, A)]


def test_a_loop_ends_at_once_with_a_warning(serve) -> None:
    zone = {
        ("_dnsaddr.a.test", "TXT"): txt("dnsaddr=/dnsaddr/b.test", f"dnsaddr={ip(1, A)}"),
        ("_dnsaddr.b.test", "TXT"): txt("dnsaddr=/dnsaddr/a.test"),
    }
    server = serve(zone)
    with structlog.testing.capture_logs() as logs:
        assert resolve(["/dnsaddr/a.test"], [server.address]) == [ip(1, A)]
    assert len(server.queries) == 2
    assert [w["reason"] for w in warnings(logs)] == ["a loop: a.test -> b.test -> a.test"]


def test_a_long_chain_stops_at_the_lookup_bound(serve) -> None:
    zone = {
        (f"_dnsaddr.n{i}.test", "TXT"): txt(f"dnsaddr=/dnsaddr/n{i + 1}.test") for i in range(50)
    }
    server = serve(zone)
    with structlog.testing.capture_logs() as logs:
        assert resolve(["/dnsaddr/n0.test"], [server.address]) == []
    assert len(server.queries) == MAX_LOOKUPS
    assert "DNS lookups" in warnings(logs)[0]["reason"]


def test_names_that_fan_out_to_the_same_names_stop_at_the_lookup_bound(serve) -> None:
    """Two names a level, each pointing at both of the next level's: 2**40 paths, each
    name asked once, and every step counted."""
    zone = {
        (f"_dnsaddr.{side}{i}.test", "TXT"): txt(
            f"dnsaddr=/dnsaddr/a{i + 1}.test", f"dnsaddr=/dnsaddr/b{i + 1}.test"
        )
        for i in range(40)
        for side in "ab"
    }
    server = serve(zone)
    with structlog.testing.capture_logs() as logs:
        began = time.monotonic()
        assert resolve(["/dnsaddr/a0.test"], [server.address]) == []
    assert time.monotonic() - began < 5.0 and len(server.queries) <= MAX_LOOKUPS
    assert "DNS lookups" in warnings(logs)[0]["reason"]


def test_a_failing_nameserver_is_a_warning(serve) -> None:
    server = serve({("_dnsaddr.boot.test", "TXT"): "SERVFAIL"})
    with structlog.testing.capture_logs() as logs:
        assert resolve(["/dnsaddr/boot.test"], [server.address]) == []
    assert warnings(logs)[0]["reason"].startswith("no nameserver answered: ")


def test_a_large_answer_is_cut_at_the_address_bound(serve) -> None:
    records = [f"dnsaddr=/ip4/127.0.{i // 250}.{i % 250 + 1}/tcp/4141/p2p/{A}" for i in range(200)]
    server = serve({("_dnsaddr.big.test", "TXT"): txt(*records)})
    with structlog.testing.capture_logs() as logs:
        found = resolve(["/dnsaddr/big.test"], [server.address])
    assert len(found) == MAX_ADDRS
    assert f"more than {MAX_ADDRS}" in warnings(logs)[0]["reason"]


def test_nxdomain_is_a_warning_and_nothing(serve) -> None:
    server = serve({("_dnsaddr.boot.test", "TXT"): txt(f"dnsaddr={ip(1, A)}")})
    with structlog.testing.capture_logs() as logs:
        assert resolve(["/dnsaddr/nope.test", "/dnsaddr/boot.test"], [server.address]) == [ip(1, A)]
    (warning,) = warnings(logs)
    assert warning["name"] == "_dnsaddr.nope.test" and "NXDOMAIN" in warning["reason"]


@pytest.mark.parametrize("silent", [True, False], ids=["silent", "closed"])
def test_a_nameserver_that_does_not_answer_costs_at_most_the_timeout(silent: bool) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))  # bound and never read: no answer, no refusal
    port = sock.getsockname()[1]
    if not silent:
        sock.close()  # nothing there (the kernel's refusal does not reach dnspython)
    try:
        with structlog.testing.capture_logs() as logs:
            began = time.monotonic()
            found = resolve(["/dnsaddr/boot.test"], [f"127.0.0.1:{port}"], timeout=0.5)
            took = time.monotonic() - began
    finally:
        sock.close()
    assert found == [] and took < 3.0
    (warning,) = warnings(logs)
    assert warning["name"] == "_dnsaddr.boot.test"
    assert warning["reason"] == "no answer within 0.5 s"


def test_malformed_records_are_skipped_with_a_warning(serve) -> None:
    records = [
        "v=spf1 -all",  # not a dnsaddr record: ignored quietly
        "dnsaddr=/ip4/999.0.0.1/tcp/4141/p2p/" + A,
        "dnsaddr=garbage",
        "dnsaddr=/ip4/127.0.0.1/tcp/4141",
        f"dnsaddr=/ip4/127.0.0.1/udp/4001/quic-v1/p2p/{A}",  # not TCP: skipped quietly
        f"dnsaddr={ip(2, B)}",
    ]
    server = serve({("_dnsaddr.boot.test", "TXT"): txt(*records)})
    with structlog.testing.capture_logs() as logs:
        assert resolve(["/dnsaddr/boot.test"], [server.address]) == [ip(2, B)]
    reasons = [w["reason"] for w in warnings(logs)]
    assert len(reasons) == 3 and all(r.startswith("malformed record") for r in reasons)


def test_dns4_through_an_a_record(serve) -> None:
    server = serve({("boot.test", "A"): ["127.0.0.7", "127.0.0.8"]})
    found = resolve(
        [f"/dns4/boot.test/tcp/4141/p2p/{A}", f"/dns/boot.test/tcp/1/p2p/{B}"], [server.address]
    )
    # the configured order kept; a record set has none
    assert sorted(found[:2]) == [ip(7, A), ip(8, A)]
    assert sorted(found[2:]) == [ip(7, B, 1), ip(8, B, 1)]


def test_a_name_that_keeps_failing_is_warned_about_once_a_process() -> None:
    """The network process resolves its bootstrap names again every few minutes: the
    same failure is a warning the first time and a debug line after."""
    for _ in range(3):
        with structlog.testing.capture_logs() as logs:
            assert resolve(["/dnsaddr/bad..name", ip(1, A)]) == [ip(1, A)]
        warned = [e for e in warnings(logs) if e["event"] == "bootstrap name skipped"]
        assert len(warned) == (1 if _ == 0 else 0)  # after: debug (shown as configured)
    with structlog.testing.capture_logs() as logs:  # another failure is news
        resolve(["/dnsaddr/other..name"])
    assert len(warnings(logs)) == 1


def test_an_unusable_configured_address_is_skipped_not_raised() -> None:
    with structlog.testing.capture_logs() as logs:
        assert resolve(["/dnsaddr/bad..name", "nonsense", ip(1, A)]) == [ip(1, A)]
    assert len(warnings(logs)) == 2


@pytest.mark.parametrize(
    "addr",
    [
        ip(1, A),
        "/ip6/::1/tcp/4141/p2p/" + A,
        f"/dns4/boot.example.org/tcp/4141/p2p/{A}",
        f"/dns/boot.example.org/tcp/4141/ipfs/{A}",
        "/dnsaddr/bootstrap.example.org",
        f"/dnsaddr/bootstrap.example.org/p2p/{A}",
    ],
)
def test_bootstrap_forms_that_parse(addr: str) -> None:
    assert parse(addr).text() == addr.replace("/ipfs/", "/p2p/")


@pytest.mark.parametrize(
    ("addr", "needle"),
    [
        ("ip4/127.0.0.1/tcp/1/p2p/" + A, "not a multiaddr"),
        ("/ip4/127.0.0.1/tcp/4141", "lacks /p2p/"),
        (f"/dns4/boot.test/tcp/4141/p2p/{A}/x", "lacks /p2p/"),
        (f"/ip4/127.0.0.1/tcp/0/p2p/{A}", "port '0'"),
        (f"/ip4/127.0.0.1/tcp/70000/p2p/{A}", "port '70000'"),
        (f"/ip4/::1/tcp/1/p2p/{A}", "no ip4 address"),
        (f"/dns4/-bad-/tcp/1/p2p/{A}", "no DNS name"),
        ("/dnsaddr/boot.test/tcp/1", "followed only by /p2p/"),
        ("/dnsaddr/boot.test/p2p/0OIl", "no peer ID"),
        (f"/unix/x/p2p/{A}", "not /ip4"),
        (f"/ip4/127.0.0.1/tcp/1/ws/p2p/{A}", "not TCP"),
    ],
)
def test_bootstrap_forms_that_do_not(addr: str, needle: str) -> None:
    with pytest.raises(ValueError, match=None) as err:
        parse(addr)
    assert needle in str(err.value)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("127.0.0.53", ("127.0.0.53", 53)),
        ("127.0.0.1:5353", ("127.0.0.1", 5353)),
        ("::1", ("::1", 53)),
        ("[::1]:5353", ("::1", 5353)),
        ("dns.example.org", None),
        ("127.0.0.1:0", None),
        ("127.0.0.1:x", None),
        ("", None),
    ],
)
def test_nameservers(text: str, parsed: tuple[str, int] | None) -> None:
    if parsed is None:
        with pytest.raises(ValueError, match="not a nameserver"):
            parse_nameserver(text)
    else:
        assert parse_nameserver(text) == parsed
