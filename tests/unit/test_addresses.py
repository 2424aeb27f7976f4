"""Reachability and the addresses a peer may see (sapo_node/addresses.py)."""

from __future__ import annotations

import doctest

import pytest

from sapo_node import addresses


def test_doctests() -> None:
    from sapo_node.net import autonat

    assert doctest.testmod(addresses).failed == 0
    assert doctest.testmod(autonat).failed == 0


@pytest.mark.parametrize(
    ("ip", "lan"),
    [
        ("::ffff:10.0.0.1", True),  # IPv4-mapped: what a dual-stack socket shows
        ("::ffff:127.0.0.1", True),
        ("::ffff:192.168.1.1", True),
        ("0:0:0:0:0:ffff:c0a8:101", True),  # the same, written in full
        ("::ffff:198.18.0.1", False),
        ("64:ff9b::a00:1", True),  # NAT64 of 10.0.0.1
        ("64:ff9b::7f00:1", True),  # of 127.0.0.1
        ("64:ff9b::c612:1", False),  # of 198.18.0.1
        ("2002:c0a8:101::1", True),  # 6to4 of 192.168.1.1
        ("2002:7f00:1:2::9", True),  # of 127.0.0.1
        ("2002:c612:1::1", False),  # of 198.18.0.1
        ("2001:db8::1", False),
        ("fd00::1", True),
    ],
)
def test_an_address_that_embeds_ipv4_is_judged_by_it(ip: str, lan: bool) -> None:
    from sapo_node.net.autonat import network_of

    assert addresses.is_lan(ip) is lan
    assert addresses.is_lan_addr(f"/ip6/{ip}/tcp/4141") is lan
    embedded = addresses.judged(ip)
    if embedded.version == 4:  # one /24 with the IPv4 address, however it is written
        assert network_of(ip) == network_of(str(embedded))
    mine = ["/ip4/192.168.1.20/tcp/4141"]
    assert (addresses.shown("private", mine, ip) == mine) is lan  # its LAN sees its LAN addresses


def test_ipv4_mapped_addresses_vote_apart_and_are_never_shown() -> None:
    from sapo_node.net.autonat import FAILED, verdict

    # a dual-stack listener sees IPv4 servers as mapped: two /24s, two votes, not one ::/48
    assert verdict([("::ffff:198.18.0.1", FAILED), ("::ffff:203.0.113.9", FAILED)]) == "private"
    assert verdict([("::ffff:198.18.0.1", FAILED), ("198.18.0.2", FAILED)]) is None  # one /24
    mapped = "/ip6/::ffff:198.18.0.2/tcp/4141"
    for state in ("public", "private", "local"):
        assert addresses.shown(state, [mapped, "/ip4/198.18.0.2/tcp/4141"], "198.18.0.9") == [
            "/ip4/198.18.0.2/tcp/4141"
        ]
    assert addresses.is_mapped_addr(mapped) and not addresses.is_mapped_addr(
        "/ip4/198.18.0.2/tcp/1"
    )
    assert addresses.explain("auto", [], ["/ip6/::ffff:127.0.0.1/tcp/4141"]) == (
        "local",
        "loopback",
    )


def test_an_ipv4_mapped_announce_address_is_refused_with_the_ipv4_one_to_give() -> None:
    from sapo_node.config import NetSection

    with pytest.raises(ValueError, match="IPv4-mapped.*give it as /ip4/203.0.113.7/"):
        NetSection(announce=["/ip6/::ffff:203.0.113.7/tcp/4141"])


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
    assert addresses.decide(setting, announce, addrs) == expected
    assert addresses.explain(setting, announce, addrs) == (expected, reason)


def test_a_private_node_shows_outsiders_no_lan_address() -> None:
    mine = [
        "/ip4/192.168.1.20/tcp/4141",
        "/ip6/fe80::1/tcp/4141",
        "/ip4/198.51.100.4/tcp/4001/p2p/12D3KooWRelay/p2p-circuit",  # a relayed address
    ]
    outside = addresses.shown("private", mine, "198.18.0.1")
    assert outside == ["/ip4/198.51.100.4/tcp/4001/p2p/12D3KooWRelay/p2p-circuit"]
    assert addresses.shown("private", mine, None) == outside  # unknown: treated as outside
    assert addresses.shown("private", mine, "192.168.1.9") == mine  # its LAN sees everything
    assert addresses.shown("private", mine, "127.0.0.1") == mine
    assert addresses.shown("public", mine, "198.18.0.1") == mine
    assert addresses.shown("local", mine, "198.18.0.1") == mine


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


def test_autonat_needs_a_majority_of_networks_failing_to_call_a_node_private() -> None:
    from sapo_node.net.autonat import FAILED, OK, network_of, tcp_target, verdict

    a, b, c = "198.18.0.1", "198.18.1.1", "198.18.2.1"  # three /24s
    assert verdict([]) is None
    assert verdict([(a, FAILED)]) is None  # one server's word is not enough
    assert verdict([(a, FAILED), (a, FAILED)]) is None  # nor one host's, twice
    assert verdict([(a, FAILED), (b, FAILED)]) == "private"
    # one /24, one /48 is one operator's: however many addresses it lies from, one vote
    assert verdict([(f"198.18.0.{i}", FAILED) for i in range(1, 200)]) is None
    v6 = [(f"2001:db8:7:{i:x}::1", FAILED) for i in range(64)]  # 64 /64s of one /48
    assert verdict(v6) is None
    assert verdict([*v6, ("2001:db8:8::1", FAILED)]) == "private"  # a second /48
    assert network_of("2001:db8:7:ffff::1") == network_of("2001:db8:7::9") == "2001:db8:7::/48"
    assert network_of("198.18.0.77") == "198.18.0.0/24" != network_of(b)
    # a majority: one network reaching it outweighs one failing, not two
    assert verdict([(a, FAILED), (b, OK)]) == "public"
    assert verdict([(a, FAILED), (b, FAILED), (c, OK)]) == "private"
    assert verdict([(a, FAILED), (b, FAILED), (c, OK), ("198.18.3.1", OK)]) == "public"
    assert verdict([(a, FAILED), ("198.18.0.2", OK), (b, FAILED)]) == "public"  # a's /24: OK
    assert verdict([(a, OK)]) == "public"  # a dial-back that reached it proves it
    assert verdict([(a, 101), (b, 101)]) is None  # refusals (no address to try) say nothing
    # one network's failure, then ALONE_S with no peer dialling in (a single public node)
    assert verdict([(a, FAILED)], unreached=True) == "private"
    assert verdict([(a, FAILED), (b, OK)], unreached=True) == "public"
    assert verdict([(a, 101)], unreached=True) is None
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


def test_a_peer_outside_the_lan_dialling_in_is_evidence_of_reachability() -> None:
    """What stops one failed dial-back from making a node private (autonat.ALONE_S): a
    direct connection a peer outside the LAN dialled to it. The direction is the
    library's, read on real loopback connections; the addresses are then replaced, since
    loopback is a LAN range."""
    from types import SimpleNamespace

    import multiaddr
    import trio
    from libp2p.peer.peerinfo import info_from_p2p_addr

    from sapo_node.net.network import Network
    from tests.support.rogue import make_host

    async def connected() -> tuple[list, list]:
        a, b = make_host(), make_host()
        listen = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
        async with a.run(listen_addrs=listen), b.run(listen_addrs=listen):
            await a.connect(
                info_from_p2p_addr(
                    multiaddr.Multiaddr(f"{b.get_addrs()[0]}/p2p/{b.get_id().pretty()}")
                    if "/p2p/" not in str(b.get_addrs()[0])
                    else b.get_addrs()[0]
                )
            )
            conns = lambda h: [c for cs in h.get_network().connections.values() for c in cs]  # noqa: E731
            return conns(a), conns(b)

    dialled, accepted = trio.run(connected)

    def node(conns: list, addr: str | None = None) -> SimpleNamespace:
        for c in conns:
            if addr is not None:
                c.get_transport_addresses = lambda: [multiaddr.Multiaddr(addr)]
        network = SimpleNamespace(connections={"peer": conns})
        stub = SimpleNamespace(host=SimpleNamespace(get_network=lambda: network))
        stub._conns = lambda peer: network.connections[peer]
        return stub

    check = Network._dialled_in_from_outside
    assert not check(node(accepted))  # on loopback: a LAN peer proves nothing
    assert check(node(accepted, "/ip4/198.18.0.1/tcp/4001"))  # a peer elsewhere dialled in
    assert not check(node(accepted, "/ip4/192.168.1.9/tcp/4001"))  # a LAN peer
    assert not check(node(accepted, "/ip6/::ffff:192.168.1.9/tcp/4001"))  # one, IPv4-mapped
    assert check(node(accepted, "/ip6/::ffff:198.18.0.1/tcp/4001"))
    assert not check(node(dialled, "/ip4/198.18.0.1/tcp/4001"))  # this node dialled out
    relayed = "/ip4/198.18.0.1/tcp/4001/p2p/12D3KooWRelay/p2p-circuit"
    assert not check(node(accepted, relayed))  # through a relay: not a dial to this node


@pytest.mark.parametrize(
    ("addr", "outside"),
    [
        ("/ip4/198.18.0.9/tcp/4141", True),
        ("/ip6/2001:db8::9/tcp/4141", True),
        ("/ip4/198.51.100.4/tcp/4001/p2p/12D3KooWRelay/p2p-circuit", True),  # a public relay
        ("/p2p/12D3KooWRelay/p2p-circuit", True),  # the relay dialled at its own addresses
        ("/ip4/192.168.1.1/tcp/80", False),  # a hostile peer's picks on the victim's LAN
        ("/ip4/127.0.0.1/tcp/22", False),
        ("/ip4/10.0.0.1/tcp/8080", False),
        ("/ip6/::1/tcp/22", False),
        ("/ip6/fe80::1/tcp/22", False),
        ("/ip6/::ffff:192.168.1.1/tcp/80", False),  # IPv4-mapped: judged as the IPv4
        ("/ip6/64:ff9b::7f00:1/tcp/22", False),  # NAT64 of 127.0.0.1
        ("/ip4/192.168.1.9/tcp/4001/p2p/12D3KooWRelay/p2p-circuit", False),  # a LAN relay
        ("/dns4/localhost/tcp/22", False),  # a name may resolve to the LAN or loopback
        ("/dnsaddr/example.org", False),
    ],
)
def test_a_strangers_address_leads_outside_only_as_an_ip_beyond_the_lan(
    addr: str, outside: bool
) -> None:
    """docs/libp2p.md#addresses-from-strangers: what a node may dial of what others gave."""
    assert addresses.leads_outside(addr) is outside


def test_the_addresses_others_give_for_a_peer_lose_their_lan_ones_unless_trusted() -> None:
    """A hostile peer lists, beside a public address, LAN and loopback ones at ports of
    its choosing: a node keeps only the public one, unless it trusts the peer (it is
    local, or the peer is on its LAN), which it asks only when there is something to drop."""
    public = "/ip4/198.18.0.9/tcp/4141"
    listed = [public, "/ip4/192.168.1.1/tcp/80", "/ip4/127.0.0.1/tcp/22", "/ip4/10.0.0.1/tcp/8080"]
    asked: list[bool] = []

    def trusted(answer: bool):
        return lambda: asked.append(answer) or answer

    assert addresses.from_others(listed, trusted(False)) == [public]
    assert addresses.from_others(listed, trusted(True)) == listed
    assert addresses.from_others([public], trusted(False)) == [public]
    assert asked == [False, True]  # not asked for an address list that leads outside
    assert addresses.from_others(["/ip4/127.0.0.1/tcp/22"], lambda: False) == []
    addresses.count_as_lan(["198.19.0.0/16"])  # net.lan_ranges counts too
    try:
        assert addresses.from_others(["/ip4/198.19.1.2/tcp/4141"], lambda: False) == []
    finally:
        addresses.count_as_lan([])


def test_ranges_counted_as_lan_make_a_node_private_and_hide_its_addresses() -> None:
    """net.lan_ranges: a network numbered out of other space (here 198.19/16, as the
    namespace tests number their home LANs) counts as LAN, as RFC 1918 does."""
    mine = ["/ip4/198.19.1.2/tcp/4141"]
    assert addresses.explain("auto", [], mine) == ("public", "address")
    addresses.count_as_lan(["198.19.0.0/16", "fd00:1::/64"])
    try:
        assert addresses.explain("auto", [], mine) == ("private", "nat")
        assert addresses.shown("private", mine, "198.18.0.1") == []
        assert addresses.shown("private", mine, "198.19.1.9") == mine  # its LAN sees it
        assert addresses.is_lan("fd00:1::5") and not addresses.is_lan("198.18.0.1")
        assert addresses.is_lan("10.0.0.5")  # the built-in ranges still count
    finally:
        addresses.count_as_lan([])
    assert not addresses.is_lan("198.19.1.2")
    with pytest.raises(ValueError):
        addresses.count_as_lan(["198.19.0.1/16"])  # host bits set


class _Host:
    """What SwarmAutoNAT asks of a host when it is made."""

    def __init__(self) -> None:
        self.handlers: dict[str, object] = {}

    def get_peerstore(self) -> None:
        return None

    def set_stream_handler(self, protocol: str, handler: object) -> None:
        self.handlers[protocol] = handler


def test_a_dial_back_connect_timeout_is_a_setting_that_must_be_positive() -> None:
    from sapo_node.net import autonat

    assert autonat.SwarmAutoNAT(_Host(), serve=True).connect_s == autonat.CONNECT_S
    assert autonat.SwarmAutoNAT(_Host(), serve=True, connect_s=0.5).connect_s == 0.5
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="connect timeout must be > 0 s"):
            autonat.SwarmAutoNAT(_Host(), serve=False, connect_s=bad)


def test_two_lying_networks_do_not_demote_a_node_a_peer_elsewhere_dialled(monkeypatch) -> None:
    """AutoNAT (net/autonat.py, verdict): two servers in two /24s (127.0.0.1 and
    127.0.1.1, real hosts on loopback) answer every dial-back request "failed". A public
    node that no peer outside the LAN dialled is demoted by them; one that such a peer
    dialled during the check is not, and one dialled before the check is demoted only
    once ALONE_S has passed with no peer dialling in. The peer elsewhere is a real
    connection dialled to the node whose address is then replaced, since loopback is a
    LAN range."""
    from types import SimpleNamespace

    import multiaddr
    import trio
    from libp2p.host.autonat.pb.autonat_pb2 import Message
    from libp2p.peer.peerinfo import PeerInfo
    from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes_limited

    from sapo_node.net import autonat
    from sapo_node.net.network import Network
    from sapo_node.net.state import STATE
    from tests.support.rogue import make_host

    def liar(host) -> None:
        async def answer(stream) -> None:
            await read_varint_prefixed_bytes_limited(stream, autonat.MAX_MESSAGE)
            response = Message()
            response.type = Message.DIAL_RESPONSE
            response.dialResponse.status = Message.E_DIAL_ERROR
            await stream.write(encode_varint_prefixed(response.SerializeToString()))
            await stream.close()

        host.set_stream_handler(autonat.PROTOCOL, answer)

    async def check(outsider: bool, alone_s: float, within_s: float) -> str | None:
        node_host, outside = make_host(), make_host()
        liars = [make_host(), make_host()]
        for host in liars:
            liar(host)
        at = lambda ip: [multiaddr.Multiaddr(f"/ip4/{ip}/tcp/0")]  # noqa: E731
        async with (
            node_host.run(listen_addrs=at("127.0.0.1")),
            liars[0].run(listen_addrs=at("127.0.0.1")),
            liars[1].run(listen_addrs=at("127.0.1.1")),  # another /24
            outside.run(listen_addrs=at("127.0.0.1")),
        ):
            node = SimpleNamespace(
                host=node_host,
                autonat=autonat.SwarmAutoNAT(node_host, serve=False),
                s={"redial_s": 0.2, "autonat_alone_s": alone_s, "autonat_retry_s": 0.5},
                reachability="public",
                autonat_answers={},
                autonat_failed_at=None,
            )
            for name in (
                "_conns",
                "_autonat_servers",
                "_ask_dial_back",
                "_dialled_in_from_outside",
            ):
                setattr(node, name, getattr(Network, name).__get__(node))
            store = node_host.get_peerstore()
            with trio.fail_after(20):
                for host in liars:
                    await node_host.connect(PeerInfo(host.get_id(), host.get_addrs()))
                    while str(autonat.PROTOCOL) not in (store.get_protocols(host.get_id()) or ()):
                        await trio.sleep(0.05)
                if outsider:
                    await outside.connect(PeerInfo(node_host.get_id(), node_host.get_addrs()))
                    elsewhere = [multiaddr.Multiaddr("/ip4/198.18.0.9/tcp/4001")]
                    for conn in node_host.get_network().get_connections(outside.get_id()):
                        conn.get_transport_addresses = lambda: elsewhere
            found = None
            with trio.move_on_after(within_s):
                found = await Network._ask_until_sure(node)
            ips = {autonat.network_of(ip) for ip in node.autonat_answers}
            assert len(ips) == 2 and set(node.autonat_answers.values()) == {autonat.FAILED}
            return found

    # no peer elsewhere ever dialled it: two networks' failures demote it, as before
    assert trio.run(check, False, 60.0, 20.0) == "private"
    # one dialled it during the check: the liars cannot demote it
    assert trio.run(check, True, 60.0, 20.0) == "public"
    # one dialled it before the check, none now: unsure until ALONE_S passes, then private
    monkeypatch.setattr(STATE, "dialled_in_at", 0.0)
    assert trio.run(check, False, 60.0, 3.0) is None
    assert trio.run(check, False, 1.0, 20.0) == "private"


INSIDE = "/ip4/198.19.1.2/tcp/4141"  # a home network numbered outside the LAN ranges
ROUTER = "/ip4/198.18.0.7/tcp/4141"  # the router's outside address, its port forwarded
LAN = "/ip4/192.168.1.20/tcp/4141"
PLACEHOLDER = "/ip4/<public IP>/tcp/<port>"


@pytest.mark.parametrize(
    ("verdict", "reason", "announced", "reached", "hint"),
    [
        # dialled back at the router's address, which it does not announce: that one
        ("public", "address", [INSIDE], [ROUTER], ROUTER),
        ("public", "address", [INSIDE, LAN], [ROUTER], ROUTER),
        # the address most servers reached
        ("public", "address", [INSIDE], [ROUTER, "/ip4/198.18.9.9/tcp/4141", ROUTER], ROUTER),
        # it announces the address they reached (a VPS, a UPnP mapping): nothing to say
        ("public", "address", [ROUTER], [ROUTER], None),
        ("public", "upnp", [ROUTER], [ROUTER], None),
        ("public", "address", [INSIDE, ROUTER], [ROUTER], None),
        # only LAN addresses announced, no dial-back address outside the LAN known: a
        # placeholder
        ("public", "nat", [LAN], [], PLACEHOLDER),
        ("public", "nat", [LAN], ["/ip4/10.0.0.1/tcp/1"], PLACEHOLDER),
        # an address outside the LAN announced, none reached known: no evidence against it
        ("public", "address", [INSIDE], [], None),
        # given --announce or net.reachability: the user chose; not public: no hint
        ("public", "announce", [INSIDE], [ROUTER], None),
        ("public", "config", [LAN], [], None),
        ("private", "address", [INSIDE], [], None),
        ("private", "autonat", [INSIDE], [ROUTER], None),
    ],
)
def test_a_public_verdict_hints_the_address_to_announce(
    verdict: str, reason: str, announced: list[str], reached: list[str], hint: str | None
) -> None:
    from sapo_node.net.reachability import announce_hint

    assert announce_hint(verdict, reason, announced, reached) == hint


def test_the_announce_hint_is_logged_once_per_verdict_not_per_recheck() -> None:
    """A node inside a NAT numbered outside the LAN ranges, its port forwarded: AutoNAT
    finds it public at every recheck, at the router's address; one warning names it."""
    from types import SimpleNamespace

    import multiaddr
    import structlog
    import trio

    from sapo_node.net.network import Network

    async def public() -> str:
        return "public"

    node = SimpleNamespace(
        host=SimpleNamespace(get_addrs=lambda: [multiaddr.Multiaddr(INSIDE)]),
        reason="address",
        reachability="public",
        autonat_verdict=None,
        autonat_answers={"198.18.0.1": 0},
        autonat_reached={"198.18.0.1": ROUTER},
        s={"autonat_recheck_s": 0.01},
        _ask_until_sure=public,
    )
    for name in ("_check_reachability", "_act_on"):
        setattr(node, name, getattr(Network, name).__get__(node))

    async def main() -> None:
        with trio.move_on_after(0.5):
            await node._check_reachability()

    with structlog.testing.capture_logs() as logs:
        trio.run(main)
    hints = [e for e in logs if e["log_level"] == "warning"]
    assert len(hints) == 1, logs
    assert hints[0]["announce"] == ROUTER and hints[0]["announced"] == [INSIDE]
    assert "--announce" in hints[0]["event"]
    assert [e for e in logs if e["log_level"] == "info"] == []
