"""Whole nodes in a swarm: real `sapo-node start` processes with the tiny model, talking
libp2p GossipSub on loopback, joining, dying and coming back while the others train."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.swarm import NodeProcess, node_config, stop_all, wait_until

pytestmark = pytest.mark.timeout(300)


@pytest.fixture()
def nodes(tmp_path: Path, tiny_model_dir: Path, request):
    """Make nodes with ``nodes(name)``; all are stopped at the end."""
    made: list[NodeProcess] = []
    swarm = re.sub("[^a-z0-9]+", "-", request.node.name[5:40].lower())
    config = node_config(tmp_path / "node.toml", tiny_model_dir, swarm)

    def make(name: str) -> NodeProcess:
        made.append(NodeProcess(name, tmp_path, config))
        return made[-1]

    yield make
    stop_all(*made, timeout=30)


def _trained_with_peers(node: NodeProcess, after_round: int = -1) -> bool:
    return any(r["groups/external"] > 0 and r["round"] > after_round for r in node.records())


def _received(node: NodeProcess, after_round: int = -1) -> int:
    return sum(r["net/received"] for r in node.records() if r["round"] > after_round)


def _round(node: NodeProcess) -> int:
    records = node.records()
    return records[-1]["round"] if records else -1


def _logs(*nodes: NodeProcess) -> str:
    """Each node's swarm facts now, its last log lines other than rounds, then its last
    lines."""
    return "\n".join(f"--- {n.name}: {n.net()}\n{n.tail(4, events=30)}" for n in nodes)


def test_a_late_joiner_trains_with_the_swarm_whose_middle_then_dies_and_rejoins(nodes) -> None:
    """a <- b <- c: a knows nobody, b knows a, and c, started once a and b already
    exchange, knows only b (a late joiner). All three train on each other's groups.
    Through b's DHT records a and c find each other, so when b dies the swarm does not
    split: they go on exchanging. b then restarts from its data directory (same key,
    peer ID and port) and is heard again. (One swarm for both stories: three node
    processes started, not six.)"""
    a = nodes("a").start()
    b = nodes("b").start(a)
    assert wait_until(lambda: _received(b) > 0, 150, alive=(a, b)), _logs(a, b)
    c = nodes("c").start(b)  # knows only b, once a and b already exchange
    assert wait_until(
        lambda: all(_trained_with_peers(n) for n in (a, b, c)), 150, alive=(a, b, c)
    ), _logs(a, b, c)
    for n in (a, b, c):
        assert max(r["net/peers"] for r in n.records()) >= 1
        assert sum(r["net/accepted"] for r in n.records()) > 0
    # a and c learn of each other beyond their bootstrap lists (the DHT), before b dies
    assert wait_until(lambda: a.records()[-1]["net/peers"] >= 2, 90, alive=(a, b, c)), _logs(a, c)
    b.kill()
    a_round, b_round, c_round = _round(a), _round(b), _round(c)
    assert wait_until(
        lambda: (
            _received(c, after_round=c_round + 1) > 0 and _received(a, after_round=a_round + 1) > 0
        ),
        120,
        alive=(a, c),
    ), _logs(a, c)
    a_round = _round(a)
    b.start(a)

    def b_and_a_hear_again() -> bool:
        return _received(b, after_round=b_round) > 0 and _received(a, after_round=a_round) > 0

    assert wait_until(b_and_a_hear_again, 120, alive=(a, b, c)), _logs(a, b, c)
    assert stop_all(a, b, c) == [0] * 3, _logs(a, b, c)


def test_nodes_meet_through_a_relay_that_loads_no_model(nodes) -> None:
    relay = nodes("relay").start(extra=("--no-train",))
    a = nodes("a").start(relay)
    b = nodes("b").start(relay)
    assert wait_until(
        lambda: _trained_with_peers(a) and _trained_with_peers(b), 150, alive=(relay, a, b)
    ), _logs(relay, a, b)
    log = relay.log.read_text()
    assert '"event": "swarm joined"' in log and '"event": "node ready"' not in log  # no model
    assert not (relay.data_dir / "metrics.jsonl").exists()  # it trained nothing
    assert stop_all(relay, a, b) == [0] * 3, _logs(relay, a, b)
