"""The network layer without sockets: the Inbox bounds, the in-memory hub, the frames
between the node and its network process."""

from __future__ import annotations

import io
import struct

import msgpack
import pytest
import trio
import trio.testing

from sapo_node.net import Inbox, NetStats, Received, ipc
from sapo_node.net.memory import MemoryHub


def msg(author: str, n: int, at: float | None = None) -> Received:
    return Received(f"{author}{n}".encode(), author, at if at is not None else float(n))


# --- Inbox ---------------------------------------------------------------------------


def test_inbox_drains_everything_oldest_first_and_empties():
    inbox = Inbox(per_author=10, total=100)
    for item in [msg("a", 1, 1.0), msg("b", 2, 0.5), msg("a", 3, 3.0), msg("c", 4, 2.0)]:
        inbox.put(item)
    assert len(inbox) == 4
    assert [x.received_at for x in inbox.drain()] == [0.5, 1.0, 2.0, 3.0]
    assert len(inbox) == 0
    assert inbox.drain() == []
    assert inbox.dropped == 0


def test_inbox_per_author_bound_drops_that_authors_oldest():
    inbox = Inbox(per_author=3, total=100)
    for n in range(5):
        inbox.put(msg("flood", n))
    inbox.put(msg("quiet", 10))
    items = inbox.drain()
    assert [x.data for x in items if x.author == "flood"] == [b"flood2", b"flood3", b"flood4"]
    assert [x.data for x in items if x.author == "quiet"] == [b"quiet10"]
    assert inbox.dropped == 2


def test_inbox_total_bound_drops_from_the_author_holding_most():
    inbox = Inbox(per_author=100, total=5)
    for n in range(4):
        inbox.put(msg("big", n))
    inbox.put(msg("small", 10))
    assert len(inbox) == 5 and inbox.dropped == 0
    inbox.put(msg("new", 20))  # full: the oldest of "big" (holding 4) goes
    inbox.put(msg("small", 11))  # full again: "big" still holds the most (3)
    assert len(inbox) == 5 and inbox.dropped == 2
    by_author: dict[str, list[bytes]] = {}
    for x in inbox.drain():
        by_author.setdefault(x.author, []).append(x.data)
    assert by_author == {
        "big": [b"big2", b"big3"],
        "small": [b"small10", b"small11"],
        "new": [b"new20"],
    }


def test_inbox_is_reusable_after_a_drain():
    inbox = Inbox(per_author=2, total=3)
    for n in range(10):
        inbox.put(msg(f"p{n % 4}", n))
    assert len(inbox) == 3
    assert len(inbox.drain()) == 3
    inbox.put(msg("p0", 99))
    assert [x.data for x in inbox.drain()] == [b"p099"]


# --- MemoryHub / MemoryTransport -------------------------------------------------------


def test_memory_hub_delivers_to_the_others_with_the_author():
    hub = MemoryHub()
    a, b, c = hub.join("A"), hub.join("B"), hub.join("C")
    assert (a.peers(), hub.size()) == (2, 3)
    assert a.publish(b"hello") is True
    assert a.received() == []  # not to itself
    for t in (b, c):
        got = t.received()
        assert [(x.data, x.author) for x in got] == [(b"hello", "A")]
        assert t.received() == []  # drained
    assert a.stats().published == 1 and a.stats().bytes_out == 5
    assert b.stats().received == 1 and b.stats().bytes_in == 5
    assert isinstance(b.stats(), NetStats) and b.stats().peers == 2
    before = b.stats()  # a snapshot, so that a node's per-round difference is not always 0
    a.publish(b"again")
    assert b.stats().bytes_in - before.bytes_in == 5


def test_memory_transport_close_penalise_and_inbox_bound():
    hub = MemoryHub()
    a, b = hub.join("A"), hub.join("B", per_author=2, total=10)
    for n in range(5):
        a.publish(bytes([n]))
    assert [x.data for x in b.received()] == [b"\x03", b"\x04"]
    assert b.stats().inbox_dropped == 3
    b.penalise("A")
    assert b.penalised == ["A"]
    a.close()
    assert a.publish(b"late") is False
    assert a.peers() == 0 and hub.size() == 1 and b.peers() == 0
    assert b.received() == []


# --- ipc frames ----------------------------------------------------------------------


def test_ipc_frames_round_trip_in_order():
    frames = [
        ["settings", {"topic": "sapo/x/rollouts/v1", "listen": ["/ip4/127.0.0.1/tcp/0"]}],
        ["publish", b"\x00\xff" * 1000],
        ["message", b"", "12D3KooWabc"],
        ["stop"],
    ]
    stream = io.BytesIO(b"".join(ipc.pack(f) for f in frames))
    assert [ipc.read_frame(stream) for _ in frames] == frames
    assert ipc.read_frame(stream) is None  # end of stream


def test_ipc_truncated_frame_is_end_of_stream():
    data = ipc.pack(["publish", b"x" * 100])
    assert ipc.read_frame(io.BytesIO(data[:2])) is None
    assert ipc.read_frame(io.BytesIO(data[:-1])) is None


def test_ipc_refuses_an_oversize_frame_before_reading_it():
    head = struct.pack(">I", ipc.MAX_FRAME + 1)
    with pytest.raises(ValueError, match="frame of"):
        ipc.read_frame(io.BytesIO(head + b"\x00" * 16))


@pytest.mark.parametrize("value", [{"a": 1}, [], [1, 2], "stop"])
def test_ipc_refuses_what_is_not_a_frame(value):
    body = msgpack.packb(value)
    with pytest.raises(ValueError, match="not a frame"):
        ipc.read_frame(io.BytesIO(struct.pack(">I", len(body)) + body))


def test_ipc_trio_reader_and_writer_agree_with_the_blocking_ones():
    frames = [["publish", b"x" * 200_000], ["penalise", "12D3KooWabc"], ["stop"]]

    async def main() -> tuple[list, bytes]:
        send, receive = trio.testing.memory_stream_one_way_pair()
        writer, reader = ipc.FrameWriter(send), ipc.FrameReader(receive)
        got: list = []
        async with trio.open_nursery() as nursery:

            async def write() -> None:
                for f in frames:
                    await writer.send(f)
                await send.aclose()

            nursery.start_soon(write)
            while (frame := await reader.receive()) is not None:
                got.append(frame)
        return got, b"".join(ipc.pack(f) for f in frames)

    got, packed = trio.run(main)
    assert got == frames
    stream = io.BytesIO(packed)
    assert [ipc.read_frame(stream) for _ in frames] == frames


def test_ipc_trio_reader_refuses_an_oversize_frame():
    async def main() -> None:
        send, receive = trio.testing.memory_stream_one_way_pair()
        await send.send_all(struct.pack(">I", ipc.MAX_FRAME + 1))
        await ipc.FrameReader(receive).receive()

    with pytest.raises(ValueError, match="frame of"):
        trio.run(main)


def test_refusal_counts_are_bounded_whatever_the_number_of_authors():
    from sapo_node.net import MAX_REFUSAL_KEYS, OTHERS, count_refusal

    counts: dict[tuple[str, str], int] = {}
    for i in range(MAX_REFUSAL_KEYS + 500):
        count_refusal(counts, f"peer-{i}", "bad_count")
    count_refusal(counts, "peer-0", "bad_count", 2)  # a known pair still counts as itself
    assert len(counts) == MAX_REFUSAL_KEYS + 1
    assert counts[("peer-0", "bad_count")] == 3
    assert counts[(OTHERS, "bad_count")] == 500


def test_the_dht_key_is_the_topics_cid_other_kademlias_take():
    import hashlib

    from cid import make_cid
    from libp2p.kad_dht.kad_dht import _encode_key

    from sapo_node.net.discovery import dht_key

    topic = "sapo/demo/rollouts/v2"
    key = dht_key(topic)
    assert key == "bafkreibvnnvnwusuanf37dnqtov2m5nxv57nowvbu4ijx2bpebr4cmnbsq"
    digest = hashlib.sha256(topic.encode()).digest()
    parsed = make_cid(key)  # an independent CID parser: version 1, raw, sha2-256
    assert (parsed.version, parsed.codec) == (1, "raw")
    assert parsed.multihash == b"\x12\x20" + digest
    assert _encode_key(key) == parsed.multihash  # what py-libp2p stores records under


def test_a_peer_that_pruned_this_node_may_graft_it_again_unpunished():
    """py-libp2p 0.8.1 marked a peer that pruned us as if we had pruned it, and its next
    GRAFT within 10 s cost it a ban; honest peers banned each other by the dozen in a
    16-node swarm (docs/scale.md)."""
    import time

    from libp2p.peer.id import ID
    from libp2p.pubsub.pb import rpc_pb2

    from sapo_node.net.pubsub import PROTOCOLS, SwarmGossipSub

    router = SwarmGossipSub(protocols=PROTOCOLS, degree=6, degree_low=4, degree_high=12)
    pruner, pruned = ID(b"\x00\x04peer"), ID(b"\x00\x04gone")
    router.mesh["t"] = {pruner, pruned}
    router.graft_flood_tracking[pruned]["t"] = time.time()  # this node pruned it
    trio.run(router.handle_prune, rpc_pb2.ControlPrune(topicID="t"), pruner)
    assert pruner not in router.mesh["t"]  # the prune itself is taken
    assert pruner not in router.graft_flood_tracking  # no mark held for it
    assert router._check_graft_flood_protection(pruner, "t")  # its GRAFT is welcome
    trio.run(router.handle_prune, rpc_pb2.ControlPrune(topicID="t"), pruned)
    assert not router._check_graft_flood_protection(pruned, "t")  # the mark stays
