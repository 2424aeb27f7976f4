"""The libp2p transport across restarts: a ban outlives its network process and its node,
a killed network process comes back as itself, sequence numbers go on.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from sapo_node.intake import peerstate
from tests.support.transports import (
    CUSTOM,
    MESH_S,
    MINIMAL,
    MSG_S,
    UNICODE,
    alive,
    ban_and_drop_a_rogue,
    meshed,
    wait_until,
)

# --- restarts ------------------------------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.timeout(240)
def test_a_ban_survives_a_network_process_restart_and_a_node_restart(swarm):
    """A ban is kept in the data directory (peers-net.json, with the wall-clock
    time it ends) and handed to every network process: one the supervisor restarts after
    a crash, and one of the next run over the same data directory. It ends when it would
    have, not later and not at the restart."""
    victim = swarm.start("victim")
    honest = swarm.start("honest", to=victim)
    wait_until(meshed(victim, honest), MESH_S, "victim and honest peer in one mesh")
    rogue_id = ban_and_drop_a_rogue(swarm, victim, honest=1)
    ends = victim.child_stats["banned"][rogue_id]
    assert 590 < ends - time.time() <= 600  # BAN_S, as a wall-clock end
    path = swarm.root / "victim" / peerstate.NET_FILE
    wait_until(lambda: peerstate.load(path, "net").get("banned") == {rogue_id: ends}, 10, "saved")

    old_pid = victim._proc.pid
    os.kill(old_pid, signal.SIGKILL)  # the network process dies; the node restarts it
    wait_until(lambda: victim._proc.pid != old_pid and victim._ready.is_set(), 60, "a new child")
    wait_until(lambda: victim.child_stats.get("banned"), 10, "the new child's first report")
    assert victim.child_stats["banned"] == {rogue_id: ends}

    victim.close()  # the node stops, and a new run starts over the same data directory
    again = swarm.start("victim", to=honest)  # on a new port: it dials the honest peer
    wait_until(lambda: again.child_stats.get("banned"), 10, "the next run's first report")
    assert again.child_stats["banned"] == {rogue_id: ends}
    left = summary_left(swarm.root / "victim")
    assert rogue_id in left and 0 < left[rogue_id] <= 600
    wait_until(meshed(again, honest), MESH_S, "the honest peer is heard again")
    assert honest.publish(MINIMAL)
    wait_until(lambda: MINIMAL in swarm.data_from(again, honest), MSG_S, "the honest peer")


def summary_left(data_dir: Path) -> dict[str, float]:
    """Seconds left of each ban, as ``sapo-node pool`` shows them."""
    return {p: v["left_s"] for p, v in peerstate.summary(data_dir)["banned"].items()}


def test_a_killed_network_process_is_restarted_with_the_same_identity_and_address(swarm):
    a = swarm.start("a")
    b = swarm.start("b", to=a)
    wait_until(meshed(a, b), MESH_S, "a and b in one mesh")
    assert b.publish(MINIMAL)
    wait_until(lambda: swarm.data_from(a, b) == [MINIMAL], MSG_S, "a message before the crash")
    wait_until(lambda: a.stats().received == 1, 10, "counted (the child reports each second)")
    old_pid, old_addrs, peer_id = a._proc.pid, list(a.addrs), a.peer_id

    os.kill(old_pid, signal.SIGKILL)
    wait_until(lambda: a.stats().restarts == 1, MSG_S, "the supervisor notices")
    wait_until(lambda: a._proc.pid != old_pid and a._ready.is_set(), 60, "a new child")
    assert a.peer_id == peer_id and a.addrs == old_addrs
    assert a.addrs[0].endswith(f"/p2p/{peer_id}")
    wait_until(meshed(a, b), MESH_S, "b dials a again; one mesh")

    assert b.publish(UNICODE) and a.publish(CUSTOM)
    wait_until(lambda: UNICODE in swarm.data_from(a, b), MSG_S, "a receives after the restart")
    wait_until(lambda: swarm.data_from(b, a) == [CUSTOM], MSG_S, "b receives a's new message")
    # the counts of the dead child are kept: 1 before, 1 after
    wait_until(lambda: a.stats().received == 2, 10, "counts carried across the restart")
    assert a.stats().restarts == 1 and a._proc.poll() is None and alive(b)


@pytest.mark.timeout(180)
def test_sequence_numbers_survive_a_quick_restart(swarm):
    """docs/libp2p.md#sequence-numbers: seqnos counted from the clock in seconds repeat
    after a restart within seconds, and the receiver drops the new messages as already seen."""
    receiver = swarm.start("receiver")
    publisher = swarm.start("publisher", to=receiver)
    wait_until(meshed(receiver, publisher), MESH_S, "one mesh")
    n = 20
    for _ in range(n):
        assert publisher.publish(MINIMAL)
    wait_until(lambda: len(swarm.data_from(receiver, publisher)) == n, MSG_S, "the first 20")

    publisher.close()
    again = swarm.start("publisher", to=receiver)  # same data dir, at once
    assert again.peer_id == publisher.peer_id
    wait_until(meshed(again), MESH_S, "the restarted publisher in the mesh")
    for _ in range(n):
        assert again.publish(UNICODE)
    wait_until(
        lambda: swarm.data_from(receiver, again).count(UNICODE) == n,
        20,
        "all 20 after the restart (none taken as duplicates)",
    )
    assert alive(receiver)
