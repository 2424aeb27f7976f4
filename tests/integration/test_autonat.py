"""AutoNAT's server side for real (net/autonat.py, docs/libp2p.md#autonat-dial-back): a
node's network process on loopback answers dial-back requests from peers written
straight against py-libp2p (its own AutoNAT client), and an OK means a fresh connection
reached the asker, as itself.

The library's server answered OK to every asker (its dial-back returned on the open
connection): here an asker whose address nobody listens on, or where another peer
listens, hears E_DIAL_ERROR. The client side, a firewalled node that turns private, runs
through real NAT in test_nat.py.
"""

from __future__ import annotations

import socket
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import multiaddr
import pytest
import trio
from libp2p.host.autonat.autonat import AutoNATService
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.peerinfo import info_from_p2p_addr

from sapo_node.config import NetSection, PoolSection
from sapo_node.net.process import Libp2pTransport
from tests.support.rogue import make_host

OK, ERROR, REFUSED = int(Message.OK), int(Message.E_DIAL_ERROR), int(Message.E_DIAL_REFUSED)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def ask(
    server: str, offer: str | None = None, *, twice: bool = False, other_id: bool = False
):
    """A fresh peer connects to ``server`` and asks it to dial back ``offer`` (its own
    listen address when None); ``twice``: asks again at once (the answer to that, or the
    error). Returns the status (and the second outcome)."""
    host = make_host()
    service = AutoNATService(host, serve=False)
    info = info_from_p2p_addr(multiaddr.Multiaddr(server))
    async with host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        await host.connect(info)
        addr = offer or str(host.get_transport_addrs()[0])
        if other_id:  # the request names another peer (here: the server itself)
            service.host = SimpleNamespace(get_id=lambda: info.peer_id, new_stream=host.new_stream)
        status, _ = await service.query_server(
            info.peer_id, [multiaddr.Multiaddr(addr).to_bytes()], timeout=30
        )
        if not twice:
            return status
        try:
            again, _ = await service.query_server(
                info.peer_id, [multiaddr.Multiaddr(addr).to_bytes()], timeout=30
            )
        except Exception as exc:  # the stream reset: refused for its rate
            again = type(exc).__name__
        return status, again


async def ask_translated(server: str, port_of: str) -> int:
    """An asker listening on 127.0.0.1 and 127.0.0.2 (two ports) connects from 127.0.0.1
    and offers only its 127.0.0.2 address, as a node behind NAT offers its inside address,
    at the port it listens on at ``port_of`` (either IP)."""
    host = make_host()
    service = AutoNATService(host, serve=False)
    info = info_from_p2p_addr(multiaddr.Multiaddr(server))
    listen = [multiaddr.Multiaddr(f"/ip4/{ip}/tcp/0") for ip in ("127.0.0.1", "127.0.0.2")]
    async with host.run(listen_addrs=listen):
        await host.connect(info)
        ports = {
            a.value_for_protocol("ip4"): a.value_for_protocol("tcp")
            for a in host.get_transport_addrs()
        }
        offer = multiaddr.Multiaddr(f"/ip4/127.0.0.2/tcp/{ports[port_of]}")
        status, _ = await service.query_server(info.peer_id, [offer.to_bytes()], timeout=30)
        return status


async def ask_with_impostor(server: str) -> int:
    """The asker offers an address where another peer (another key) listens."""
    impostor = make_host()
    async with impostor.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        return await ask(server, str(impostor.get_transport_addrs()[0]))


@pytest.mark.timeout(120)
def test_a_public_node_dials_back_on_a_fresh_connection_and_only_as_asked() -> None:
    with tempfile.TemporaryDirectory(prefix="autonat-") as tmp:
        section = NetSection(
            swarm="autonat-test", listen=["/ip4/127.0.0.1/tcp/0"], mdns=False, redial_s=1.0
        )
        node = Libp2pTransport(section, PoolSection(), Path(tmp) / "node")
        try:
            server = (
                f"{node.addrs[0]}/p2p/{node.peer_id}"
                if "/p2p/" not in node.addrs[0]
                else node.addrs[0]
            )
            # its own address, listening: the dial-back proves it
            assert trio.run(ask, server) == OK
            # nobody listens there: the library's server said OK (the open connection)
            assert trio.run(ask, server, f"/ip4/127.0.0.1/tcp/{closed_port()}") == ERROR
            # another peer listens there: the handshake proves another ID
            assert trio.run(ask_with_impostor, server) == ERROR
            # an address on another IP than the asker's is never dialled (amplification):
            # its IP is, at the port offered, where nothing listens
            assert trio.run(ask_translated, server, "127.0.0.2") == ERROR
            # an asker behind NAT offers its inside address: the server dials the IP its
            # connection came from at that port (the library refused it: no verdict ever)
            assert trio.run(ask_translated, server, "127.0.0.1") == OK
            # a dial-back for another peer is refused
            assert trio.run(lambda: ask(server, other_id=True)) == REFUSED
            # a peer's second request within a minute is not served
            first, second = trio.run(lambda: ask(server, twice=True))
            assert first == OK and second != OK
            # counted in its stats (one report a second)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                served = node.child_stats.get("autonat_served") or {}
                if served.get("refused", 0) >= 2 and served.get("ok", 0) >= 3:
                    break
                time.sleep(0.2)
            assert served == {"ok": 3, "failed": 3, "refused": 2}, served
        finally:
            node.close()
