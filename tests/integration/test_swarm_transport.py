"""The libp2p transport for real: network child processes on loopback exchanging
messages, refusing bad ones, surviving hostile peers, restarts and crashes.

Every node listens on 127.0.0.1 only, mDNS off, in a swarm of its test's own; every
process started here is stopped in the fixture's teardown. The hostile peer is
``tests/support/rogue.py``, written straight against py-libp2p.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sapo_node.config import NetSection, PoolSection
from sapo_node.intake import peerstate, wire
from sapo_node.net import NetError, Received, identity
from sapo_node.net.process import Libp2pTransport
from tests.support.rogue import invalid_payloads

REPO = Path(__file__).resolve().parents[2]
VALID = REPO / "protocol" / "vectors" / "valid"
INVALID = REPO / "protocol" / "vectors" / "invalid"
MINIMAL = (VALID / "minimal.msgpack").read_bytes()
UNICODE = (VALID / "unicode.msgpack").read_bytes()
CUSTOM = (VALID / "custom_family.msgpack").read_bytes()
BIGGEST = (VALID / "size_limit.msgpack").read_bytes()  # 512 KiB, the largest valid message
TRUNCATED = (INVALID / "malformed_truncated.msgpack").read_bytes()


# Deadlines, not delays: generous, for a loaded machine; each wait ends as soon as it can.
MESH_S = 30.0  # a mesh forms 1-3 s after connecting (1 s heartbeat)
MSG_S = 20.0  # a message arrives in well under a second


def wait_until(pred: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Swarm:
    """Transports and rogue peers of one test, all stopped by :meth:`close`."""

    def __init__(self, root: Path, name: str) -> None:
        self.root = root
        self.name = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:40] or "test"
        self.transports: list[Libp2pTransport] = []
        self.rogues: list[subprocess.Popen] = []
        self.got: dict[int, list[Received]] = {}
        self.refusals: dict[int, dict[str, int]] = {}

    def net(self, bootstrap: list[str] = (), port: int = 0, **fields: object) -> NetSection:
        return NetSection(
            listen=[f"/ip4/127.0.0.1/tcp/{port}"],
            bootstrap=list(bootstrap),
            mdns=False,
            redial_s=1.0,
            swarm=self.name,
            **fields,
        )

    def start(
        self,
        name: str,
        *,
        to: Libp2pTransport | list[Libp2pTransport] | None = None,
        port: int = 0,
        pool: PoolSection | None = None,
        kind: type[Libp2pTransport] = Libp2pTransport,
        **net: object,
    ) -> Libp2pTransport:
        peers = [] if to is None else to if isinstance(to, list) else [to]
        bootstrap = [p.addrs[0] for p in peers]
        section = self.net(bootstrap, port, **net)
        t = kind(section, pool or PoolSection(), self.root / name)
        self.transports.append(t)
        return t

    def rogue(
        self, mode: str, target: Libp2pTransport, *args: str, at: str | None = None
    ) -> tuple[Path, int]:
        """A rogue peer aimed at ``target`` (on its topic, dialling ``at`` instead if
        given); its output goes to a file, read by tests."""
        log = self.root / f"rogue-{len(self.rogues)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.rogue", mode, at or target.addrs[0]]
                + [target.topic, *args],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.rogues.append(proc)
        return log, len(self.rogues) - 1

    def ipfs_peer(self, *args: str) -> Path:
        """A peer of IPFS's names only (``tests/support/ipfs_peer.py``); its output goes
        to a file, read by tests."""
        log = self.root / f"ipfs-{len(self.rogues)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.ipfs_peer", *args],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.rogues.append(proc)
        return log

    def messages(self, t: Libp2pTransport) -> list[Received]:
        """Everything ``t`` received so far (drains its inbox into a running list)."""
        got = self.got.setdefault(id(t), [])
        got.extend(t.received())
        return got

    def data_from(self, t: Libp2pTransport, author: Libp2pTransport) -> list[bytes]:
        return [m.data for m in self.messages(t) if m.author == author.peer_id]

    def close(self) -> None:
        for proc in self.rogues:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        for t in self.transports:
            try:
                t.close()
            finally:
                if t._proc is not None and t._proc.poll() is None:
                    t._proc.kill()
                    t._proc.wait(10)


@pytest.fixture()
def swarm(tmp_path: Path, request: pytest.FixtureRequest):
    s = Swarm(tmp_path, request.node.name)
    try:
        yield s
    finally:
        s.close()


def meshed(*transports: Libp2pTransport, peers: int = 1) -> Callable[[], bool]:
    return lambda: all(int(t.child_stats.get("mesh", 0)) >= peers for t in transports)


def alive(t: Libp2pTransport) -> bool:
    return t._proc is not None and t._proc.poll() is None and t.stats().restarts == 0


def rogue_said(log: Path, word: str) -> Callable[[], bool]:
    return lambda: word in log.read_text(errors="replace")


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


def ban_and_drop_a_rogue(swarm: Swarm, victim: Libp2pTransport, honest: int) -> str:
    """A meshsub 1.2 rogue peer joins ``victim``'s mesh, sends invalid messages until it is
    banned, then dies (SIGKILL); returns its peer id once ``victim`` is connected to its
    ``honest`` peers only."""
    args = ["--protocol", "/meshsub/1.2.0", "--count", "10", "--interval", "0.2"]
    log, n = swarm.rogue("invalid", victim, *args, "--linger", "60")
    rogue_id = rogue_line(log, "peer_id")
    wait_until(
        lambda: rogue_id in victim.child_stats.get("banned", []),
        60,
        f"the rogue peer banned; its log:\n{log.read_text()}",
    )
    swarm.rogues[n].kill()
    swarm.rogues[n].wait(10)
    wait_until(
        lambda: victim.child_stats.get("connected") == honest,
        30,
        "the victim connected to its honest peers only",
    )
    return rogue_id


@pytest.mark.timeout(240)
def test_a_ban_survives_a_network_process_restart_and_a_node_restart(swarm):
    """Issue 33: a ban is kept in the data directory (peers-net.json, with the wall-clock
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


@pytest.mark.timeout(150)
def test_a_banned_peer_that_left_does_not_silence_the_nodes_own_publishing(swarm):
    """Issue 11: py-libp2p 0.8.1 kept a banned peer's outbound queue, mesh place and
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


def rogue_line(log: Path, word: str) -> str:
    """What the rogue peer printed after ``word`` (its peer id, its address)."""
    wait_until(rogue_said(log, f"{word} "), 60, f"the rogue peer says its {word}")
    return re.search(rf"^{word} (\S+)", log.read_text(), re.M).group(1)


def watch_scores(ts: list[Libp2pTransport], seconds: float) -> tuple[dict, dict]:
    """For ``seconds``: the lowest score each node reported for each peer, and the peers
    each one banned (the network process reports both every second)."""
    worst: dict[int, dict[str, float]] = {i: {} for i in range(len(ts))}
    banned: dict[int, set[str]] = {i: set() for i in range(len(ts))}
    deadline = time.monotonic() + seconds
    while True:
        for i, t in enumerate(ts):
            for peer, score in t.child_stats.get("scores", {}).items():
                worst[i][peer] = min(score, worst[i].get(peer, 0.0))
            banned[i] |= set(t.child_stats.get("banned", []))
        if time.monotonic() > deadline:
            return worst, banned
        time.sleep(0.1)


@pytest.mark.timeout(180)
def test_copies_of_a_message_refused_for_its_authors_rate_cost_no_honest_relay(swarm):
    """A node that refuses a message for its author's rate must not blame the honest
    peers that relay it afterwards: py-libp2p answered those copies from its validation
    cache as invalid, -10 each, and soon banned the relay. Here h1 takes a fast author's
    every message (raised limits) and relays them to h2 and h3, whose small burst refuses
    most; each refused message reaches them from the author and from h1."""
    small = PoolSection(rate_per_author=1.0, burst_per_author=3)
    h1 = swarm.start("h1", pool=PoolSection(rate_per_author=1000.0, burst_per_author=1000))
    h2 = swarm.start("h2", to=h1, pool=small)
    h3 = swarm.start("h3", to=[h1, h2], pool=small)
    honest = (h1, h2, h3)
    wait_until(meshed(*honest, peers=2), MESH_S, "h1, h2 and h3 in one mesh")

    n = 30  # valid messages, as fast as the rogue can sign them: far over a burst of 3
    dial = ["--dial", h2.addrs[0], "--dial", h3.addrs[0]]
    args = [*dial, "--count", "0", "--pause", "2", "--valid", str(n), "--interval", "0"]
    log, _ = swarm.rogue("invalid", h1, *args, "--linger", "60")
    wait_until(meshed(*honest, peers=3), MESH_S, "the author in every mesh")
    wait_until(rogue_said(log, "done"), 60, f"the author publishes; its log:\n{log.read_text()}")

    # h1 takes them all; h2 and h3 refuse most for the author's rate
    wait_until(lambda: h1.child_stats.get("received", 0) == n, MSG_S, "h1 gets every message")
    for t in (h2, h3):
        wait_until(lambda t=t: t.child_stats.get("rate_limited", 0) >= n // 2, MSG_S, "limited")
        assert t.child_stats.get("received", 0) <= n // 2, t.child_stats

    # h1's copies of the refused messages cost h1 nothing, now or later
    worst, banned = watch_scores(list(honest), 3.0)
    ids = {t.peer_id for t in honest}
    assert {i: {p: s for p, s in w.items() if p in ids} for i, w in worst.items()} == {
        0: {},
        1: {},
        2: {},
    }, worst
    assert {i: b & ids for i, b in banned.items()} == {0: set(), 1: set(), 2: set()}, banned
    assert all(alive(t) for t in honest)

    # and h1 is still heard by both
    assert h1.publish(MINIMAL)
    for t in (h2, h3):
        wait_until(lambda t=t: MINIMAL in swarm.data_from(t, h1), MSG_S, "h1 still heard")


@pytest.mark.timeout(180)
def test_copies_of_a_message_of_another_version_cost_no_relay(swarm):
    """A message of a version this node does not speak is ignored, nobody's fault; nor is
    it the fault of the peers (of that version) that relay it: their copies must not be
    answered from the library's validation cache as invalid. Here a version-2 author and
    a version-2 relay (plain py-libp2p, relaying unchecked) both reach h1 and h2."""
    h1 = swarm.start("h1")
    h2 = swarm.start("h2", to=h1)
    wait_until(meshed(h1, h2), MESH_S, "h1 and h2 in one mesh")

    relay_log, _ = swarm.rogue("invalid", h1, "--dial", h2.addrs[0], "--count", "0")
    relay_addr = rogue_line(relay_log, "addr")
    wait_until(rogue_said(relay_log, "mesh"), 60, "the relay in the mesh")
    m = 10
    args = ["--dial", h2.addrs[0], "--dial", relay_addr, "--count", str(m)]
    args += ["--vector", "unsupported_version_3", "--interval", "0", "--pause", "0"]
    log, _ = swarm.rogue("invalid", h1, *args, "--linger", "60")
    wait_until(rogue_said(log, "done"), 60, f"the author publishes; its log:\n{log.read_text()}")

    for t in (h1, h2):
        wait_until(lambda t=t: t.child_stats.get("rejected", 0) >= m, MSG_S, "all ignored")
    worst, banned = watch_scores([h1, h2], 3.0)
    # neither the author nor the relay nor the other honest node lost any score
    assert worst == {0: {}, 1: {}}, worst
    assert banned == {0: set(), 1: set()}, banned
    assert all(alive(t) for t in (h1, h2))


@pytest.mark.timeout(180)
def test_an_author_cannot_frame_an_honest_relay_with_its_topic_list(swarm):
    """The author signs a message's topic list, and py-libp2p charges the relay of a
    refused message once per entry: with ``[T, T]`` (or a foreign topic before T) each
    copy refused for the author's rate cost the honest relay 10 points, and five got it
    banned. Here the author reaches the victim only through a relay of another version
    (plain py-libp2p, relaying unchecked); the victim refuses those topic lists (SPEC
    2.2, *A message's topics*) without blaming the relay."""
    victim = swarm.start("victim", pool=PoolSection(rate_per_author=1.0, burst_per_author=3))
    relay_log, _ = swarm.rogue("invalid", victim, "--count", "0", "--linger", "90")
    relay_id, relay_addr = rogue_line(relay_log, "peer_id"), rogue_line(relay_log, "addr")
    wait_until(rogue_said(relay_log, "mesh"), 60, "the relay in the victim's mesh")

    n = 16  # valid messages, as fast as the author signs them: far over a burst of 3
    t = victim.topic
    args = ["--count", "0", "--valid", str(n), "--interval", "0.05", "--linger", "60"]
    args += ["--topics", f"{t},{t}", "--topics", f"other/topic,{t}"]
    log, _ = swarm.rogue("invalid", victim, *args, at=relay_addr)
    author_id = rogue_line(log, "peer_id")
    wait_until(rogue_said(log, "done"), 60, f"the author publishes; its log:\n{log.read_text()}")

    worst, banned = watch_scores([victim], 3.0)
    assert worst[0].get(relay_id, 0.0) == 0.0, worst  # the relay lost nothing
    assert banned == {0: set()}, banned

    def refused() -> dict[str, int]:
        got = swarm.refusals.setdefault(id(victim), {})
        for (author, reason), k in victim.refusals().items():
            assert author == author_id, (author, reason)
            got[reason] = got.get(reason, 0) + k
        return got

    want = {"topic_repeated": n // 2, "topic_foreign": n // 2}
    wait_until(lambda: refused() == want, MSG_S, f"every message refused: {refused()}")
    assert [m for m in swarm.messages(victim) if m.author == author_id] == []
    assert alive(victim)


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


# --- restarts ------------------------------------------------------------------------


@pytest.mark.timeout(180)
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
