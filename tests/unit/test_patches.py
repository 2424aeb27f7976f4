"""net/patches.py: py-libp2p's internals are patched in one place, and a library the
patches do not fit stops the network at start with one line (docs/libp2p.md#patches)."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import pytest

from sapo_node.net import patches


def test_every_module_holds_the_nodes_version_of_what_it_replaces() -> None:
    """No py-libp2p module, imported before the patches or after, still holds a library
    function they replace there (the relay's discovery module imported the signed-record
    builder too, and no list of modules named it)."""
    import libp2p

    import sapo_node.net.host  # noqa: F401  (what the network process imports)

    patches.apply()
    for info in pkgutil.walk_packages(libp2p.__path__, "libp2p."):
        try:
            importlib.import_module(info.name)
        except Exception:  # optional extras (a transport's dependency) need not import
            continue
    assert patches.still_holding() == []
    identify = sys.modules["libp2p.identity.identify_push.identify_push"]
    assert identify._mk_identify_protobuf.__qualname__.endswith("identify_for")


def test_a_module_that_still_holds_the_librarys_own_is_named_in_one_line(monkeypatch) -> None:
    """The network process asks once it is built: a module holding a replaced function by
    a name ``apply`` did not foresee is named in one warning line."""
    import structlog
    from libp2p.kad_dht import common

    import sapo_node.net.host  # noqa: F401  (what the network process imports)

    patches.apply()
    with structlog.testing.capture_logs() as logs:
        assert patches.warn_unless_holding() == []
    assert logs == []
    original = patches._original[("libp2p.kad_dht.common", "PROTOCOL_ID")]
    monkeypatch.setattr(common, "LIBRARY_ID", original, raising=False)  # a new holder
    with structlog.testing.capture_logs() as logs:
        assert patches.warn_unless_holding() == ["libp2p.kad_dht.common.PROTOCOL_ID"]
    (line,) = logs
    assert line["log_level"] == "warning" and "docs/libp2p.md#patches" in line["event"]
    assert line["still_the_librarys"] == ["libp2p.kad_dht.common.PROTOCOL_ID"]


def test_a_changed_library_stops_the_network_with_one_line(monkeypatch) -> None:
    from libp2p.pubsub.gossipsub import GossipSub

    monkeypatch.delattr(GossipSub, "handle_prune")  # as if an upgrade renamed it
    with pytest.raises(patches.PatchError) as failed:
        patches.apply()
    message = str(failed.value)
    assert "\n" not in message
    assert "handle_prune" in message and "libp2p.pubsub.gossipsub.GossipSub" in message
    assert "docs/libp2p.md#patches" in message


def test_a_missing_module_symbol_is_named(monkeypatch) -> None:
    monkeypatch.setattr(patches, "_original", {})  # not applied yet in this process
    from libp2p.peer import peerstore

    monkeypatch.delattr(peerstore, "env_to_send_in_RPC")
    with pytest.raises(patches.PatchError, match="env_to_send_in_RPC in libp2p.peer.peerstore"):
        patches.apply()


def test_another_library_version_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(patches, "installed_version", lambda: "0.9.0")
    with pytest.raises(patches.PatchError, match="py-libp2p 0.9.0 is installed.*0.8.1"):
        patches.apply()


def test_the_library_state_the_node_uses_is_checked_on_its_objects() -> None:
    from types import SimpleNamespace

    with pytest.raises(patches.PatchError, match="no graft_flood_tracking in GossipSub"):
        patches.check_state(SimpleNamespace(mesh={}), ("mesh", "graft_flood_tracking"), "GossipSub")


def test_the_network_process_sends_the_patch_error_as_its_fatal_one(monkeypatch) -> None:
    import trio

    from sapo_node.net import host, ipc

    def refuse() -> None:
        raise patches.PatchError("py-libp2p 0.9.0 is installed; ...")

    monkeypatch.setattr(patches, "apply", refuse)
    sent = []

    class Out:
        async def send(self, frame) -> None:
            sent.append(frame)

    class Commands:
        async def receive(self):
            return ["settings", {"listen": ["/ip4/127.0.0.1/tcp/0"]}]

    monkeypatch.setattr(ipc, "FrameReader", lambda stream: Commands())
    monkeypatch.setattr(ipc, "FrameWriter", lambda stream: Out())
    monkeypatch.setattr(trio.lowlevel, "FdStream", lambda fd: None)
    assert trio.run(host._main, 0, 1) == 1
    assert sent == [["fatal", "py-libp2p 0.9.0 is installed; ..."]]


def test_a_dht_clients_lookup_asks_the_network_not_only_its_own_record() -> None:
    """docs/libp2p.md#provider-lookups, with two real DHTs on loopback: a server holding
    another member's record, and a client holding its own. The library's lookup gives the
    client its own record alone; the node's asks the server, and finds the member."""
    import multiaddr
    import trio
    from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
    from libp2p.peer.peerinfo import PeerInfo
    from libp2p.tools.anyio_service import background_trio_service

    from tests.support.rogue import make_host

    key = "sapo-test-key"
    member = PeerInfo(make_host().get_id(), [multiaddr.Multiaddr("/ip4/198.18.7.7/tcp/4141")])

    async def lookups() -> tuple[set, set]:
        server_host, client_host = make_host(), make_host()
        listen = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
        async with server_host.run(listen_addrs=listen), client_host.run(listen_addrs=listen):
            server = KadDHT(server_host, DHTMode.SERVER)
            client = KadDHT(client_host, DHTMode.CLIENT)
            async with background_trio_service(server), background_trio_service(client):
                addrs = server_host.get_addrs()
                await client_host.connect(PeerInfo(server_host.get_id(), addrs))
                await client.routing_table.add_peer(
                    PeerInfo(server_host.get_id(), addrs), skip_server_mode_check=True
                )
                encoded = _encode(key)
                server.provider_store.add_provider(encoded, member)
                mine = PeerInfo(client_host.get_id(), client_host.get_addrs())
                client.provider_store.add_provider(encoded, mine)
                with trio.fail_after(20):
                    library = await client.find_providers(key, 20)
                    ours = await patches.find_providers(client, key, 20)
                return {p.peer_id for p in library}, {p.peer_id for p in ours}

    def _encode(text: str) -> bytes:
        from libp2p.kad_dht.kad_dht import _encode_key

        return _encode_key(text)

    library, ours = trio.run(lookups)
    assert member.peer_id not in library  # its own record answered, nobody asked
    assert member.peer_id in ours


def test_the_swarm_dials_nobody_of_its_own_accord() -> None:
    """docs/libp2p.md#connection-limits: py-libp2p's auto-connector dials every peer the
    peerstore has an address for while the node holds fewer than 200 connections, past
    net.max_peers and banned peers alike. Guarded, it dials nobody: discovery dials."""
    import multiaddr
    import trio
    from libp2p import new_host
    from libp2p.crypto.ed25519 import create_new_key_pair

    patches.apply()
    listen = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]

    async def main() -> None:
        node = new_host(
            key_pair=create_new_key_pair(), connection_config=patches.connection_config(300, 32)
        )
        patches.guard_swarm(node.get_network())
        known = new_host(key_pair=create_new_key_pair())
        async with node.run(listen_addrs=listen), known.run(listen_addrs=listen):
            node.get_peerstore().add_addrs(known.get_id(), known.get_addrs(), 3600)
            with trio.fail_after(30):
                await node.get_network().auto_connector.maybe_connect()
            assert node.get_network().get_connections() == []
            assert node.get_network()._inbound_limiter.total_tokens == 300 - 32

    trio.run(main)


@pytest.mark.parametrize("public", [True, False])
def test_a_peer_cannot_get_an_ipv4_mapped_address_admitted_or_handed_out(public: bool) -> None:
    """docs/security.md#addresses-that-embed-ipv4, with real DHTs on loopback: a peer whose
    identify lists ``/ip6/::ffff:127.0.0.1/...`` is not taken into the routing table (a
    peer listing a public address is), and its provider record keeps no mapped address,
    neither in this node's store nor in what a lookup of the key is handed: each would
    send whoever dials it to a port on its own machine."""
    import multiaddr
    import trio
    from libp2p.kad_dht.kad_dht import DHTMode, KadDHT, _encode_key
    from libp2p.peer.peerinfo import PeerInfo
    from libp2p.tools.anyio_service import background_trio_service

    from sapo_node.net.discovery import SwarmDHT
    from tests.support.rogue import make_host

    patches.apply()
    listen = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
    mapped, elsewhere = "/ip6/::ffff:127.0.0.1/tcp/4141", "/ip4/198.18.0.9/tcp/4141"
    key = "sapo-test-key"
    lying_identify = _lying_identify

    async def main() -> tuple[bool, bool, bool, list[str], list[str]]:
        node_host, rogue_host, honest_host, asker_host = (make_host() for _ in range(4))
        lying_identify(rogue_host, [mapped])
        lying_identify(honest_host, [elsewhere])
        rogue_host.get_addrs = lambda: [multiaddr.Multiaddr(a) for a in (mapped, elsewhere)]
        async with (
            node_host.run(listen_addrs=listen),
            rogue_host.run(listen_addrs=listen),
            honest_host.run(listen_addrs=listen),
            asker_host.run(listen_addrs=listen),
        ):
            node = SwarmDHT(node_host, DHTMode.SERVER, public=public)
            rogue = KadDHT(rogue_host, DHTMode.SERVER)
            honest = KadDHT(honest_host, DHTMode.SERVER)
            asker = KadDHT(asker_host, DHTMode.CLIENT)
            async with (
                background_trio_service(node),
                background_trio_service(rogue),
                background_trio_service(honest),
                background_trio_service(asker),
            ):
                at = PeerInfo(node_host.get_id(), node_host.get_addrs())
                store = node_host.get_peerstore()
                with trio.fail_after(20):
                    for peer in (rogue_host, honest_host, asker_host):
                        await peer.connect(at)
                    for peer in (rogue_host, honest_host):  # identify has told the node
                        while patches.DHT_PROTOCOL not in (store.get_protocols(peer.get_id())):
                            await trio.sleep(0.05)
                    rogue_in = await node.routing_table.add_peer(rogue_host.get_id())
                    honest_in = await node.routing_table.add_peer(honest_host.get_id())
                    sent = await rogue.provider_store._send_add_provider(
                        node_host.get_id(), _encode_key(key)
                    )
                    while not node.provider_store.get_providers(_encode_key(key)):
                        await trio.sleep(0.05)
                    kept = node.provider_store.get_providers(_encode_key(key))
                    await asker.routing_table.add_peer(at, skip_server_mode_check=True)
                    found = await asker.find_providers(key, 20)
                return (
                    rogue_in,
                    honest_in,
                    sent,
                    [str(a) for p in kept for a in p.addrs],
                    [str(a) for p in found if p.peer_id == rogue_host.get_id() for a in p.addrs],
                )

    rogue_in, honest_in, sent, kept, found = trio.run(main)
    assert sent
    assert not rogue_in  # its only address is a mapped one: no node admits it
    assert honest_in  # one with an address elsewhere is admitted
    assert kept == [elsewhere]  # its mapped address was dropped, its public one kept
    assert found == [elsewhere]  # and a lookup is handed no mapped address


def _lying_identify(host, addrs: list[str]) -> None:
    """``host`` answers identify listing ``addrs``, as any peer may write them."""
    import multiaddr
    from libp2p.identity.identify.identify import ID as IDENTIFY
    from libp2p.identity.identify.pb.identify_pb2 import Identify
    from libp2p.utils import varint

    async def handle(stream) -> None:
        message = Identify(
            protocol_version="ipfs/0.1.0",
            agent_version="rogue",
            public_key=host.get_public_key().serialize(),
            listen_addrs=[multiaddr.Multiaddr(a).to_bytes() for a in addrs],
            protocols=[str(p) for p in host.get_mux().get_protocols() if p is not None],
        )
        data = message.SerializeToString()
        await stream.write(varint.encode_uvarint(len(data)) + data)
        await stream.close()

    host.set_stream_handler(IDENTIFY, handle)


# A hostile peer's identify: beside a public address, ports of its choosing on the LAN
# and the machine of whoever dials it, and a name that resolves to loopback.
PUBLIC = "/ip4/198.18.0.9/tcp/4141"
HOSTILE = [
    PUBLIC,
    "/ip4/192.168.1.1/tcp/80",
    "/ip4/127.0.0.1/tcp/22",
    "/ip4/10.0.0.1/tcp/8080",
    "/dns4/localhost/tcp/22",
]


def test_the_peerstore_keeps_of_a_strangers_word_no_address_leading_into_the_lan() -> None:
    """docs/libp2p.md#addresses-from-strangers: whichever way others give a peer's
    addresses (add_addrs: a DHT answer, a punch, a provider; add_addr: identify; a signed
    peer record), the peerstore keeps the public one only, unless the node is local or the
    peer on its LAN; the user's addresses (bootstrap) go in whole; and no signed record
    that lists a LAN address is handed on, unless the node is local."""
    import multiaddr
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.envelope import seal_record
    from libp2p.peer.id import ID
    from libp2p.peer.peer_record import PeerRecord
    from libp2p.peer.peerstore import PeerStore

    def peer():
        key = create_new_key_pair()
        return key, ID.from_pubkey(key.public_key)

    def held(peer_id) -> set[str]:
        return {str(a) for a in store.addrs(peer_id)}

    ma = [multiaddr.Multiaddr(a) for a in HOSTILE]
    store, local, lan = PeerStore(), [False], set()
    add_given = patches.guard_peerstore(store, lambda: local[0], lambda p: p in lan)
    (_, stranger), (lan_key, neighbour), (_, bootstrap) = peer(), peer(), peer()
    lan.add(neighbour)
    store.add_addrs(stranger, ma, 3600)
    store.add_addr(stranger, ma[1], 3600)
    assert held(stranger) == {PUBLIC}
    store.add_addrs(neighbour, ma[:2], 3600)
    assert held(neighbour) == set(HOSTILE[:2])  # a peer on its LAN keeps its LAN address
    add_given(bootstrap, [multiaddr.Multiaddr("/ip4/192.168.1.7/tcp/4141")], 3600)
    assert held(bootstrap) == {"/ip4/192.168.1.7/tcp/4141"}

    stranger_key, stranger = peer()
    record = seal_record(PeerRecord(stranger, ma), stranger_key.private_key)
    assert store.consume_peer_record(record, 7200)
    assert held(stranger) == {PUBLIC}
    assert store.get_peer_record(stranger) is None  # it lists a LAN address: not handed on
    lan_record = seal_record(PeerRecord(neighbour, ma[:2]), lan_key.private_key)
    assert store.consume_peer_record(lan_record, 7200)
    assert store.get_peer_record(neighbour) is None  # nor a LAN peer's: it cannot be cut
    clean_key, clean = peer()
    assert store.consume_peer_record(
        seal_record(PeerRecord(clean, ma[:1]), clean_key.private_key), 7200
    )
    assert store.get_peer_record(clean) is not None

    local[0] = True  # a local node: all it reaches is on this machine
    store.add_addrs(stranger, ma, 3600)
    assert held(stranger) == set(HOSTILE)
    assert store.get_peer_record(neighbour) is lan_record


def test_a_dht_lookup_dials_no_loopback_port_a_stranger_named() -> None:
    """docs/libp2p.md#addresses-from-strangers, with real DHTs on loopback: a rogue DHT
    server answers a lookup with a peer at 127.0.0.1 and a port of its choosing (a trap
    listening there). The library's lookup dials each peer it is handed (through the
    peerstore); the node's peerstore keeps no such address of a peer not on its LAN, so
    nothing connects to the trap. (The rogue is connected from 127.0.0.1, on the node's
    machine, and could name its own loopback ports; the peer it names is not.)"""
    import functools

    import multiaddr
    import trio
    from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
    from libp2p.peer.peerinfo import PeerInfo
    from libp2p.tools.anyio_service import background_trio_service

    from sapo_node.net.discovery import SwarmDHT
    from tests.support.rogue import make_host

    patches.apply()
    listen = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]

    async def main() -> tuple[int, list[str]]:
        trapped = 0

        async def trap(stream) -> None:
            nonlocal trapped
            trapped += 1
            await stream.aclose()

        victim_host, rogue_host, phantom = make_host(), make_host(), make_host().get_id()
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                functools.partial(trio.serve_tcp, trap, 0, host="127.0.0.1")
            )
            port = listeners[0].socket.getsockname()[1]
            bait = multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{port}")
            patches.guard_swarm(victim_host.get_network())  # as the node's: discovery dials
            async with victim_host.run(listen_addrs=listen), rogue_host.run(listen_addrs=listen):
                store = victim_host.get_peerstore()
                # as the network does: a node that is not local, the real on_lan
                add_given = patches.guard_peerstore(
                    store,
                    lambda: False,
                    lambda p: patches.on_lan(victim_host.get_network(), p),
                )
                add_given(rogue_host.get_id(), rogue_host.get_addrs(), 3600)  # bootstrap
                victim = SwarmDHT(victim_host, DHTMode.CLIENT, public=False)
                rogue = KadDHT(rogue_host, DHTMode.SERVER)
                library_answer = rogue._add_closer_peers_to_response

                def lying_answer(response, closest_peers, exclude_peer_id=None) -> None:
                    library_answer(response, closest_peers, exclude_peer_id)
                    peer = response.closerPeers.add()  # a peer it never met, at the bait
                    peer.id, peer.addrs[:] = phantom.to_bytes(), [bait.to_bytes()]

                rogue._add_closer_peers_to_response = lying_answer
                async with background_trio_service(victim), background_trio_service(rogue):
                    with trio.fail_after(20):
                        await victim_host.connect(
                            PeerInfo(rogue_host.get_id(), rogue_host.get_addrs())
                        )
                        while patches.DHT_PROTOCOL not in store.get_protocols(rogue_host.get_id()):
                            await trio.sleep(0.05)
                        assert await victim.routing_table.add_peer(rogue_host.get_id())
                    with trio.move_on_after(15):
                        await victim.peer_routing.find_closest_peers_network(phantom.to_bytes())
                    await trio.sleep(0.5)  # a dial under way lands
                    held = (
                        [str(a) for a in store.addrs(phantom)]
                        if phantom in store.peer_ids()
                        else []
                    )
            nursery.cancel_scope.cancel()
        return trapped, held

    trapped, held = trio.run(main)
    assert trapped == 0
    assert held == []


def test_a_public_node_hands_a_stranger_no_lan_address_of_another_peer(monkeypatch) -> None:
    """docs/libp2p.md#addresses-from-strangers, with real DHTs on loopback, where every
    connection comes from 127.0.0.1: which peers count as on the node's LAN is given
    (``on_lan``). A public node holds a hostile peer's public address only, and a peer on
    its LAN with its LAN address; a stranger asking it (FIND_NODE, GET_PROVIDERS, as the
    library answers from its peerstore) is handed no LAN address and no signed record
    listing one, while a peer on its LAN is handed its neighbour's LAN address."""
    import multiaddr
    import trio
    from libp2p.kad_dht.kad_dht import DHTMode, KadDHT, _encode_key
    from libp2p.peer.peerinfo import PeerInfo
    from libp2p.tools.anyio_service import background_trio_service

    from sapo_node import addresses
    from sapo_node.net.discovery import SwarmDHT
    from sapo_node.net.state import STATE
    from tests.support.rogue import make_host

    patches.apply()
    monkeypatch.setattr(STATE, "reachability", "public")  # the peers sign what they list
    listen = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
    key = _encode_key("sapo-test-key")
    neighbour_addrs = ["/ip4/198.18.0.10/tcp/4141", "/ip4/192.168.1.20/tcp/4141"]

    def held(host, peer) -> set[str]:
        return {str(a) for a in host.get_peerstore().addrs(peer.get_id())}

    async def main() -> dict[str, set[str]]:
        node_host, rogue_host, neighbour_host, stranger_host, lan_host = (
            make_host() for _ in range(5)
        )
        lan = {neighbour_host.get_id(), lan_host.get_id()}
        _lying_identify(rogue_host, HOSTILE)
        _lying_identify(neighbour_host, neighbour_addrs)
        rogue_host.get_addrs = lambda: [multiaddr.Multiaddr(a) for a in HOSTILE]
        neighbour_host.get_addrs = lambda: [multiaddr.Multiaddr(a) for a in neighbour_addrs]
        async with (
            node_host.run(listen_addrs=listen),
            rogue_host.run(listen_addrs=listen),
            neighbour_host.run(listen_addrs=listen),
            stranger_host.run(listen_addrs=listen),
            lan_host.run(listen_addrs=listen),
        ):
            patches.guard_peerstore(node_host.get_peerstore(), lambda: False, lan.__contains__)
            node = SwarmDHT(node_host, DHTMode.SERVER, public=True, on_lan=lan.__contains__)
            rogue = KadDHT(rogue_host, DHTMode.SERVER)
            neighbour = KadDHT(neighbour_host, DHTMode.SERVER)
            stranger = KadDHT(stranger_host, DHTMode.CLIENT)
            lan_asker = KadDHT(lan_host, DHTMode.CLIENT)
            async with (
                background_trio_service(node),
                background_trio_service(rogue),
                background_trio_service(neighbour),
                background_trio_service(stranger),
                background_trio_service(lan_asker),
            ):
                at = PeerInfo(node_host.get_id(), node_host.get_addrs())
                store = node_host.get_peerstore()
                with trio.fail_after(30):
                    for peer in (rogue_host, neighbour_host, stranger_host, lan_host):
                        await peer.connect(at)
                    for peer in (rogue_host, neighbour_host):  # identify has told the node
                        while patches.DHT_PROTOCOL not in store.get_protocols(peer.get_id()):
                            await trio.sleep(0.05)
                    assert await node.routing_table.add_peer(rogue_host.get_id())
                    assert await node.routing_table.add_peer(neighbour_host.get_id())
                    # each provides, sending the node its signed record (LAN addresses too)
                    assert await rogue.provider_store._send_add_provider(node_host.get_id(), key)
                    assert await neighbour.provider_store._send_add_provider(
                        node_host.get_id(), key
                    )
                    for asker in (stranger, lan_asker):
                        for target in (rogue_host, neighbour_host):
                            await asker.peer_routing._query_peer_for_closest(
                                node_host.get_id(), target.get_id().to_bytes()
                            )
                        await asker.provider_store._get_providers_from_peer_with_closers(
                            node_host.get_id(), key
                        )
                return {
                    "node rogue": held(node_host, rogue_host),
                    "node neighbour": held(node_host, neighbour_host),
                    "stranger rogue": held(stranger_host, rogue_host),
                    "stranger neighbour": held(stranger_host, neighbour_host),
                    "lan neighbour": held(lan_host, neighbour_host),
                }

    got = trio.run(main)
    assert got["node rogue"] == {PUBLIC}  # the node keeps nothing else of it
    assert got["node neighbour"] == set(neighbour_addrs)  # a peer on its LAN keeps its own
    assert got["stranger rogue"] == {PUBLIC}
    assert got["stranger neighbour"] == {neighbour_addrs[0]}
    assert "/ip4/192.168.1.20/tcp/4141" in got["lan neighbour"]
    assert all(
        addresses.leads_outside(a) for a in got["stranger rogue"] | got["stranger neighbour"]
    )


def test_a_hole_punch_dials_no_lan_address_a_peer_elsewhere_sends(monkeypatch) -> None:
    """docs/libp2p.md#addresses-from-strangers: a punch dials the addresses the peer's
    CONNECT lists; of a peer not on this node's LAN, only those leading outside."""
    import multiaddr
    import trio
    from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol

    from sapo_node.net.reachability import SwarmDCUtR
    from tests.support.rogue import make_host

    dialled: list[list[str]] = []

    async def library_punch(self, peer_id, addrs, as_responder=False) -> bool:
        dialled.append([str(a) for a in addrs])
        return False

    monkeypatch.setattr(DCUtRProtocol, "_perform_hole_punch", library_punch)
    sent = [multiaddr.Multiaddr(a) for a in HOSTILE]

    for trusted, want in ((False, [PUBLIC]), (True, HOSTILE)):
        dcutr = SwarmDCUtR(make_host(), trusts=lambda peer, t=trusted: t)
        trio.run(dcutr._perform_hole_punch, make_host().get_id(), sent)
        assert dialled.pop() == want


def test_doctests() -> None:
    import doctest

    assert doctest.testmod(patches).failed == 0


def test_an_address_share_of_slots_is_a_setting_the_network_bounds_its_ips_by() -> None:
    from sapo_node.config import NetSection

    net = NetSection(max_inbound_per_ip=4, max_inbound_per_net=4)
    assert (net.max_inbound_per_ip, net.max_inbound_per_net) == (4, 4)
    with pytest.raises(ValueError, match="max_inbound_per_net \\(2\\) is less than"):
        NetSection(max_inbound_per_ip=4, max_inbound_per_net=2)
    with pytest.raises(ValueError):
        NetSection(max_inbound_per_ip=0)


def test_a_peer_that_gives_nothing_makes_room_from_the_network_holding_most() -> None:
    """patches.least_giving: a mapped address counts in its IPv4 /24, so a crowd seen
    through a dual-stack listener is one network, not one per address form."""
    from sapo_node import addresses

    def at(ip: str, since: float, peer: str) -> patches.Accepted:
        where = str(addresses.judged(ip))
        return patches.Accepted(where, addresses.network_of(where), since, peer, object())

    held = [
        at("198.18.5.1", 0.0, "lone"),
        at("::ffff:198.18.7.1", 10.0, "crowd-a"),
        at("198.18.7.2", 5.0, "crowd-b"),
    ]
    assert patches.least_giving(held, 100.0, lambda p: False, 60.0).peer == "crowd-b"
    assert patches.least_giving(held, 100.0, lambda p: p.startswith("crowd"), 60.0).peer == "lone"
    assert patches.least_giving(held, 100.0, lambda p: True, 60.0) is None
    held[2].pruned = True  # being closed for another newcomer already
    assert patches.least_giving(held, 100.0, lambda p: False, 60.0).peer == "crowd-a"
    newcomer = patches.Accepted("198.18.7.9", "198.18.7.0/24", 100.0)
    assert patches.over_cap(held, newcomer, per_ip=1, per_net=2)
    assert not patches.over_cap(held, newcomer, per_ip=1, per_net=3)


def test_a_peer_holding_a_reservation_on_this_relay_is_not_pruned_for_a_newcomer() -> None:
    """A private node that holds a reservation on this node's relay is reached through it,
    though it is in no mesh and delivers nothing: a newcomer takes another's slot, and the
    holder's only once it is gone, expired or the relay stopped relaying. It keeps one
    connection, its oldest (a second is closed as any other), and still counts in its
    address's share of the slots."""
    from libp2p import new_host
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID
    from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
    from libp2p.relay.circuit_v2.resources import RelayLimits

    from sapo_node import addresses
    from sapo_node.net.reachability import holds_reservation

    host = new_host(key_pair=create_new_key_pair())
    limits = RelayLimits(duration=60, data=2**20, max_circuit_conns=1, max_reservations=1)
    circuit = CircuitV2Protocol(host, limits=limits, allow_hop=True)
    holder, other = (ID.from_pubkey(create_new_key_pair().public_key) for _ in range(2))
    connections = host.get_network().connections
    connections[holder] = connections[other] = [object()]  # both connected
    circuit.resource_manager.reserve(holder)
    assert not circuit.resource_manager.can_accept_reservation(other)  # the relay's bound

    def at(ip: str, since: float, peer: object) -> patches.Accepted:
        return patches.Accepted(ip, addresses.network_of(ip), since, peer, object())

    def pruned(held: list[patches.Accepted]) -> patches.Accepted | None:
        reserved = lambda peer: holds_reservation(circuit, peer)  # noqa: E731
        return patches.least_giving(held, 100.0, lambda p: False, 60.0, reserved)

    # the holder is the oldest of the /24 holding most: the first to go, were it idle
    held = [at("198.18.7.1", 0.0, holder), at("198.18.7.2", 5.0, other)]
    assert pruned(held) is held[1]
    held[1].pruned = True  # gone for a newcomer already: none left to close
    assert pruned(held) is None
    held.append(at("198.18.7.1", 7.0, holder))  # the holder's second connection
    assert pruned(held) is held[2]
    # it holds its slots in its IP's and its /24's share all the same
    newcomer = patches.Accepted("198.18.7.1", "198.18.7.0/24", 100.0)
    assert patches.over_cap(held[:1], newcomer, per_ip=1, per_net=8)
    assert patches.over_cap(held[:1], newcomer, per_ip=8, per_net=1)

    held = held[:2]
    circuit.allow_hop = False  # the node turned private: it relays for nobody
    assert pruned(held) is held[0]
    circuit.allow_hop = True
    del connections[holder]  # it left: the library's reservation lives while it is connected
    assert pruned(held) is held[0]
    connections[holder] = [object()]
    assert pruned(held) is None
    circuit.resource_manager.get_reservation(holder).expires_at = 0  # expired, not renewed
    assert pruned(held) is held[0]
