"""A relay is not charged for what its authors did: copies of a message refused for its
author's rate or version, and an author's topic list, cost an honest relay nothing.
"""

from __future__ import annotations

import time

import pytest

from sapo_node.config import PoolSection
from sapo_node.net.process import Libp2pTransport
from tests.support.transports import (
    MESH_S,
    MINIMAL,
    MSG_S,
    alive,
    meshed,
    rogue_line,
    rogue_said,
    wait_until,
)


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
