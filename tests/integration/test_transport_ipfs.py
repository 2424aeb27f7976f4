"""IPFS's peers and the swarm's DHT (SPEC 2, *Discovery*): a peer of IPFS's DHT is neither
admitted nor dialled, and a node of it still exchanges groups.
"""

from __future__ import annotations

import time

import pytest

from tests.support.transports import (
    MINIMAL,
    MSG_S,
    alive,
    rogue_line,
    rogue_said,
    wait_until,
)


@pytest.mark.timeout(180)
def test_a_peer_of_ipfss_dht_is_neither_admitted_nor_dialled_for_the_swarm(swarm):
    """The swarm's DHT is /sapo/kad/1.0.0 (SPEC 2, *Discovery*). A peer that speaks only
    IPFS's /ipfs/kad/1.0.0 and dials a node (as IPFS nodes dial what they find) is not
    taken into its routing table, and once it leaves the node does not dial it: on
    IPFS's protocol id the node admitted it, and redialled it each pass."""
    node = swarm.start("node")
    other = swarm.start("other", to=node)  # a swarm peer: it is admitted
    for t in (node, other):
        wait_until(lambda t=t: t.child_stats.get("routing_table", 0) == 1, MSG_S, "admitted")

    # connected for 4 s, then watching 3 s: discovery passes run every second (redial_s),
    # and on IPFS's id one admitted it, and redialled it once it left, at the next pass
    log = swarm.ipfs_peer("--dial", node.addrs[0], "--hold", "4", "--watch", "3")
    ipfs_id = rogue_line(log, "peer_id")
    wait_until(rogue_said(log, "connected"), 60, f"the IPFS peer connects: {log.read_text()}")
    wait_until(lambda: node.child_stats.get("connected", 0) == 2, MSG_S, "both connected")
    tables = []
    while "disconnected" not in log.read_text(errors="replace"):  # its 4 s on the node
        tables.append(node.child_stats.get("routing_table", 0))
        time.sleep(0.1)
    assert set(tables) == {1}, tables  # the swarm peer only, pass after pass
    wait_until(rogue_said(log, "done"), 60, f"the IPFS peer watches: {log.read_text()}")
    assert f"dialled_by {node.peer_id}" not in log.read_text(), log.read_text()
    assert ipfs_id not in node.child_stats.get("scores", {})
    assert alive(node) and alive(other)


@pytest.mark.timeout(180)
def test_a_node_of_ipfss_dht_still_exchanges_groups_and_is_named_in_one_line(swarm, capfd):
    """SPEC 2, *Discovery*, versions: a peer on IPFS's DHT that speaks meshsub (as
    sapo-node 0.3 did; here plain py-libp2p) still exchanges groups once connected, and
    the node says once that it runs an older sapo-node."""
    node = swarm.start("node")
    args = ["--dht", "--count", "0", "--valid", "2", "--pause", "3", "--linger", "30"]
    log, _ = swarm.rogue("invalid", node, *args)
    older = rogue_line(log, "peer_id")
    wait_until(rogue_said(log, "done"), 60, f"the older node publishes: {log.read_text()}")
    wait_until(lambda: len([m for m in swarm.messages(node) if m.author == older]) == 2, MSG_S, "")
    assert node.publish(MINIMAL)
    wait_until(rogue_said(log, f"received {node.peer_id}"), MSG_S, "the older node hears it")
    err = ""

    def named() -> bool:
        nonlocal err
        err += capfd.readouterr().err
        return "runs an older sapo-node" in err

    wait_until(named, MSG_S, "the node names the older peer")
    time.sleep(3.0)  # more discovery passes: still one line
    err += capfd.readouterr().err
    assert err.count("runs an older sapo-node") == 1, err
    assert older in err
