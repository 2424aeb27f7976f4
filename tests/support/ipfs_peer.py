"""A peer that speaks only IPFS's names: a plain py-libp2p host running the library's
Kademlia DHT in server mode under its default protocol id (``/ipfs/kad/1.0.0``), with
no pubsub, and, with ``--mdns``, the library's mDNS under IPFS's service name
(``_p2p._udp.local.``). Imported before ``sapo_node.net.host`` ever is in this process,
so the DHT keeps the library's id. Tests run it as a subprocess:

    python -m tests.support.ipfs_peer [--dial MULTIADDR] [--hold S] [--watch S] [--until FILE]
                                      [--mdns]

It listens on 127.0.0.1 only and dials loopback only. With ``--dial`` it connects to that
peer, prints ``connected``, stays ``--hold`` s, closes the connection and prints
``disconnected``. Then for ``--watch`` s (or until the file ``--until`` exists, if
sooner) it prints ``dialled_by PEER_ID`` for each peer that opens a connection to it, and
``done``. It prints ``peer_id`` and ``addr`` first, each line flushed, so a test can
follow it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.kad_dht.common import PROTOCOL_ID
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service

LISTEN = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]


def say(*words: object) -> None:
    print(*words, flush=True)


async def main_async(args: argparse.Namespace) -> None:
    assert str(PROTOCOL_ID) == "/ipfs/kad/1.0.0", PROTOCOL_ID  # IPFS's, not the swarm's
    key = create_new_key_pair()
    noise = NoiseTransport(key, noise_privkey=create_new_x25519_key_pair().private_key)
    host = new_host(
        key_pair=key,
        sec_opt={NOISE_PROTOCOL_ID: noise},
        muxer_preference="YAMUX",
        listen_addrs=LISTEN,
        enable_mDNS=args.mdns,
    )
    dht = KadDHT(host, DHTMode.SERVER)
    async with host.run(listen_addrs=LISTEN), background_trio_service(dht):
        say("peer_id", host.get_id().pretty())
        say("addr", f"{host.get_addrs()[0]}")
        if args.dial:
            info = info_from_p2p_addr(multiaddr.Multiaddr(args.dial))
            await host.connect(info)
            say("connected")
            await trio.sleep(args.hold)
            await host.disconnect(info.peer_id)
            say("disconnected")
        seen = set(host.get_connected_peers())
        with trio.move_on_after(args.watch):
            while not (args.until and args.until.exists()):
                for peer in host.get_connected_peers():
                    if peer not in seen:
                        seen.add(peer)
                        say("dialled_by", peer.pretty())
                await trio.sleep(0.1)
        say("done")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.ipfs_peer")
    parser.add_argument("--dial", help="/ip4/127.0.0.1/tcp/PORT/p2p/PEER_ID")
    parser.add_argument("--hold", type=float, default=5.0, help="seconds connected")
    parser.add_argument("--watch", type=float, default=10.0, help="seconds to watch after")
    parser.add_argument("--until", type=Path, help="stop watching once this file exists")
    parser.add_argument("--mdns", action="store_true", help="announce and browse _p2p._udp")
    args = parser.parse_args(argv)
    if args.dial and not args.dial.startswith("/ip4/127."):
        parser.error("the IPFS peer dials 127.0.0.0/8 only")
    trio.run(main_async, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
