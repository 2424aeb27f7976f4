"""UPnP port mapping (net/upnp.py) against a fake miniupnpc: the outcomes and their
reasons, the start-up bound, and when the network process asks at all. The real router
(a UPnP IGD and nftables in network namespaces) is tests/integration/test_nat.py's."""

from __future__ import annotations

import sys
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from sapo_node.net import host, upnp


class FakeGateway:
    found: Any = 1  # discover's answer, or an exception to raise
    external = "198.18.1.2"
    refuse: Exception | None = None
    calls: list[tuple]  # each test's own (the fixture's subclass)

    def __init__(self) -> None:
        self.discoverdelay = 0
        self.lanaddr = "10.1.0.2"

    def discover(self) -> int:
        if isinstance(self.found, Exception):
            raise self.found
        return self.found

    def selectigd(self) -> str:
        return "http://10.1.0.1:5000/ctl/IPConn"

    def externalipaddress(self) -> str:
        return self.external

    def addportmapping(self, *args: Any) -> bool:
        type(self).calls.append(("add", *args))
        if self.refuse is not None:
            raise self.refuse
        return True

    def deleteportmapping(self, *args: Any) -> bool:
        type(self).calls.append(("delete", *args))
        return True


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch) -> type[FakeGateway]:
    class Gateway(FakeGateway):
        calls: list[tuple] = []

    monkeypatch.setitem(sys.modules, "miniupnpc", SimpleNamespace(UPnP=Gateway))
    return Gateway


def test_a_mapping_is_leased_and_announces_the_external_address(gateway) -> None:
    mapping = upnp.map_port(4141)
    assert isinstance(mapping, upnp.Mapping)
    # 198.18/15 counts as public, as in addresses.is_lan (Python's is_private says otherwise)
    assert mapping.addr == "/ip4/198.18.1.2/tcp/4141"
    assert gateway.calls == [("add", 4141, "TCP", "10.1.0.2", 4141, "sapo-node", "", 3600)]
    mapping.delete()
    assert gateway.calls[-1] == ("delete", 4141, "TCP")


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        # miniupnpc raises "Success" when nothing answered: not one device found
        ({"found": Exception("Success")}, "no UPnP router (IGD) answered"),
        ({"found": 0}, "no UPnP router (IGD) answered"),
        ({"external": "100.64.3.4"}, "external address (100.64.3.4) is not public"),
        ({"external": "192.168.0.2"}, "external address (192.168.0.2) is not public"),
        ({"external": ""}, "external address (none given) is not public"),
        ({"refuse": Exception("ConflictInMappingEntry")}, "refused to map TCP port 4141"),
    ],
)
def test_no_mapping_says_why(gateway, setup: dict, reason: str) -> None:
    for name, value in setup.items():
        setattr(gateway, name, value)
    result = upnp.map_port(4141)
    assert isinstance(result, str) and reason in result


def test_a_router_that_never_answers_delays_start_by_the_bound_only(monkeypatch) -> None:
    """The router answers only when the test lets it, after the call has returned: so the
    call ended on its bound, whatever the machine's load (no wall-clock limit to miss)."""
    answer = threading.Event()
    monkeypatch.setattr(upnp, "map_port", lambda port: answer.wait(60) and None)
    began = time.monotonic()
    try:
        result = trio.run(upnp.open_mapping, 4141, 0.2)
        returned_unanswered = not answer.is_set()
    finally:
        answer.set()  # the router's thread ends now
    assert returned_unanswered and time.monotonic() - began >= 0.2
    assert result == "no UPnP router (IGD) answered within 0.2 s"


def settings(**changes: Any) -> dict[str, Any]:
    base = {
        "upnp": True,
        "announce": [],
        "reachability": "auto",
        "listen": ["/ip4/10.1.0.2/tcp/4141"],
    }
    return {**base, **changes}


@pytest.mark.parametrize(
    "changes",
    [
        {"upnp": False},
        {"announce": ["/ip4/203.0.113.7/tcp/4141"]},  # public already
        {"reachability": "private"},  # the user's word
        {"listen": ["/ip4/198.18.0.1/tcp/4141"]},  # a public address: nothing to map
        {"listen": ["/ip4/127.0.0.1/tcp/4141"]},  # loopback only
        {"listen": ["/ip4/10.1.0.2/tcp/0"]},  # no port known before it listens
    ],
)
def test_the_router_is_asked_only_by_a_node_that_would_be_private(
    monkeypatch, changes: dict
) -> None:
    asked = []

    async def open_mapping(port: int) -> str:
        asked.append(port)
        return "no"

    monkeypatch.setattr(upnp, "open_mapping", open_mapping)
    s = settings(**changes)
    assert trio.run(host._map_port, s) is None
    assert asked == [] and s["announce"] == settings(**changes)["announce"]
    assert trio.run(host._map_port, settings()) is None and asked == [4141]


def test_a_mapped_node_announces_the_router_address(monkeypatch, gateway) -> None:
    monkeypatch.setattr(host, "_AT_EXIT", [])
    monkeypatch.setattr(host.signal, "signal", lambda *a: None)
    s = settings()
    mapping = trio.run(host._map_port, s)
    assert isinstance(mapping, upnp.Mapping)
    assert s["announce"] == ["/ip4/198.18.1.2/tcp/4141"]
    assert len(host._AT_EXIT) == 1  # deleted when the process exits
    host._AT_EXIT[0]()
    assert gateway.calls[-1] == ("delete", 4141, "TCP")


def test_the_mapping_is_renewed_before_its_lease_ends(monkeypatch, gateway) -> None:
    mapping = upnp.map_port(4141)
    assert isinstance(mapping, upnp.Mapping)
    network = host.Network.__new__(host.Network)  # only its mapping is used
    network.mapping = mapping
    monkeypatch.setattr(upnp, "RENEW_S", 0.01)

    async def main() -> None:
        with trio.move_on_after(0.2):
            await network._keep_mapping()

    trio.run(main)
    renewals = [c for c in gateway.calls if c[0] == "add"][1:]
    assert len(renewals) >= 3 and all(c[-1] == upnp.LEASE_S for c in renewals)
