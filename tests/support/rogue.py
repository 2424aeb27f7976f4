"""A hostile swarm peer, written straight against py-libp2p (not ``sapo_node.net.host``,
which would refuse to send what this sends). Tests run it as a subprocess:

    python -m tests.support.rogue garbage BOOTSTRAP_MULTIADDR TOPIC
    python -m tests.support.rogue invalid BOOTSTRAP_MULTIADDR TOPIC [--count N]
        [--valid M] [--interval S] [--pause S] [--linger S] [--dial MULTIADDR ...]
        [--vector NAME ...] [--protocol ID] [--topics T1,T2 ...] [--dht]
    python -m tests.support.rogue persist BOOTSTRAP_MULTIADDR TOPIC --key-dir DIR
        [--dial MULTIADDR ...] [--interval S]
    python -m tests.support.rogue crowd BOOTSTRAP_MULTIADDR TOPIC [--count N]
        [--linger S] [--then M]
    python -m tests.support.rogue reserve BOOTSTRAP_MULTIADDR TOPIC [--linger S]
    python -m tests.support.rogue bait BOOTSTRAP_MULTIADDR TOPIC [--linger S]

- ``garbage``: opens pubsub streams to the peer and writes one frame that is not a
  protobuf RPC (``b"\\xff" * 64``), then, on a fresh stream, one that is a well-formed RPC
  full of nonsense (a message with a junk author, key and signature, a GRAFT for an
  unknown topic); then exits.
- ``invalid``: runs Pubsub + GossipSub with strict signing, subscribes to TOPIC, waits
  for the peer (and each ``--dial`` one) in its mesh, then publishes N signed messages
  whose data are invalid wire messages (``protocol/vectors/invalid/*.msgpack``, then
  ``b"not msgpack"``; only the ``--vector`` ones if given, by name without
  ``.msgpack``), one every ``--interval`` s, waits ``--pause`` s, sends M valid ones (the
  small ``protocol/vectors/valid/*.msgpack``), then stays connected ``--linger`` s (a
  peer's score is forgotten when it disconnects). It relays, unchecked, what its mesh
  peers send: with ``--count 0 --valid 0`` it stands for a node of another version.
  Each message goes on TOPIC, or on the comma-separated topic list of each
  ``--topics`` in turn (the author signs the list: ``TOPIC,TOPIC`` repeats one).
  It speaks ``/meshsub/1.1.0`` unless ``--protocol`` names another (``/meshsub/1.2.0``:
  its peers then send it an IDONTWANT for every message, as to one of their own).
  With ``--dht`` it also serves py-libp2p's Kademlia DHT under the library's protocol id
  (IPFS's ``/ipfs/kad/1.0.0``), as sapo-node 0.3 did.
  It prints ``received AUTHOR SIZE`` for each message of another author that reaches it:
  on the swarm's single topic, it stands for a node of the version before shards.
- ``persist`` (``scripts/soak.py --rogue-peer``): the same peer, under the identity kept
  in ``--key-dir`` (created there the first time, as a node's), so that it comes back
  as itself after a restart. It dials every peer, and again every few seconds those it
  is not connected to, publishes an invalid message every ``--interval`` s until it is
  killed, and every few seconds prints one JSON line: ``connected`` (peers with a
  connection), ``streams`` (peers with a pubsub stream: the ones that take its
  messages), ``sent`` (messages published so far).
- ``crowd``: N peers, each of its own identity, dial the peer at once (once each) and
  hold what they got for ``--linger`` s; ``wave1 K`` says how many of them the peer
  still holds then. They leave, and M others dial it, each again every half second
  until it holds them or 10 s have passed: ``wave2 K``. It uses no pubsub (TOPIC is
  not used): connections alone, as a stranger with many identities would hold them.
  With ``--source IP`` (a loopback address) its connections leave from that address,
  not 127.0.0.1: several crowds stand for several hosts.
- ``reserve``: one peer dials the peer and reserves a slot on its relay (circuit relay
  v2, HOP RESERVE), as a private node does: ``reserved 1`` (0: refused). Then it says
  nothing more on that connection and holds it ``--linger`` s: ``held 1``; or ``held 0``
  and it exits as soon as the peer closes it. ``--source`` as for ``crowd``.
- ``bait``: one peer dials the peer and sends it, on a pubsub stream, a PRUNE for TOPIC
  whose peer exchange names a peer it never met, in a signed record whose only address
  is a port of the rogue's own on 127.0.0.1 (``bait PORT``), as a stranger would name
  one on the victim's LAN or machine. It counts what connects there for ``--linger`` s
  (``trapped N``): the peer exchange's dial, or a later one.

It listens on 127.0.0.1 only, dials loopback or 198.18.0.0/15 (the soak's network
namespaces) only, and prints one line per thing it does (``peer_id``, ``addr``,
``connected``, ``mesh``, ``sent ...``, ``done``), flushed, so a test can follow it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import ipaddress
import json
import sys
import time
from pathlib import Path

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.peer.envelope import seal_record
from libp2p.peer.id import ID
from libp2p.peer.peer_record import PeerRecord
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
from libp2p.relay.circuit_v2.pb.circuit_pb2 import PeerId as CircuitPeerId
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.relay.circuit_v2.utils import read_delimited_msg, write_delimited_msg
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service
from libp2p.utils.varint import encode_varint_prefixed

from sapo_node.net import identity

VECTORS = Path(__file__).resolve().parents[2] / "protocol" / "vectors"
LISTEN = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
PROTOCOL = "/meshsub/1.1.0"
DIAL_RANGES = [ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("198.18.0.0/15")]
REDIAL_S = 5.0  # persist: how often peers it is not connected to are dialled again
STATUS_S = 5.0  # persist: how often it prints its status line


def say(*words: object) -> None:
    print(*words, flush=True)


def make_host(key: KeyPair | None = None):
    key = key or create_new_key_pair()
    noise = NoiseTransport(key, noise_privkey=create_new_x25519_key_pair().private_key)
    host = new_host(
        key_pair=key,
        sec_opt={NOISE_PROTOCOL_ID: noise},
        muxer_preference="YAMUX",
        listen_addrs=LISTEN,
    )
    return host


def invalid_kinds(names: list[str] | None = None) -> list[bytes]:
    """One payload of each invalid kind: the named vectors, or all of them and junk."""
    if names:
        return [(VECTORS / "invalid" / f"{name}.msgpack").read_bytes() for name in names]
    files = sorted((VECTORS / "invalid").glob("*.msgpack"))
    return [f.read_bytes() for f in files] + [b"not msgpack"]


def invalid_payloads(count: int, names: list[str] | None = None) -> list[bytes]:
    payloads = invalid_kinds(names)
    return [payloads[i % len(payloads)] for i in range(count)]


def valid_payloads(count: int) -> list[bytes]:
    small = [f for f in sorted((VECTORS / "valid").glob("*.msgpack")) if f.stat().st_size < 4096]
    return [small[i % len(small)].read_bytes() for i in range(count)]


def nonsense_rpc(topic: str) -> bytes:
    """A well-formed RPC that makes no sense: a message whose author, key and signature
    are junk, and a GRAFT for a topic nobody has."""
    junk = rpc_pb2.Message(
        from_id=b"\x00\x01junk",
        data=b"\xc1" * 10,
        seqno=b"\xff" * 3,
        topicIDs=[topic],
        signature=b"\x00" * 7,
        key=b"\x08\x63junk",
    )
    control = rpc_pb2.ControlMessage(graft=[rpc_pb2.ControlGraft(topicID="no/such/topic")])
    return rpc_pb2.RPC(publish=[junk], control=control).SerializeToString()


async def garbage(bootstrap: str, topic: str) -> None:
    host = make_host()
    info = info_from_p2p_addr(multiaddr.Multiaddr(bootstrap))
    async with host.run(listen_addrs=LISTEN):
        say("peer_id", host.get_id().pretty())
        await host.connect(info)
        say("connected")
        stream = await host.new_stream(info.peer_id, [PROTOCOL])
        await stream.write(encode_varint_prefixed(b"\xff" * 64))
        say("sent garbage frame")
        await trio.sleep(0.5)
        stream = await host.new_stream(info.peer_id, [PROTOCOL])
        await stream.write(encode_varint_prefixed(nonsense_rpc(topic)))
        say("sent nonsense frame")
        await trio.sleep(0.5)
    say("done")


def make_gossipsub(protocol: str) -> GossipSub:
    return GossipSub(
        protocols=[protocol],
        degree=6,
        degree_low=4,
        degree_high=12,
        heartbeat_interval=1,
        heartbeat_initial_delay=0.1,
        adaptive_gossip_enabled=False,
        spam_protection_enabled=False,
    )


async def invalid(bootstrap: str, topic: str, args: argparse.Namespace) -> None:
    host = make_host()
    gossipsub = make_gossipsub(args.protocol)
    pubsub = Pubsub(host, gossipsub, strict_signing=True)
    infos = [info_from_p2p_addr(multiaddr.Multiaddr(a)) for a in [bootstrap, *args.dial]]
    async with (
        background_trio_service(pubsub),
        background_trio_service(gossipsub),
        contextlib.AsyncExitStack() as stack,
    ):
        if args.dht:
            await stack.enter_async_context(background_trio_service(KadDHT(host, DHTMode.SERVER)))
        await pubsub.wait_until_ready()
        subscription = await pubsub.subscribe(topic)
        async with host.run(listen_addrs=LISTEN), trio.open_nursery() as nursery:
            nursery.start_soon(report_received, subscription, host.get_id())
            say("peer_id", host.get_id().pretty())
            say("addr", host.get_addrs()[0])
            for info in infos:
                await host.connect(info)
            say("connected")
            with trio.fail_after(60):
                while any(i.peer_id not in gossipsub.mesh.get(topic, set()) for i in infos):
                    await trio.sleep(0.1)
            say("mesh")
            lists = [t.split(",") for t in args.topics] or [[topic]]
            for i, data in enumerate(invalid_payloads(args.count, args.vector)):
                await pubsub.publish(lists[i % len(lists)], data)
                say("sent invalid", i, len(data))
                await trio.sleep(args.interval)
            await trio.sleep(args.pause)
            for i, data in enumerate(valid_payloads(args.valid)):
                await pubsub.publish(lists[i % len(lists)], data)
                say("sent valid", i, len(data))
                await trio.sleep(args.interval)
            say("done")
            await trio.sleep(args.linger)
            nursery.cancel_scope.cancel()


async def report_received(subscription, me) -> None:
    while True:
        msg = await subscription.get()
        if msg.from_id != me.to_bytes():
            say("received", ID(msg.from_id).pretty(), len(msg.data))


async def persist(bootstrap: str, topic: str, args: argparse.Namespace) -> None:
    host = make_host(identity.load_or_create(args.key_dir))
    gossipsub = make_gossipsub(args.protocol)
    pubsub = Pubsub(host, gossipsub, strict_signing=True)
    infos = [info_from_p2p_addr(multiaddr.Multiaddr(a)) for a in [bootstrap, *args.dial]]
    payloads = invalid_kinds()

    async def dial() -> None:
        while True:
            for info in infos:
                if info.peer_id not in host.get_connected_peers():
                    with trio.move_on_after(REDIAL_S), contextlib.suppress(Exception):
                        await host.connect(info)
            await trio.sleep(REDIAL_S)

    async with background_trio_service(pubsub), background_trio_service(gossipsub):
        await pubsub.wait_until_ready()
        await pubsub.subscribe(topic)
        async with host.run(listen_addrs=LISTEN), trio.open_nursery() as nursery:
            say("peer_id", host.get_id().pretty())
            nursery.start_soon(dial)
            sent, status_at = 0, 0.0
            while True:
                with contextlib.suppress(Exception):
                    await pubsub.publish(topic, payloads[sent % len(payloads)])
                    sent += 1
                if time.monotonic() >= status_at:
                    status_at = time.monotonic() + STATUS_S
                    status = {
                        "time": time.time(),
                        "connected": sorted(p.pretty() for p in host.get_connected_peers()),
                        "streams": sorted(p.pretty() for p in pubsub.peers),
                        "sent": sent,
                    }
                    say(json.dumps(status))
                await trio.sleep(args.interval)


async def crowd(bootstrap: str, args: argparse.Namespace) -> None:
    info = info_from_p2p_addr(multiaddr.Multiaddr(bootstrap))
    if args.source:  # the library's dials take no source address: trio's do
        trio.open_tcp_stream = functools.partial(trio.open_tcp_stream, local_address=args.source)

    def held(host) -> bool:
        return bool(host.get_network().get_connections(info.peer_id))

    async def dial(host, retry_s: float) -> None:
        deadline = trio.current_time() + retry_s
        while True:
            with contextlib.suppress(Exception), trio.fail_after(10):
                await host.connect(info)
            await trio.sleep(0.5)  # one the peer refuses once it is up closes by then
            if held(host) or trio.current_time() > deadline:
                return

    async def wave(count: int, retry_s: float, linger: float) -> int:
        hosts = [make_host() for _ in range(count)]
        async with contextlib.AsyncExitStack() as stack:
            for host in hosts:
                await stack.enter_async_context(host.run(listen_addrs=LISTEN))
            async with trio.open_nursery() as nursery:
                for host in hosts:
                    nursery.start_soon(dial, host, retry_s)
            await trio.sleep(linger)
            kept = sum(map(held, hosts))
            for host in hosts:
                with contextlib.suppress(Exception):
                    await host.disconnect(info.peer_id)
        return kept

    say("wave1", await wave(args.count, 0.0, args.linger))
    if args.then:
        say("wave2", await wave(args.then, 10.0, 0.5))
    say("done")


async def reserve(bootstrap: str, args: argparse.Namespace) -> None:
    info = info_from_p2p_addr(multiaddr.Multiaddr(bootstrap))
    if args.source:  # as crowd's
        trio.open_tcp_stream = functools.partial(trio.open_tcp_stream, local_address=args.source)
    host = make_host()
    async with host.run(listen_addrs=LISTEN):
        say("peer_id", host.get_id().pretty())
        await host.connect(info)
        ok = False
        with contextlib.suppress(Exception), trio.fail_after(10):
            stream = await host.new_stream(info.peer_id, [HOP_PROTOCOL_ID])
            ask = HopMessage(
                type=HopMessage.RESERVE, peer=CircuitPeerId(id=host.get_id().to_bytes())
            )
            await write_delimited_msg(stream, ask)
            answer = await read_delimited_msg(stream, HopMessage)
            ok = answer.HasField("reservation") and StatusCode(answer.status) == StatusCode.OK
            await stream.close()
        say("reserved", int(ok))
        with trio.move_on_after(args.linger):
            while host.get_network().get_connections(info.peer_id):
                await trio.sleep(0.1)
            say("held 0")
            return
        say("held 1")
    say("done")


async def bait(bootstrap: str, topic: str, args: argparse.Namespace) -> None:
    info = info_from_p2p_addr(multiaddr.Multiaddr(bootstrap))
    host, trapped = make_host(), 0

    async def trap(stream: trio.SocketStream) -> None:
        nonlocal trapped
        trapped += 1
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, trap, 0, host="127.0.0.1")
        port = (await nursery.start(serve))[0].socket.getsockname()[1]
        key = create_new_key_pair()  # the peer it names, which it never was
        named = ID.from_pubkey(key.public_key)
        where = multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{port}")
        record = seal_record(PeerRecord(named, [where]), key.private_key).marshal_envelope()
        exchange = rpc_pb2.PeerInfo(peerID=named.to_bytes(), signedPeerRecord=record)
        prune = rpc_pb2.ControlPrune(topicID=topic, peers=[exchange])
        rpc = rpc_pb2.RPC(control=rpc_pb2.ControlMessage(prune=[prune]))
        async with host.run(listen_addrs=LISTEN):
            say("peer_id", host.get_id().pretty())
            await host.connect(info)
            say("connected")
            stream = await host.new_stream(info.peer_id, [args.protocol])
            await stream.write(encode_varint_prefixed(rpc.SerializeToString()))
            say("bait", port)
            await trio.sleep(args.linger)
        say("trapped", trapped)
        nursery.cancel_scope.cancel()
    say("done")


def _dialable(addr: str) -> bool:
    parts = addr.split("/")
    with contextlib.suppress(IndexError, ValueError):
        ip = ipaddress.ip_address(parts[2])
        return parts[1] == "ip4" and any(ip in net for net in DIAL_RANGES)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.rogue")
    modes = ["garbage", "invalid", "persist", "crowd", "reserve", "bait"]
    parser.add_argument("mode", choices=modes)
    parser.add_argument("bootstrap", help="/ip4/127.0.0.1/tcp/PORT/p2p/PEER_ID")
    parser.add_argument("topic")
    parser.add_argument("--count", type=int, default=8, help="invalid messages to send")
    parser.add_argument("--valid", type=int, default=0, help="valid messages to send after")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between messages")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds before the valid ones")
    parser.add_argument("--linger", type=float, default=60.0, help="seconds to stay after")
    parser.add_argument("--dial", action="append", default=[], help="a further peer to join")
    parser.add_argument("--vector", action="append", help="an invalid vector's name to send")
    parser.add_argument("--protocol", default=PROTOCOL, help="the meshsub version it speaks")
    parser.add_argument("--topics", action="append", default=[], help="a topic list, A,B")
    parser.add_argument("--dht", action="store_true", help="serve IPFS's DHT, as 0.3 did")
    parser.add_argument("--key-dir", type=Path, help="persist: where its identity key is kept")
    parser.add_argument("--then", type=int, default=0, help="crowd: peers of the second wave")
    parser.add_argument("--source", help="crowd, reserve: the address its dials leave from")
    args = parser.parse_args(argv)
    if not all(_dialable(a) for a in [args.bootstrap, *args.dial]):
        parser.error("the rogue peer dials 127.0.0.0/8 and 198.18.0.0/15 only")
    if args.source and not _dialable(f"/ip4/{args.source}/tcp/1"):
        parser.error("--source is an address in 127.0.0.0/8 or 198.18.0.0/15")
    if args.mode == "persist" and args.key_dir is None:
        parser.error("persist needs --key-dir")
    if args.mode == "garbage":
        trio.run(garbage, args.bootstrap, args.topic)
    elif args.mode == "invalid":
        trio.run(invalid, args.bootstrap, args.topic, args)
    elif args.mode == "crowd":
        trio.run(crowd, args.bootstrap, args)
    elif args.mode == "reserve":
        trio.run(reserve, args.bootstrap, args)
    elif args.mode == "bait":
        trio.run(bait, args.bootstrap, args.topic, args)
    else:
        trio.run(persist, args.bootstrap, args.topic, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
