"""Shard topics (protocol/SPEC.md, section 2.2; docs/scale.md): which shards a peer joins,
deterministic and balanced, and the swarm file that sets their number."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sapo_node.config import ConfigError, NetSection, load_config
from sapo_node.intake import wire
from sapo_node.net import identity
from sapo_node.swarmfile import load_swarm_file
from tests.unit.test_swarmfile import SWARM, write

peers = st.binary(min_size=1, max_size=64)
counts = st.integers(min_value=1, max_value=wire.MAX_SHARDS)


def test_one_shard_is_the_topic_of_before_shards() -> None:
    assert wire.shard_topic("demo", 0, 1) == "sapo/demo/rollouts/v2" == wire.topic("demo")
    assert wire.shard_topics("demo", b"peer", 1, 2) == ["sapo/demo/rollouts/v2"]
    assert NetSection().shards == 1  # the default: today's single topic
    assert wire.shard_topic("demo", 63, 64) == "sapo/demo/rollouts/v2/shard-63-of-64"
    for bad in ((64, 64), (-1, 4), (0, 0), (0, wire.MAX_SHARDS + 1)):
        with pytest.raises(ValueError):
            wire.shard_topic("demo", *bad)


@settings(max_examples=200, deadline=None)
@given(peer=peers, shards=st.integers(1, 256), joined=st.integers(1, 64))
def test_a_peers_shards_are_deterministic_distinct_and_in_range(
    peer: bytes, shards: int, joined: int
) -> None:
    got = wire.shards_of(peer, shards, joined)
    assert got == wire.shards_of(peer, shards, joined)
    assert len(got) == len(set(got)) == min(joined, shards)
    assert all(0 <= i < shards for i in got)
    # joining more shards keeps the ones joined before (its home shard first)
    assert wire.shards_of(peer, shards, joined + 1)[: len(got)] == got


@settings(max_examples=12, deadline=None)
@given(salt=st.binary(max_size=8), shards=st.integers(2, 16), joined=st.integers(1, 3))
def test_shards_are_joined_evenly_whoever_the_peers_are(
    salt: bytes, shards: int, joined: int
) -> None:
    """Every shard gets its share k/S of 1,200 peers, within 5 standard deviations."""
    n = 1200
    members = Counter(
        i
        for j in range(n)
        for i in wire.shards_of(
            hashlib.sha256(salt + j.to_bytes(4, "big")).digest(), shards, joined
        )  # fmt: skip
    )
    p = min(joined, shards) / shards
    mean, sd = n * p, (n * p * (1 - p)) ** 0.5
    assert set(members) == set(range(shards))
    assert all(abs(members[i] - mean) <= 5 * sd + 1 for i in range(shards)), members


def test_a_peer_ids_shards_are_those_of_its_bytes(tmp_path: Path) -> None:
    peer = identity.peer_id(identity.load_or_create(tmp_path))
    from libp2p.peer.id import ID

    assert identity.id_bytes(peer) == ID.from_base58(peer).to_bytes()


def test_the_swarm_file_sets_the_shards_and_a_user_may_not_change_them(tmp_path: Path) -> None:
    plain = write(tmp_path / "plain.toml", SWARM)
    assert load_swarm_file(plain).swarm.shards == 1
    flags = {"net": {"swarm_file": plain}}
    assert load_config(overrides=flags, environ={}).net.shards == 1
    sharded = write(
        tmp_path / "s.toml", SWARM.replace('name = "demo"', 'name = "demo"\nshards = 8')
    )
    flags = {"net": {"swarm_file": sharded}}
    cfg = load_config(overrides=flags, environ={})
    assert (cfg.net.shards, cfg.net.shards_joined) == (8, 2)
    joined = {"net": {"swarm_file": sharded, "shards_joined": 3}}
    assert load_config(overrides=joined, environ={}).net.shards_joined == 3
    with pytest.raises(ConfigError, match="net.shards is 4 but swarm file .* says 8"):
        load_config(overrides={"net": {"swarm_file": sharded, "shards": 4}}, environ={})
    assert load_config(overrides={"net": {"swarm_file": sharded, "shards": 8}}, environ={})
    for bad, needle in (
        (SWARM.replace('name = "demo"', 'name = "demo"\nshards = 0'), "swarm.shards"),
        (SWARM.replace('name = "demo"', 'name = "demo"\nshards = "8"'), "swarm.shards"),
        (SWARM + "[recommended.net]\nshards = 8\n", "recommended.net.shards"),
    ):
        path = write(tmp_path / "bad.toml", bad)
        with pytest.raises(ConfigError, match=needle):
            load_config(overrides={"net": {"swarm_file": path}}, environ={})


def test_a_swarm_file_changing_s_names_the_count_before(tmp_path: Path) -> None:
    changing = write(
        tmp_path / "s.toml",
        SWARM.replace('name = "demo"', 'name = "demo"\nshards = 16\nshards_before = 8'),
    )
    cfg = load_config(overrides={"net": {"swarm_file": changing}}, environ={})
    assert (cfg.net.shards, cfg.net.shards_before) == (16, 8)
    assert load_config(environ={}).net.shards_before == 0  # no change under way
    for bad, needle in (
        (
            SWARM.replace('name = "demo"', 'name = "demo"\nshards = 8\nshards_before = 8'),
            "leave it out",
        ),
        (SWARM + "[recommended.net]\nshards_before = 8\n", "recommended.net.shards_before"),
    ):
        path = write(tmp_path / "bad.toml", bad)
        with pytest.raises(ConfigError, match=needle):
            load_config(overrides={"net": {"swarm_file": path}}, environ={})


def test_identity_prints_a_nodes_shards_in_a_sharded_swarm(tmp_path: Path, capsys) -> None:
    from sapo_node.cli import main

    argv = ["identity", "--data-dir", str(tmp_path), "--listen", "/ip4/127.0.0.1/tcp/4141"]
    main(argv)
    assert "shards:" not in capsys.readouterr().out  # one topic: nothing to say
    config = write(tmp_path / "c.toml", "[net]\nshards = 64\nshards_joined = 3\n")
    main([*argv, "--config", str(config)])
    peer = identity.peer_id(identity.load_or_create(tmp_path))
    joined = ", ".join(map(str, wire.shards_of(identity.id_bytes(peer), 64, 3)))
    assert f"shards: {joined} of 64" in capsys.readouterr().out


def test_a_message_goes_on_one_topic_or_on_two_of_different_counts_one_joined() -> None:
    """SPEC 2.2, *A message's topics*: the lists honest nodes publish pass, also while S
    changes (one topic of S and one of S0, the receiver on either or both); a repeated
    topic, a foreign one, two of one count or none joined are refused."""
    base = wire.topic("demo")
    s0, s1 = wire.shard_topic("demo", 0, 2), wire.shard_topic("demo", 1, 2)
    old_s0 = wire.shard_topic("demo", 3, 4)
    assert wire.topics_refusal([base], base, [base]) is None
    assert wire.topics_refusal([s0, base], base, [s0]) is None  # a node on the new file
    assert wire.topics_refusal([s0, base], base, [base]) is None  # one on the old file
    assert wire.topics_refusal([s1, old_s0], base, [s0, s1, old_s0]) is None
    assert wire.topics_refusal([base, base], base, [base]) == "topic_repeated"
    assert wire.topics_refusal([s0, s0], base, [s0]) == "topic_repeated"
    assert wire.topics_refusal(["other/topic", base], base, [base]) == "topic_foreign"
    assert wire.topics_refusal([wire.topic("other"), base], base, [base]) == "topic_foreign"
    assert wire.topics_refusal([f"{base}/shard-01-of-2", base], base, [base]) == "topic_foreign"
    assert wire.topics_refusal([f"{base}/shard-2-of-2"], base, [base]) == "topic_foreign"
    assert wire.topics_refusal([f"{base}/shard-0-of-1"], base, [base]) == "topic_foreign"
    assert wire.topics_refusal([s0, s1], base, [s0, s1]) == "topic_same_count"
    assert wire.topics_refusal([s1], base, [s0]) == "topic_not_joined"
    assert wire.topics_refusal([], base, [base]) == "topic_count"
    assert wire.topics_refusal([s0, base, old_s0], base, [s0]) == "topic_count"


def test_a_forwarder_is_charged_once_per_message_whatever_its_topic_list() -> None:
    """py-libp2p calls on_invalid_message once per entry of the message's topic list:
    the scorer takes one charge per message, on a topic this node joined, none for a
    refusal that is nobody's fault, and the parent's penalties as they come."""
    from libp2p.peer.id import ID

    from sapo_node.net.pubsub import SwarmScorer, score_params

    home, other = wire.shard_topic("demo", 0, 2), wire.shard_topic("demo", 1, 2)
    scorer = SwarmScorer(score_params(), [home, other])
    relay, author = ID(b"\x00\x01relay"), ID(b"\x00\x01author")
    scorer.judge(relay)
    for topic in (home, home, other):  # what the library does for [home, home, other]
        scorer.on_invalid_message(relay, topic)
    assert dict(scorer.invalid_messages[relay]) == {home: 1.0}
    scorer.judge(relay)
    scorer.on_invalid_message(relay, "not/joined")  # lands on the home topic
    assert dict(scorer.invalid_messages[relay]) == {home: 2.0}
    scorer.judge(relay)
    scorer.excused = True  # the validator ignored it (a rate limit)
    scorer.on_invalid_message(relay, home)
    scorer.on_invalid_message(relay, other)
    assert dict(scorer.invalid_messages[relay]) == {home: 2.0}
    scorer.charge(relay, home)  # the parent's penalty, outside any message's check
    scorer.charge(author, other)
    assert scorer.invalid_messages[relay][home] == 3.0
    assert dict(scorer.invalid_messages[author]) == {other: 1.0}
