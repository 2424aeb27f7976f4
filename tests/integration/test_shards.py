"""Shard topics for real (docs/scale.md): network processes on loopback on different
shards each receive their shards' groups, enough to fill J, and none of the others'; a
node that joins late through a peer of another shard finds its own shard's members; a
node of the version before shards (one topic) still exchanges groups in a swarm of one
shard."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from sapo_node.config import PoolSection, TrainSection
from sapo_node.intake import wire
from sapo_node.net import identity
from sapo_node.net.process import Libp2pTransport
from tests.support.transports import (
    MESH_S,
    MINIMAL,
    MSG_S,
    UNICODE,
    Swarm,
    rogue_said,
    wait_until,
)

J = TrainSection().external_groups  # what each node must be able to fill, a round


class ShardSwarm(Swarm):
    def start_on(
        self,
        name: str,
        shards: int,
        joined: int,
        want: set[int],
        to: list[Libp2pTransport],
        before: int = 0,
    ) -> Libp2pTransport:
        """A transport whose peer ID puts it on shards ``want`` of ``shards`` (and, with
        ``before``, on its shards of that count too: net.shards_before)."""
        data_dir = self.root / name
        key_on(data_dir, shards, joined, want)
        net = self.net(
            [p.addrs[0] for p in to], shards=shards, shards_joined=joined, shards_before=before
        )
        t = Libp2pTransport(net, PoolSection(), data_dir)
        assert set(t.shards) == want
        self.transports.append(t)
        return t


def key_on(data_dir: Path, shards: int, joined: int, want: set[int]) -> None:
    """Write an identity key whose peer ID joins exactly the shards ``want``."""
    for _ in range(10_000):
        key = create_new_key_pair()
        peer = ID.from_pubkey(key.public_key)
        if set(wire.shards_of(peer.to_bytes(), shards, joined)) == want:
            data_dir.mkdir(parents=True, exist_ok=True)
            path = data_dir / identity.KEY_FILE
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(key.private_key.serialize())
            return
    raise AssertionError(f"no key on shards {want} of {shards}")


@pytest.fixture()
def swarm(tmp_path: Path, request: pytest.FixtureRequest):
    s = ShardSwarm(tmp_path, request.node.name)
    try:
        yield s
    finally:
        s.close()


def meshed_on_each(t: Libp2pTransport) -> bool:
    meshes = t.child_stats.get("meshes") or [0]
    return len(meshes) >= len(t.topics) and min(meshes) >= 1  # shards_before: more


@pytest.mark.timeout(240)
def test_nodes_on_different_shards_each_fill_j_from_their_own(swarm):
    """Two shards: a0, a1 on shard 0, b0, b1 on shard 1 (k = 1), a bridge on both (k = 2).
    a1 joins last, through b0 only, and must find shard 0's members itself."""
    bridge = swarm.start_on("bridge", 2, 2, {0, 1}, [])
    a0 = swarm.start_on("a0", 2, 1, {0}, [bridge])
    b0 = swarm.start_on("b0", 2, 1, {1}, [bridge])
    b1 = swarm.start_on("b1", 2, 1, {1}, [bridge])
    first = (bridge, a0, b0, b1)
    wait_until(lambda: all(meshed_on_each(t) for t in first), MESH_S, "the first four meshed")
    a1 = swarm.start_on("a1", 2, 1, {0}, [b0])  # late, through a peer of the other shard
    wait_until(lambda: meshed_on_each(a1), MESH_S, "the late node meshes on its shard")
    assert a1.stats().shards == "0 of 2" and bridge.stats().mesh_peers[0] >= 1

    everyone = (bridge, a0, a1, b0, b1)
    for t in everyone:  # two groups each, as a node publishing I = 2 a round
        assert t.publish(MINIMAL) and t.publish(UNICODE)
    shard = {a0: 0, a1: 0, b0: 1, b1: 1}

    def got(receiver: Libp2pTransport, author: Libp2pTransport) -> int:
        return len(swarm.data_from(receiver, author))

    for r, mine in shard.items():
        mate = next(t for t, s in shard.items() if s == mine and t is not r)
        # the mate's two, and the one of the bridge's two that went to this shard
        wait_until(
            lambda r=r, m=mate: got(r, m) == 2 and got(r, bridge) == 1,
            MSG_S,
            f"shard {mine} delivers to its members",
        )
        assert got(r, mate) + got(r, bridge) >= J
    wait_until(
        lambda: sum(got(bridge, t) for t in shard) == 8, MSG_S, "the bridge has both shards'"
    )
    for r, mine in shard.items():  # nothing of the other shard's members reached it
        assert all(got(r, t) == 0 for t, s in shard.items() if s != mine)


@pytest.mark.timeout(180)
def test_a_node_before_shards_exchanges_groups_in_a_swarm_of_one_shard(swarm):
    """The rogue peer is py-libp2p alone on the swarm's single topic, as every node was
    before shards; a node of today with the default net.shards = 1 (and shards_joined 2)
    exchanges groups with it both ways."""
    node = swarm.start("node")
    assert node.topics == [wire.topic(swarm.name)]
    log, _ = swarm.rogue("invalid", node, "--count", "0", "--valid", "2", "--linger", "30")
    wait_until(rogue_said(log, "done"), 60, "the old node publishes")
    old = re.search(r"peer_id (\S+)", log.read_text()).group(1)
    wait_until(
        lambda: len([m for m in swarm.messages(node) if m.author == old]) == 2,
        MSG_S,
        "its groups reach the node",
    )
    assert node.publish(MINIMAL)
    wait_until(rogue_said(log, f"received {node.peer_id}"), MSG_S, "the node's reach it")


@pytest.mark.timeout(180)
def test_while_s_changes_nodes_on_the_old_and_the_new_file_exchange_groups(swarm):
    """The swarm goes from one topic to two shards (k = 1). ``old`` still follows the old
    file; ``n0``, ``m0`` and ``n1`` the new one, whose shards_before = 1 keeps them on the
    old topic too; ``late`` a file without shards_before. Each message is handed on once,
    though ``m0`` hears ``n0``'s on both of its topics."""
    old = swarm.start_on("old", 1, 1, {0}, [])
    n0 = swarm.start_on("n0", 2, 1, {0}, [old], before=1)
    n1 = swarm.start_on("n1", 2, 1, {1}, [old], before=1)
    m0 = swarm.start_on("m0", 2, 1, {0}, [n0], before=1)
    late = swarm.start_on("late", 2, 1, {0}, [n0])
    assert n0.settings["topics_before"] == [wire.topic(swarm.name)] and n0.topics == [
        wire.shard_topic(swarm.name, 0, 2)
    ]
    for t in (old, n0, m0, late):
        wait_until(lambda t=t: meshed_on_each(t), MESH_S, f"{t.peer_id} meshed")
    assert len(n0.child_stats["meshes"]) == 2  # meshed on the old topic too
    # n1 is alone on shard 1 of 2: its mesh is on the old topic only
    wait_until(lambda: (n1.child_stats.get("meshes") or [0, 0])[1] >= 1, MESH_S, "n1 meshed")
    for t in (old, n0, n1):
        assert t.publish(MINIMAL) and t.publish(UNICODE)

    def got(receiver: Libp2pTransport, author: Libp2pTransport) -> int:
        return len(swarm.data_from(receiver, author))

    wait_until(lambda: got(old, n0) == 2 and got(old, n1) == 2, MSG_S, "old has the new nodes'")
    wait_until(lambda: got(n0, old) == 2 and got(n0, n1) == 2, MSG_S, "n0 has old's and n1's")
    wait_until(lambda: got(n1, old) == 2 and got(n1, n0) == 2, MSG_S, "n1 has old's and n0's")
    wait_until(lambda: got(late, n0) == 2, MSG_S, "late has its shard's")
    wait_until(lambda: got(m0, n0) == 2 and got(m0, old) == 2, MSG_S, "m0 has n0's and old's")
    # each handed on once (m0 heard n0's on two topics); late heard only shard 0
    wait_until(lambda: m0.stats().received == 6, MSG_S, "m0 counted each message once")
    assert got(m0, n0) == got(n0, old) == got(n0, n1) == 2
    assert got(late, n1) == got(late, old) == 0
