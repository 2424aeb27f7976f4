"""Reachability and the addresses a peer may see (sapo_node/net/reach.py)."""

from __future__ import annotations

import doctest

import pytest

from sapo_node.net import reach


def test_doctests() -> None:
    assert doctest.testmod(reach).failed == 0


@pytest.mark.parametrize(
    ("setting", "announce", "addrs", "expected", "reason"),
    [
        ("auto", [], ["/ip4/192.168.1.20/tcp/4141", "/ip4/172.17.0.2/tcp/4141"], "private", "nat"),
        ("auto", [], ["/ip4/100.72.1.9/tcp/4141"], "private", "nat"),  # carrier-grade NAT
        ("auto", [], [], "private", "nat"),  # no address at all: nobody can dial it
        ("auto", [], ["/ip4/10.0.0.5/tcp/4141", "/ip4/203.0.113.7/tcp/4141"], "public", "address"),
        ("auto", ["/ip4/203.0.113.7/tcp/4141"], ["/ip4/10.0.0.5/tcp/4141"], "public", "announce"),
        ("auto", [], ["/ip4/127.0.0.1/tcp/4141", "/ip6/::1/tcp/4141"], "local", "loopback"),
        ("auto", [], ["/ip4/127.0.0.1/tcp/4141", "/ip4/10.0.0.5/tcp/4141"], "private", "nat"),
        ("public", [], ["/ip4/10.0.0.5/tcp/4141"], "public", "config"),
        ("private", [], ["/ip4/203.0.113.7/tcp/4141"], "private", "config"),
    ],
)
def test_decide(
    setting: str, announce: list[str], addrs: list[str], expected: str, reason: str
) -> None:
    assert reach.decide(setting, announce, addrs) == expected
    assert reach.explain(setting, announce, addrs) == (expected, reason)


def test_a_private_node_shows_outsiders_no_lan_address() -> None:
    mine = [
        "/ip4/192.168.1.20/tcp/4141",
        "/ip6/fe80::1/tcp/4141",
        "/ip4/198.51.100.4/tcp/4001/p2p/12D3KooWRelay/p2p-circuit",  # a relayed address
    ]
    outside = reach.shown("private", mine, "198.18.0.1")
    assert outside == ["/ip4/198.51.100.4/tcp/4001/p2p/12D3KooWRelay/p2p-circuit"]
    assert reach.shown("private", mine, None) == outside  # unknown: treated as outside
    assert reach.shown("private", mine, "192.168.1.9") == mine  # its LAN sees everything
    assert reach.shown("private", mine, "127.0.0.1") == mine
    assert reach.shown("public", mine, "198.18.0.1") == mine
    assert reach.shown("local", mine, "198.18.0.1") == mine


def test_the_signed_peer_record_of_a_private_node_holds_no_lan_address(monkeypatch) -> None:
    """docs/libp2p.md#addresses-shown-to-peers: the record py-libp2p attaches to pubsub,
    DHT and identify messages is signed over what a stranger may see, not over
    ``host.get_addrs()`` whole."""
    import multiaddr
    from libp2p import new_host
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.kad_dht import kad_dht
    from libp2p.peer.envelope import consume_envelope
    from libp2p.pubsub import gossipsub, pubsub

    from sapo_node.net import patches
    from sapo_node.net.state import STATE

    patches.apply()  # as the network process does at start
    node = new_host(key_pair=create_new_key_pair())
    lan, wan = "/ip4/10.2.0.2/tcp/4001", "/ip4/198.18.1.2/tcp/4001"
    monkeypatch.setattr(node, "get_addrs", lambda: [multiaddr.Multiaddr(lan)])
    for state, want in (("private", set()), ("public", {lan})):
        monkeypatch.setattr(STATE, "reachability", state)
        for module in (pubsub, gossipsub, kad_dht):
            _, record = consume_envelope(module.env_to_send_in_RPC(node)[0], "libp2p-peer-record")
            assert {str(a) for a in record.addrs} == want, (state, module.__name__)
    # a private node with a public address (a forwarded port) shows that one
    monkeypatch.setattr(node, "get_addrs", lambda: [multiaddr.Multiaddr(a) for a in (lan, wan)])
    monkeypatch.setattr(STATE, "reachability", "private")
    _, record = consume_envelope(pubsub.env_to_send_in_RPC(node)[0], "libp2p-peer-record")
    assert {str(a) for a in record.addrs} == {wan}


def test_autonat_needs_two_hosts_failing_and_none_reaching_to_call_a_node_private() -> None:
    from sapo_node.net.autonat import FAILED, OK, tcp_target, verdict

    a, b = "198.18.0.1", "198.18.0.2"
    assert verdict([]) is None
    assert verdict([(a, FAILED)]) is None  # one server's word is not enough
    assert verdict([(a, FAILED), (a, FAILED)]) is None  # nor one host's, twice
    assert verdict([(a, FAILED), (b, FAILED)]) == "private"
    assert verdict([(a, FAILED), (b, FAILED), ("198.18.0.3", OK)]) == "public"
    assert verdict([(a, OK)]) == "public"  # a dial-back that reached it proves it
    assert verdict([(a, 101), (b, 101)]) is None  # refusals (no address to try) say nothing
    # only direct TCP addresses are dialled back
    import multiaddr

    raw = lambda s: multiaddr.Multiaddr(s).to_bytes()  # noqa: E731
    assert tcp_target(raw("/ip4/198.18.4.2/tcp/4141")) == ("198.18.4.2", 4141)
    assert tcp_target(raw("/ip4/198.18.0.1/tcp/4001/p2p-circuit")) is None
    assert tcp_target(raw("/ip4/198.18.4.2/udp/4141")) is None


def test_a_node_autonat_turned_private_shows_peers_elsewhere_only_its_relayed_addresses(
    monkeypatch,
) -> None:
    from sapo_node.net.state import STATE

    public, lan = "/ip4/203.0.113.7/tcp/4141", "/ip4/192.168.1.20/tcp/4141"
    relayed = "/ip4/198.18.0.1/tcp/4001/p2p/12D3KooWRelay/p2p-circuit"
    monkeypatch.setattr(STATE, "reachability", "private")
    monkeypatch.setattr(STATE, "unreachable", {public})
    monkeypatch.setattr(STATE, "relayed", [relayed])
    mine = [f"{public}/p2p/12D3KooWMe", lan]
    assert STATE.shown(mine, "198.18.0.9") == [relayed]
    assert STATE.shown(mine, "192.168.1.9") == [lan, relayed]  # its LAN
