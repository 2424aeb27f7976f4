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
