"""A forged message, its signature junk and its author someone else, on real py-libp2p
hosts on loopback (protocol/SPEC.md section 2.2, *A message's topics*): it costs the
peer that sent it, and it cannot make a node refuse, or drop, the author's real message.

The receiving node is the network's own pubsub behaviour (net/pubsub.py) on a real host;
the honest author and the forger are plain py-libp2p peers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import structlog
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX
from libp2p.tools.anyio_service import background_trio_service

from sapo_node.intake import wire
from sapo_node.logs import QuietLog
from sapo_node.net import patches
from sapo_node.net.pubsub import REFUSAL_LOG_S, PubsubBehaviour
from sapo_node.net.state import COUNTERS
from tests.support.rogue import LISTEN, VECTORS, make_gossipsub, make_host, valid_payloads

TOPIC = wire.topic("forgery")
DEADLINE_S = 10.0


class Receiver(PubsubBehaviour):
    """The network's pubsub behaviour on a host of its own: what Network builds of it,
    without discovery and reachability."""

    def __init__(self, out: trio.MemorySendChannel) -> None:
        self.host = make_host()
        self.me = self.host.get_id()
        self.topic, self.topics, self.home = TOPIC, [TOPIC], TOPIC
        self.topics_before: list[str] = []
        self.out = out
        self.backoff: dict = {}  # the discovery behaviour's redial delays, which a ban clears
        self.validated: list[bytes] = []  # seqnos of the messages the validator saw
        self._init_pubsub({"mesh_degree": 6, "rate_per_author": 100.0, "burst_per_author": 100})

    def validate(self, forwarder: ID, msg: Any) -> bool:
        self.validated.append(bytes(msg.seqno))
        return super().validate(forwarder, msg)

    def invalid(self, peer: ID) -> float:
        """The invalid messages ``peer``'s score counts."""
        return sum(self.scorer.invalid_messages.get(peer, {}).values())


@dataclass
class Peer:
    host: Any
    pubsub: Pubsub

    @property
    def id(self) -> ID:
        return self.host.get_id()


def signed(author: Peer, seqno: bytes, topics: list[str], data: bytes) -> Any:
    """A message as py-libp2p signs it (Pubsub.publish)."""
    return signed_by(author.pubsub.sign_key, seqno, topics, data)


def signed_by(key: Any, seqno: bytes, topics: list[str], data: bytes) -> Any:
    """A message signed with the private ``key``, its author the key's peer ID."""
    author = ID.from_pubkey(key.get_public_key())
    msg = rpc_pb2.Message(data=data, topicIDs=topics, from_id=author.to_bytes(), seqno=seqno)
    msg.signature = key.sign(PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString())
    msg.key = key.get_public_key().serialize()
    return msg


def forged(author: ID, seqno: bytes, topics: list[str], data: bytes) -> Any:
    """What anyone can send in ``author``'s name: its next seqno, a junk signature."""
    return rpc_pb2.Message(
        data=data, topicIDs=topics, from_id=author.to_bytes(), seqno=seqno, signature=b"\x01" * 64
    )


@contextlib.asynccontextmanager
async def swarm() -> AsyncIterator[tuple[Receiver, trio.MemoryReceiveChannel, Peer, Peer]]:
    """A receiving node, an honest author and a forger, each connected to the node, the
    author in its mesh."""
    patches.apply()
    send, received = trio.open_memory_channel(64)
    node = Receiver(send)
    peers = []
    for _ in range(2):
        key = create_new_key_pair()
        host = make_host(key)
        peers.append(
            Peer(host, Pubsub(host, make_gossipsub("/meshsub/1.1.0"), strict_signing=True))
        )
    author, forger = peers
    failure = None
    async with contextlib.AsyncExitStack() as stack:
        for pubsub, router in [(node.pubsub, node.gossipsub)] + [
            (p.pubsub, p.pubsub.router) for p in peers
        ]:
            await stack.enter_async_context(background_trio_service(pubsub))
            await stack.enter_async_context(background_trio_service(router))
            await pubsub.wait_until_ready()
        node.pubsub.set_topic_validator(TOPIC, node.validate, False)
        subscription = await node.pubsub.subscribe(TOPIC)
        for peer in peers:
            await peer.pubsub.subscribe(TOPIC)
        for host in (node.host, author.host, forger.host):
            await stack.enter_async_context(host.run(listen_addrs=LISTEN))
        nursery = await stack.enter_async_context(trio.open_nursery())
        nursery.start_soon(node._deliver, subscription)
        for peer in peers:
            await peer.host.connect(PeerInfo(node.me, node.host.get_addrs()))
        with trio.fail_after(DEADLINE_S):
            while author.id not in node.gossipsub.mesh.get(TOPIC, set()) or any(
                node.me not in p.pubsub.peers for p in peers
            ):
                await trio.sleep(0.05)
        try:
            yield node, received, author, forger
        except AssertionError as exc:  # raised below, not deep in the nurseries' groups
            failure = exc
        nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure


async def send_frame(sender: Peer, to: ID, msg: Any) -> None:
    """``msg`` on ``sender``'s own pubsub stream to ``to``, as a forger writes it."""
    rpc = rpc_pb2.RPC(publish=[msg])
    assert await sender.pubsub.write_msg(sender.pubsub.peers[to], rpc)


async def until(condition: Any) -> None:
    with trio.fail_after(DEADLINE_S):
        while not condition():
            await trio.sleep(0.02)


def test_a_forged_message_in_an_authors_name_costs_its_sender_and_silences_nobody() -> None:
    """The forger sends, in the author's name and with its next seqno, a message whose
    topic list repeats the topic and whose signature is junk; then the author publishes.
    The author's message reaches the node's validator and the node; the forger is
    charged, and no refusal is counted against the author."""
    data = valid_payloads(1)[0]

    async def main() -> tuple[list[Any], float, dict, list[bytes], bytes]:
        async with swarm() as (node, received, author, forger):
            seqno = (author.pubsub.counter + 1).to_bytes(8, "big")  # what it sends next
            await send_frame(forger, node.me, forged(author.id, seqno, [TOPIC, TOPIC], data))
            await until(lambda: node.pubsub.excused or node.invalid(forger.id) > 0)
            await author.pubsub.publish(TOPIC, data)
            got = []
            with trio.move_on_after(3.0):
                got.append(await received.receive())
            return got, node.invalid(forger.id), node.refusals, node.validated, seqno

    got, forger_charged, refusals, validated, seqno = trio.run(main)
    assert validated == [seqno]  # the real message, once; never the forged one
    assert len(got) == 1 and got[0][1] == data
    assert forger_charged == 1.0
    assert refusals == {}


def test_the_librarys_push_path_checks_the_signature_before_the_topic_list() -> None:
    """Each message through the node's whole push path (SwarmPubsub.push_msg, then
    py-libp2p's Pubsub.push_msg, its validation and scoring), not only the node's own
    check: the order of checks in a new py-libp2p shows here, whatever its version."""
    data = valid_payloads(1)[0]

    async def main() -> None:
        async with swarm() as (node, received, author, forger):

            def seqno(n: int) -> bytes:
                return (10**9 + n).to_bytes(8, "big")

            # a junk signature, a valid topic list: dropped unchecked, its sender charged
            await node.pubsub.push_msg(forger.id, forged(author.id, seqno(1), [TOPIC], data))
            assert node.validated == [] and node.invalid(forger.id) == 1.0
            # a junk signature and a repeated topic: the same, and no refusal in the
            # author's name, no excuse that would drop its real message
            await node.pubsub.push_msg(forger.id, forged(author.id, seqno(2), [TOPIC] * 2, data))
            assert node.validated == [] and node.invalid(forger.id) == 2.0
            assert node.refusals == {} and not node.pubsub.excused
            # the author's real message with that seqno goes through
            await node.pubsub.push_msg(forger.id, signed(author, seqno(2), [TOPIC], data))
            assert node.validated == [seqno(2)]
            assert (await received.receive())[1] == data
            # a signed, repeated topic list relayed: the author chose it; nobody is charged
            # and later copies are dropped unchecked
            twice = signed(author, seqno(3), [TOPIC] * 2, data)
            await node.pubsub.push_msg(forger.id, twice)
            await node.pubsub.push_msg(author.id, twice)
            assert node.invalid(forger.id) == 2.0 and node.invalid(author.id) == 0.0
            assert node.refusals == {(author.id.pretty(), "topic_repeated"): 1}
            # ... sent by the author itself: charged once
            await node.pubsub.push_msg(author.id, signed(author, seqno(4), [TOPIC] * 2, data))
            assert node.invalid(author.id) == 1.0
            assert node.validated == [seqno(2)]
            # a forger that goes on is banned; the author it named is not
            for n in range(5, 10):
                await node.pubsub.push_msg(forger.id, forged(author.id, seqno(n), [TOPIC], data))
            assert node._ban_low_scores() == [forger.id]
            assert author.id not in node.banned

    trio.run(main)


def test_refusals_nobody_pays_for_are_logged_once_a_minute_per_forwarder() -> None:
    """A peer that makes keys at will signs, under each, a message whose topic list
    repeats the topic and one of another version, and forwards them all: nobody is
    charged (the authors chose them), and each would have cost a log line. Every refusal
    is counted, by author and reason; the forwarder gets one line, and its next one, a
    minute later, says how many were not logged. An author that sends its own refused
    messages pays for each, and each is logged."""
    data = valid_payloads(1)[0]
    other_version = (VECTORS / "invalid" / "unsupported_version_3.msgpack").read_bytes()
    keys = [create_new_key_pair().private_key for _ in range(20)]

    async def main() -> None:
        async with swarm() as (node, received, author, forger):
            rejected = COUNTERS.rejected
            with structlog.testing.capture_logs() as logs:
                for i, key in enumerate(keys):
                    seqno = (i + 1).to_bytes(8, "big")
                    await node.pubsub.push_msg(forger.id, signed_by(key, seqno, [TOPIC] * 2, data))
                    await node.pubsub.push_msg(
                        forger.id, signed_by(key, seqno + b"v", [TOPIC], other_version)
                    )
            lines = [e for e in logs if e["event"] == "message refused"]
            assert len(lines) == 1, lines
            assert lines[0]["via"] == forger.id.pretty() and "not_logged" not in lines[0]
            assert COUNTERS.rejected - rejected == 2 * len(keys)
            authors = [ID.from_pubkey(k.get_public_key()).pretty() for k in keys]
            assert node.refusals == {
                **{(a, "topic_repeated"): 1 for a in authors},
                **{(a, "unsupported_version"): 1 for a in authors},
            }
            assert node.invalid(forger.id) == 0.0
            # a minute on, the forwarder's next refusal is logged, with the count held back
            logged, held = node.quiet_refusals.keys[forger.id]
            node.quiet_refusals.keys[forger.id] = (logged - REFUSAL_LOG_S, held)
            one_more = create_new_key_pair().private_key
            with structlog.testing.capture_logs() as logs:
                await node.pubsub.push_msg(
                    forger.id, signed_by(one_more, b"1" * 8, [TOPIC] * 2, data)
                )
                # the author's own refused messages: each charged, each logged
                for n in (1, 2):
                    twice = signed(author, (10**9 + n).to_bytes(8, "big"), [TOPIC] * 2, data)
                    await node.pubsub.push_msg(author.id, twice)
            lines = [e for e in logs if e["event"] == "message refused"]
            assert [(e["via"], e["outcome"], e.get("not_logged")) for e in lines] == [
                (forger.id.pretty(), "ignored", 2 * len(keys) - 1),
                (author.id.pretty(), "rejected", None),
                (author.id.pretty(), "rejected", None),
            ]
            assert node.invalid(author.id) == 2.0

    trio.run(main)


def test_a_quiet_log_holds_back_lines_per_key_and_counts_them() -> None:
    quiet = QuietLog(60.0, limit=2)
    assert [quiet.take("a", t) for t in (0.0, 1.0, 59.9, 60.0, 61.0)] == [0, None, None, 2, None]
    assert quiet.take("b", 61.0) == 0 and quiet.take("b", 62.0) is None  # keys apart
    assert quiet.take("c", 63.0) == 0  # a third key pushes out the one logged longest ago
    assert list(quiet.keys) == ["b", "c"]
    assert quiet.take("a", 64.0) == 0
