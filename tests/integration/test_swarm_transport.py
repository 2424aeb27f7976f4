"""The libp2p transport for real: network child processes on loopback exchanging
messages, refusing bad ones and surviving hostile peers. Its restarts, what a relay is
charged for, and IPFS's peers: test_transport_restarts.py, test_transport_relay.py,
test_transport_ipfs.py.

Every node listens on 127.0.0.1 only, mDNS off, in a swarm of its test's own; every
process started here is stopped in the ``swarm`` fixture's teardown (conftest.py).
The hostile peer is ``tests/support/rogue.py``, written straight against py-libp2p.
"""

from __future__ import annotations

import re
import threading
import time

import pytest

from sapo_node.config import NetSection, PoolSection
from sapo_node.intake import wire
from sapo_node.net import NetError, identity
from sapo_node.net.process import Libp2pTransport
from tests.support.rogue import invalid_payloads
from tests.support.swarm import free_port
from tests.support.transports import (
    BIGGEST,
    CUSTOM,
    MESH_S,
    MINIMAL,
    MSG_S,
    TRUNCATED,
    UNICODE,
    alive,
    ban_and_drop_a_rogue,
    meshed,
    rogue_said,
    wait_until,
)

# --- exchanging messages -------------------------------------------------------------


@pytest.mark.timeout(180)
def test_two_then_three_transports_exchange_messages_with_their_authors(swarm):
    a = swarm.start("a")
    b = swarm.start("b", to=a)
    assert a.peer_id != b.peer_id
    assert all(addr.startswith("/ip4/127.0.0.1/tcp/") for addr in a.addrs + b.addrs)
    wait_until(meshed(a, b), MESH_S, "a and b in one mesh")

    assert b.publish(MINIMAL) and a.publish(UNICODE)
    wait_until(lambda: swarm.data_from(a, b) == [MINIMAL], MSG_S, "a receives b's message")
    wait_until(lambda: swarm.data_from(b, a) == [UNICODE], MSG_S, "b receives a's message")
    assert all(m.author == b.peer_id for m in swarm.messages(a))

    c = swarm.start("c", to=a)
    wait_until(lambda: meshed(c)() and a.peers() >= 2, MESH_S, "c joins the mesh")
    assert c.publish(CUSTOM)
    for t in (a, b):
        wait_until(lambda t=t: swarm.data_from(t, c) == [CUSTOM], MSG_S, "a and b get c's message")

    # invalid bytes are refused by every receiver, counted, and reach nobody's node
    rejected = {id(t): t.stats().rejected for t in (b, c)}
    assert a.publish(b"not msgpack") and a.publish(TRUNCATED)
    a.publish(MINIMAL)  # a valid one after them, as a marker
    for t in (b, c):
        wait_until(lambda t=t: MINIMAL in swarm.data_from(t, a), MSG_S, "the marker arrives")
        wait_until(lambda t=t: t.stats().rejected >= rejected[id(t)] + 2, 10, "both refused")
        assert b"not msgpack" not in swarm.data_from(t, a)
        assert TRUNCATED not in swarm.data_from(t, a)
    assert a.stats().published == 4 and a.stats().publish_dropped == 0
    wait_until(lambda: b.stats().received >= 3 and c.stats().received >= 1, 10, "counted")
    assert all(alive(t) for t in (a, b, c))

    # flush answers once the network process has published what was queued before it and
    # written it to its peers' streams (sapo-node share waits for it before closing)
    assert c.publish(UNICODE) and c.publish(MINIMAL)
    assert c.flush(MSG_S, drain_s=MSG_S)
    want = sorted([CUSTOM, UNICODE, MINIMAL])
    for t in (a, b):
        wait_until(lambda t=t: sorted(swarm.data_from(t, c)) == want, MSG_S, "c's last two")


# --- identity ------------------------------------------------------------------------


def test_identity_key_is_private_and_the_peer_id_stable(tmp_path):
    first = identity.peer_id(identity.load_or_create(tmp_path / "node"))
    key = tmp_path / "node" / identity.KEY_FILE
    assert key.stat().st_mode & 0o777 == 0o600
    assert identity.peer_id(identity.load_or_create(tmp_path / "node")) == first
    assert first.startswith("12D3KooW")  # ed25519
    assert sorted(p.name for p in (tmp_path / "node").iterdir()) == [identity.KEY_FILE]


def test_a_transport_refuses_a_key_file_that_is_not_a_key(tmp_path):
    key = tmp_path / "node" / identity.KEY_FILE
    key.parent.mkdir()
    key.write_bytes(b"\x00garbage, not a key\xff")
    key.chmod(0o600)
    net = NetSection(listen=["/ip4/127.0.0.1/tcp/0"], mdns=False, redial_s=1.0, swarm="badkey")
    with pytest.raises(NetError, match=r"is not a libp2p private key.*move it away"):
        Libp2pTransport(net, PoolSection(), tmp_path / "node")


def test_a_transport_refuses_an_unreadable_key_file(tmp_path):
    (tmp_path / "node" / identity.KEY_FILE).mkdir(parents=True)  # unreadable, even as root
    net = NetSection(listen=["/ip4/127.0.0.1/tcp/0"], mdns=False, redial_s=1.0, swarm="nokey")
    with pytest.raises(NetError, match="cannot read the identity key"):
        Libp2pTransport(net, PoolSection(), tmp_path / "node")


def test_a_transport_refuses_a_key_file_others_can_read(tmp_path):
    identity.load_or_create(tmp_path / "node")
    (tmp_path / "node" / identity.KEY_FILE).chmod(0o644)
    net = NetSection(listen=["/ip4/127.0.0.1/tcp/0"], mdns=False, redial_s=1.0, swarm="openkey")
    with pytest.raises(NetError, match=r"readable by others \(mode 644\).*chmod 600"):
        Libp2pTransport(net, PoolSection(), tmp_path / "node")


# --- port in use ---------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_second_transport_on_a_port_in_use_says_so(swarm):
    port = free_port()
    a = swarm.start("a", port=port)
    assert any(f"/tcp/{port}/" in addr for addr in a.addrs)
    with pytest.raises(NetError, match=rf"port {port} on 127\.0\.0\.1 is in use"):
        swarm.start("b", port=port)
    assert alive(a)


# --- hostile peers -------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_garbage_pubsub_frames_crash_nobody(swarm):
    victim = swarm.start("victim")
    honest = swarm.start("honest", to=victim)
    wait_until(meshed(victim, honest), MESH_S, "victim and honest peer in one mesh")

    log, n = swarm.rogue("garbage", victim)
    assert swarm.rogues[n].wait(60) == 0, log.read_text()
    assert "sent garbage frame" in log.read_text() and "sent nonsense frame" in log.read_text()
    # one undecodable frame, one message with a junk key: each counted, neither fatal
    wait_until(lambda: victim.child_stats.get("bad_frames", 0) >= 2, MSG_S, "bad frames counted")

    assert honest.publish(MINIMAL) and victim.publish(UNICODE)
    wait_until(lambda: swarm.data_from(victim, honest) == [MINIMAL], MSG_S, "victim still receives")
    wait_until(lambda: swarm.data_from(honest, victim) == [UNICODE], MSG_S, "victim still sends")
    assert alive(victim) and alive(honest)


@pytest.mark.timeout(240)
def test_a_peer_joining_mid_stream_of_big_messages_crashes_nobody(swarm):
    """docs/libp2p.md#serialised-writes: the replay of recent messages to a newcomer and
    the queued ones must not interleave their writes on one stream."""
    pool = PoolSection(rate_per_author=1000.0, burst_per_author=1000)
    a = swarm.start("a", pool=pool)
    b = swarm.start("b", to=a, pool=pool)
    wait_until(meshed(a, b), MESH_S, "a and b in one mesh")

    # a publishes 512 KiB messages, ~6 a second, until c has joined and had some
    published, started, stop = [], threading.Event(), threading.Event()

    def stream() -> None:
        while not stop.is_set() and len(published) < 300:
            published.append(a.publish(BIGGEST))
            if len(published) == 5:
                started.set()
            time.sleep(0.15)

    publisher = threading.Thread(target=stream, daemon=True)
    publisher.start()
    try:
        assert started.wait(30)
        c = swarm.start("c", to=a, pool=pool)  # joins while a is publishing
        wait_until(
            lambda: swarm.data_from(b, a) and len(swarm.data_from(c, a)) >= 10,
            60,
            "c receives the stream",
        )
    finally:
        stop.set()
        publisher.join(30)
    assert not publisher.is_alive() and all(published)
    count = len(published)
    wait_until(lambda: len(swarm.data_from(b, a)) == count, 60, "b gets the whole stream")
    assert all(d == BIGGEST for d in swarm.data_from(b, a) + swarm.data_from(c, a))
    assert a.stats().publish_dropped == 0

    # everyone still talks to everyone
    for sender, data in ((a, MINIMAL), (b, UNICODE), (c, CUSTOM)):
        assert sender.publish(data)
    for receiver in (a, b, c):
        for sender, data in ((a, MINIMAL), (b, UNICODE), (c, CUSTOM)):
            if sender is not receiver:
                wait_until(
                    lambda r=receiver, s=sender, d=data: d in swarm.data_from(r, s),
                    20,
                    "a final message from each to each",
                )
    for t in (a, b, c):
        assert alive(t), t.child_stats
        assert t.child_stats.get("bad_frames", 0) == 0


@pytest.mark.timeout(180)
def test_a_peer_publishing_invalid_groups_is_penalised_then_banned(swarm):
    victim = swarm.start("victim")
    honest = swarm.start("honest", to=victim)
    wait_until(meshed(victim, honest), MESH_S, "victim and honest peer in one mesh")

    args = ["--count", "8", "--interval", "0.5", "--pause", "3", "--valid", "3"]
    log, _ = swarm.rogue("invalid", victim, *args, "--linger", "60")
    wait_until(rogue_said(log, "peer_id "), 60, "the rogue peer starts")
    rogue_id = re.search(r"peer_id (\S+)", log.read_text()).group(1)

    worst, valid_sent_before_ban = 0.0, None

    def banned() -> bool:
        nonlocal worst, valid_sent_before_ban
        worst = min(worst, victim.child_stats.get("scores", {}).get(rogue_id, 0.0))
        if rogue_id in victim.child_stats.get("banned", []):
            valid_sent_before_ban = "sent valid" in log.read_text()
            return True
        return False

    wait_until(banned, 60, f"the rogue peer banned; its log:\n{log.read_text()}")
    assert worst <= -10.0  # each invalid message cost it, before the ban
    assert valid_sent_before_ban is False
    assert victim.stats().rejected >= 3  # refused by the wire checks (then by its score)
    # each refusal is counted against its author and reason, for `sapo-node pool`
    refused = victim.refusals()
    assert {a for a, _ in refused} == {rogue_id}
    assert sum(refused.values()) == victim.stats().rejected
    sent = invalid_payloads(8)  # what the rogue sent: the same list, in order
    assert {r for _, r in refused} <= {wire.decode(p).reason for p in sent}
    assert victim.refusals() == {}  # handed over once
    wait_until(rogue_said(log, "done"), 30, "the rogue sends valid messages after the ban")
    time.sleep(1.0)  # what it sent has had time to arrive

    # none of its messages, the invalid ones nor the valid ones after the ban, reach the node
    assert [m for m in swarm.messages(victim) if m.author == rogue_id] == []
    assert rogue_id in victim.child_stats["banned"]
    # and the honest peer is still heard
    assert honest.publish(MINIMAL)
    wait_until(lambda: swarm.data_from(victim, honest) == [MINIMAL], MSG_S, "the honest peer")
    assert alive(victim) and alive(honest)


@pytest.mark.timeout(180)
def test_a_crowd_of_identities_holds_no_more_than_max_connections(swarm):
    """docs/libp2p.md#connection-limits: a node holds at most net.max_connections, of
    which at most max_connections - max_peers accepted; a crowd of strangers dialling it
    gets no more, the peer it dialled stays, and a stranger's slot comes back when it
    leaves (py-libp2p held it until the node stopped)."""
    hub = swarm.start("hub")
    node = swarm.start("node", to=hub, max_connections=3, max_peers=1, relay_reservations=0)
    wait_until(meshed(hub, node), MESH_S, "the node and the peer it dialled in one mesh")

    log, n = swarm.rogue("crowd", node, "--count", "5", "--linger", "3", "--then", "2")
    most = 0

    def crowd_gone() -> bool:
        nonlocal most
        most = max(most, sum(map(sum, node.child_stats.get("links", {}).values())))
        return swarm.rogues[n].poll() is not None

    wait_until(crowd_gone, 90, f"the crowd comes and goes; its log:\n{log.read_text()}")
    said = log.read_text()
    assert swarm.rogues[n].returncode == 0, said
    assert 0 < most <= 3, said
    # the one it dialled and 2 strangers (1 when the peer dialled it back); then 2 again
    assert 1 <= int(re.search(r"wave1 (\d+)", said).group(1)) <= 2, said
    assert int(re.search(r"wave2 (\d+)", said).group(1)) >= 1, said
    assert node.child_stats["inbound_refused"] >= 3
    assert hub.peer_id in node.child_stats["links"]
    assert hub.publish(MINIMAL)
    wait_until(lambda: swarm.data_from(node, hub) == [MINIMAL], MSG_S, "the node still hears")
    assert alive(node) and alive(hub)


class QuickPrune(Libp2pTransport):
    """A network process that lets a newcomer take the slot of a peer that gives nothing
    after a second, not a minute."""

    def _spawn(self) -> None:
        self.settings["inbound_prune_after_s"] = 1.0
        super()._spawn()


@pytest.mark.timeout(120)
def test_one_host_holds_its_share_of_slots_and_a_newcomer_elsewhere_still_gets_in(swarm):
    """docs/libp2p.md#connection-limits: identities dialling from one IP hold at most
    net.max_inbound_per_ip connections, from one /24 net.max_inbound_per_net; and when
    every slot is taken, a newcomer from elsewhere takes the slot of a peer that gives
    nothing. Loopback stands for three hosts: 127.0.0.1 and 127.0.0.2 share a /24,
    127.0.1.1 is another. Before the caps, the first crowd took every slot and the
    newcomer was refused."""
    node = swarm.start(
        "node",
        kind=QuickPrune,
        max_connections=4,  # 3 slots for connections dialled to it (max_peers kept)
        max_peers=1,
        relay_reservations=0,
        max_inbound_per_ip=2,
        max_inbound_per_net=3,
    )
    most = 0

    def inbound() -> int:
        nonlocal most
        most = max(most, node.child_stats.get("inbound", 0))
        return node.child_stats.get("inbound", 0)

    crowd = ["crowd", node, "--count", "5", "--linger", "60", "--source"]
    first, _ = swarm.rogue(*crowd, "127.0.0.1")
    same_net, _ = swarm.rogue(*crowd, "127.0.0.2")
    # 3 of the first crowd refused at its IP's share, 4 of the second at the /24's
    wait_until(
        lambda: inbound() == 3 and node.child_stats.get("inbound_capped", 0) >= 7,
        60,
        f"the crowds capped; node: {node.child_stats}",
    )
    time.sleep(1.5)  # the crowd has had its second: a peer giving nothing may be pruned
    newcomer, n = swarm.rogue(
        "crowd", node, "--count", "1", "--linger", "1", "--source", "127.0.1.1"
    )
    wait_until(
        lambda: inbound() >= 0 and swarm.rogues[n].poll() is not None,
        60,
        f"the newcomer comes and goes; its log:\n{newcomer.read_text()}",
    )
    said = newcomer.read_text()
    assert swarm.rogues[n].returncode == 0, said
    assert re.search(r"wave1 1\b", said), said  # the newcomer from another /24 got in
    assert most == 3, (most, node.child_stats)  # never more than its slots
    assert node.child_stats["inbound_capped"] >= 7
    assert node.child_stats["inbound_pruned"] >= 1  # a crowd member made room
    assert alive(node)


@pytest.mark.timeout(90)
def test_a_peer_holding_a_relay_reservation_survives_a_crowd_that_fills_the_node(swarm):
    """A private node that holds a reservation on this node's relay is reached through
    it, and says little on that connection (no mesh, no delivery): it is not pruned for
    a newcomer. Loopback stands for two hosts of one /24 (127.0.0.1, the holder's;
    127.0.0.2, a crowd's) and a newcomer elsewhere (127.0.1.1). The holder, the oldest
    connection of the /24 holding most, was the one pruned before."""
    node = swarm.start(
        "node",
        kind=QuickPrune,
        reachability="public",  # it relays: public, with relay_reservations
        relay_reservations=1,
        max_connections=4,  # 3 slots for connections dialled to it (max_peers kept)
        max_peers=1,
        max_inbound_per_ip=3,
        max_inbound_per_net=3,
    )
    holder, _ = swarm.rogue("reserve", node, "--linger", "60", "--source", "127.0.0.1")
    wait_until(rogue_said(holder, "reserved 1"), 30, f"a reservation; log:\n{holder.read_text()}")

    crowd, _ = swarm.rogue("crowd", node, "--count", "5", "--linger", "60", "--source", "127.0.0.2")
    # the holder and 2 of the crowd fill the 3 slots; the rest refused at the /24's share
    wait_until(
        lambda: (
            node.child_stats.get("inbound") == 3 and node.child_stats.get("inbound_capped", 0) >= 3
        ),
        30,
        f"the node full; node: {node.child_stats}",
    )
    time.sleep(1.5)  # each has had its second: a peer giving nothing may be pruned
    newcomer, n = swarm.rogue(
        "crowd", node, "--count", "1", "--linger", "1", "--source", "127.0.1.1"
    )
    wait_until(
        lambda: swarm.rogues[n].poll() is not None,
        30,
        f"the newcomer comes and goes; its log:\n{newcomer.read_text()}",
    )
    said = newcomer.read_text()
    assert re.search(r"wave1 1\b", said), said  # it got in
    assert node.child_stats["inbound_pruned"] == 1  # a crowd member made room
    time.sleep(0.5)  # a pruned holder sees its connection closed within 0.1 s
    assert "held 0" not in holder.read_text(), node.child_stats  # the holder stayed
    assert alive(node)


@pytest.mark.timeout(90)
def test_a_peer_a_stranger_names_at_a_loopback_port_is_dialled_by_a_local_node_only(swarm):
    """docs/libp2p.md#addresses-from-strangers: a stranger names to a node, in GossipSub's
    peer exchange (a PRUNE), a peer at a port of its choosing on 127.0.0.1, in a signed
    record, as it would name one on the node's LAN. A node that is not local (set public
    here, as a VPS is: loopback stands for its machine) dials nothing there. A local node,
    for which every peer is on this machine (the test swarms), dials it as before; so
    does the public node's library without the guard (patches.guard_peerstore)."""
    public = swarm.start("public", reachability="public")
    local = swarm.start("local")
    baits = {name: swarm.rogue("bait", node, "--linger", "5") for name, node in
             (("public", public), ("local", local))}  # fmt: skip
    trapped = {}
    for name, (log, n) in baits.items():
        wait_until(lambda n=n: swarm.rogues[n].poll() is not None, 60, f"the {name} bait ends")
        said = log.read_text()
        assert swarm.rogues[n].returncode == 0 and "bait " in said, said
        trapped[name] = int(re.search(r"^trapped (\d+)", said, re.M).group(1))
    assert trapped["public"] == 0, trapped
    assert trapped["local"] >= 1, trapped  # it took the peer exchange: the test bites
    assert alive(public) and alive(local)


@pytest.mark.timeout(150)
def test_a_banned_peer_that_left_does_not_silence_the_nodes_own_publishing(swarm):
    """py-libp2p 0.8.1 kept a banned peer's outbound queue, mesh place and
    router state, and never dropped them when the peer disconnected. GossipSub queued an
    IDONTWANT there for every message (the peer spoke meshsub 1.2) and nothing drained
    it, so after 256 publishes (half the 512-RPC queue) backpressure held each own
    publish its full 10 s: own publishing stopped, silently.

    The victim publishes 300 groups after the ban, which would put 300 RPCs (one
    IDONTWANT each) on that queue, and every one must reach the honest peer at the
    node's own pace. The wedge depends on how many RPCs are queued, never on how fast
    (no one drains that queue at any rate), so the pace is the per-author rate the
    network process already takes from the pool config, raised to 50/s on both nodes
    (the honest peer accepts the victim at that rate too): 300 groups take ~5 s instead
    of ~2.5 min at the default 2/s. Publishing is paced to that rate, so the transport's
    own queue never overflows; before the fix, ~44 groups short at the deadline."""
    fast = PoolSection(rate_per_author=50.0, burst_per_author=64)
    victim = swarm.start("victim", pool=fast)
    honest = swarm.start("honest", to=victim, pool=fast)
    wait_until(meshed(victim, honest), MESH_S, "victim and honest peer in one mesh")
    ban_and_drop_a_rogue(swarm, victim, honest=1)

    n = 300
    started = time.monotonic()
    for _ in range(n):
        assert victim.publish(MINIMAL)
        swarm.messages(honest)  # drained as they come: an inbox holds 64 per author
        time.sleep(1 / fast.rate_per_author)
    wait_until(
        lambda: len(swarm.data_from(honest, victim)) == n,
        n / fast.rate_per_author + 15,
        f"all {n} groups at the honest peer (got {len(swarm.data_from(honest, victim))}, "
        f"victim stats {victim.child_stats})",
    )
    assert time.monotonic() - started < n / fast.rate_per_author + 15
    assert victim.stats().publish_dropped == 0
    # as the network processes count them (they report every second)
    wait_until(lambda: victim.child_stats["published"] == n, 5, "all published")
    wait_until(lambda: honest.child_stats["received"] == n, 5, "all received")
    assert alive(victim) and alive(honest)


@pytest.mark.timeout(120)
def test_a_banned_peer_that_disconnected_leaves_no_state_behind(swarm):
    """After the ban and the disconnect, nothing but the ban itself is held for the
    peer: no outbound queue, mesh or fanout place, router protocol, IDONTWANT, gossip
    limits or score (the network process reports, every second, any per-peer state
    held for a peer neither connected nor in pubsub)."""
    victim = swarm.start("victim")
    honest = swarm.start("honest", to=victim)
    wait_until(meshed(victim, honest), MESH_S, "victim and honest peer in one mesh")
    rogue_id = ban_and_drop_a_rogue(swarm, victim, honest=1)

    for _ in range(3):  # three reports in a row, each after the disconnect
        stats = victim.child_stats
        assert rogue_id not in stats["stale_state"], stats["stale_state"][rogue_id]
        assert stats["stale_state"] == {}, stats["stale_state"]
        assert stats["mesh"] == 1 and stats["peers"] == 1, stats
        assert rogue_id in stats["banned"] and rogue_id not in stats["scores"]
        time.sleep(1.1)
    # the honest peer is heard, and hears the victim
    assert victim.publish(UNICODE) and honest.publish(MINIMAL)
    wait_until(lambda: swarm.data_from(victim, honest) == [MINIMAL], MSG_S, "the honest peer")
    wait_until(lambda: swarm.data_from(honest, victim) == [UNICODE], MSG_S, "the victim")
    assert alive(victim) and alive(honest)
