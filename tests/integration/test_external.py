"""External groups: what one node shares, another re-checks, re-scores and trains on."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import msgpack
import pytest

from sapo_node.build import build_node
from sapo_node.config import load_config
from sapo_node.intake import wire
from sapo_node.net.memory import MemoryHub
from sapo_node.node import Node
from sapo_node.tasks import TaskRef, generator_of, make_task
from tests.support.nodes import sevens_overrides

SEVENS = "tests.support.families:Sevens"


def _node(model_dir: Path, data_dir: Path, seed: int, local: int, external: int, **defence) -> Node:
    overrides = sevens_overrides(
        model_dir,
        data_dir,
        node={"seed": seed},
        generation={"max_new_tokens": 6 if not defence else 40, "completions_per_task": 4},
        train={"lr": 1e-3, "local_groups": local, "external_groups": external},
        # one peer fills all J here (test_defence caps it)
        defence={"max_author_share": 1.0, **defence},
    )
    return build_node(load_config(overrides=overrides, environ={}))


@pytest.fixture()
def receiver(tiny_model_dir: Path, tmp_path: Path):
    node = _node(tiny_model_dir, tmp_path / "b", seed=2, local=2, external=2)
    yield node
    node.close()


def _shared(index: int, completions: tuple[str, ...]) -> wire.RolloutGroup:
    ref = TaskRef.make(SEVENS, {}, 99, index)
    return wire.RolloutGroup(
        ref,
        generator_of(SEVENS),
        make_task(ref).question,
        completions,
        model="tiny",
        round=0,
        created_ms=int(time.time() * 1000),
    )


def _send(node: Node, group: wire.RolloutGroup, author: str = "peer-a") -> str:
    return node.receive(wire.encode(group), author).reason


def test_received_groups_are_rescored_and_trained_on(receiver: Node) -> None:
    good = _shared(0, ("777", "abc", "7a7", "xyz"))
    verdict = receiver.receive(wire.encode(good), "peer-a")
    assert verdict.outcome == "accepted"
    assert verdict.item.rewards == (1.0, 0.0, pytest.approx(2 / 3), 0.0)
    assert _send(receiver, _shared(1, ("7", "7", "7", "7"))) == "accepted"  # no signal
    record = receiver.run_round(0)
    # paper sampling: the group without signal is skipped, one slot is filled locally
    assert record["groups/external"] == 1
    assert record["groups/local"] == 3
    assert record["train/sequences"] >= 4


def test_peers_lies_are_refused(receiver: Node) -> None:
    honest = _shared(3, ("777", "x", "y", "z"))
    wrong_question = dataclasses.replace(honest, question="Write eights (3).")
    assert _send(receiver, wrong_question) == "question_mismatch"
    unknown = dataclasses.replace(honest, ref=TaskRef.make("no_such_family", {}, 1, 0))
    assert _send(receiver, unknown) == "unknown_family"
    hostile_module = dataclasses.replace(honest, ref=TaskRef.make("os:system", {}, 1, 0))
    assert _send(receiver, hostile_module) == "unknown_family"
    for count in (1, 65):
        data = msgpack.packb({**honest.to_wire(), "completions": ["7"] * count})
        assert receiver.receive(data, "peer-a").reason == "bad_count"
    assert len(receiver.pool) == 0


def test_two_nodes_share_through_the_wire_and_a_restart_keeps_the_pool(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    hub = MemoryHub()
    listener = hub.join("b")
    sender = _node(tiny_model_dir, tmp_path / "a", seed=1, local=3, external=0)
    sender.transport = hub.join("a")
    try:
        record = sender.run_round(0)
        assert record["net/published"] == 3 and record["net/peers"] == 1
    finally:
        sender.close()
    outbox = [m.data for m in listener.received()]
    assert len(outbox) == 3
    receiver = _node(tiny_model_dir, tmp_path / "b", seed=2, local=1, external=3)
    try:
        verdicts = [receiver.receive(m, "a") for m in outbox]
        assert [v.outcome for v in verdicts] == ["accepted"] * 3
        assert verdicts[0].item.group.model == tiny_model_dir.name  # not the local path
    finally:
        receiver.close()
    receiver = _node(tiny_model_dir, tmp_path / "b", seed=2, local=1, external=3)
    try:
        assert len(receiver.pool) == 3 and receiver.pool.counts()["a"] == {"accepted": 3}
        assert receiver.receive(outbox[0], "a").reason == "duplicate"  # remembered too
        receiver.pool.sampling = "uniform"
        record = receiver.run_round(0)
        assert record["groups/external"] == 3 and record["groups/local"] == 1
        assert len(receiver.pool) == 0
    finally:
        receiver.close()


def test_a_full_disk_stops_the_node_cleanly_with_its_state_saved(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """The third round trains, then cannot be recorded: the node stops with the failure,
    and the checkpoint is that of the two rounds recorded, not the third round's weights
    labelled round 2 (issue 47: nothing saves a round part-way)."""
    node = _node(tiny_model_dir, tmp_path / "c", seed=3, local=1, external=0)
    node.config.node.checkpoint_every = 1
    calls = {"n": 0}
    real_append = node.metrics.append

    def append(record):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        real_append(record)

    monkeypatch.setattr(node.metrics, "append", append)
    try:
        assert node.run() == 2
    finally:
        node.close()
    assert "No space left on device" in node.failure
    root = tmp_path / "c" / "checkpoints"
    assert (root / "LATEST").read_text().strip() == "round-000002"
    state = json.loads((root / "round-000002" / "state.json").read_text())
    assert state["metrics_offset"] == (tmp_path / "c" / "metrics.jsonl").stat().st_size


def test_out_of_memory_stops_with_a_hint(tiny_model_dir: Path, tmp_path: Path, monkeypatch):
    node = _node(tiny_model_dir, tmp_path / "d", seed=4, local=1, external=0)
    node.config.node.rounds = 5

    def oom(*args, **kwargs):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: "
            "can't allocate memory: you tried to allocate 123456789 bytes"
        )

    monkeypatch.setattr(node.trainer, "step", oom)
    try:
        assert node.run() == 0
    finally:
        node.close()
    assert "out of memory in round 0" in node.failure and "--lora" in node.failure


PRIVATE = "tests.support.families:PrivateData"


@pytest.mark.parametrize("accept", [False, True])
def test_unregenerable_custom_tasks_are_ignored_unless_configured(
    tiny_model_dir: Path, tmp_path: Path, accept: bool
) -> None:
    overrides = sevens_overrides(
        tiny_model_dir,
        tmp_path,
        tasks={"families": [{"name": SEVENS}, {"name": PRIVATE, "weight": 1e-9}]},
        pool={"accept_unregenerable": accept},
    )
    node = build_node(load_config(overrides=overrides, environ={}))
    try:
        foreign = dataclasses.replace(
            _shared(0, ("42", "41", " 42 ", "x")),
            ref=TaskRef.make(PRIVATE, {}, 1, 14),
            generator="private-data 1",
            question="Say 42.",
            answer="42",
            metadata='{"source":"peer"}',
        )
        verdict = node.receive(wire.encode(foreign), "peer-p")
        if accept:  # scored against the answer the peer attached
            assert verdict.outcome == "accepted"
            assert verdict.item.rewards == (1.0, 0.0, 1.0, 0.0)
        else:
            assert (verdict.outcome, verdict.reason) == ("ignored", "cannot_regenerate")
        # an item this node holds is regenerated and its answer checked, switch or not
        lie = dataclasses.replace(foreign, ref=TaskRef.make(PRIVATE, {}, 1, 3), question="Say 9.")
        assert node.receive(wire.encode(lie), "peer-p").reason == "answer_mismatch"
    finally:
        node.close()


def test_a_pool_that_cannot_write_or_read_loses_no_round(receiver: Node, monkeypatch) -> None:
    import sqlite3

    def full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(type(receiver.pool), "add", full)
    verdict = receiver.receive(wire.encode(_shared(5, ("777", "x", "7", "y"))), "peer-a")
    assert (verdict.outcome, verdict.reason) == ("ignored", "pool_unavailable")
    monkeypatch.setattr(type(receiver.pool), "sample", full)
    record = receiver.run_round(0)  # J slots are filled with own groups
    assert record["groups/external"] == 0 and record["groups/local"] == 4


def test_the_round_takes_in_what_the_transport_received_and_penalises_liars(
    receiver: Node,
) -> None:
    hub = MemoryHub()
    receiver.transport = hub.join("me")
    honest, liar = hub.join("honest"), hub.join("liar")
    honest.publish(wire.encode(_shared(5, ("777", "abc", "7a7", "xyz"))))
    liar.publish(wire.encode(dataclasses.replace(_shared(6, ("7", "x")), question="Lie.")))
    liar.publish(b"\xc1 not msgpack")
    record = receiver.run_round(0)
    assert record["net/received"] == 3 and record["net/accepted"] == 1
    assert record["net/rejected"] == 2 and record["groups/external"] == 1
    assert receiver.transport.penalised == ["liar", "liar"]
    assert receiver.pool.counts()["liar"] == {"question_mismatch": 1, "malformed": 1}
    assert record["net/peers"] == 2 and record["net/published"] == 3
    assert [m.author for m in honest.received()].count("me") == 3  # its own groups, shared


def test_publish_choice_signal_shares_only_groups_with_signal(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    overrides = sevens_overrides(
        tiny_model_dir,
        tmp_path / "n",
        generation={"max_new_tokens": 6, "completions_per_task": 4},
        train={"local_groups": 4, "external_groups": 0},
        net={"publish": "signal"},
    )
    node = build_node(load_config(overrides=overrides, environ={}))
    hub = MemoryHub()
    node.transport, listener = hub.join("n"), hub.join("l")
    try:  # a round with groups of both kinds: some shared, some held back
        for r in range(8):
            record = node.run_round(r)
            shared = [wire.decode(m.data) for m in listener.received()]  # this round's
            if 0 < record["groups/local_signal"] < record["groups/local"]:
                break
        else:
            pytest.fail("no round had groups both with and without signal")
    finally:
        node.close()
    assert record["net/published"] == len(shared) == record["groups/local_signal"]
    assert all(len(set(g.completions)) > 1 for g in shared)  # equal texts score equal


def test_a_peer_reward_is_earned_only_by_the_text_that_is_trained(receiver: Node) -> None:
    # The receiver trains 6 tokens (one character each in the tiny tokenizer): sevens
    # beyond them must not earn a reward that the first six characters then collect.
    padded = _shared(20, ("abcdef" + "7" * 50, "777", "ab7", "xyz"))
    verdict = receiver.receive(wire.encode(padded), "peer-a")
    assert verdict.outcome == "accepted"
    assert verdict.item.rewards == (0.0, 1.0, pytest.approx(1 / 3), 0.0)
    group = receiver._as_group(verdict.item)
    assert group.texts[0] == "abcdef" and len(group.completion_ids[0]) == 6
    assert not group.finished[0]  # cut here: no end token


@pytest.mark.parametrize("cut", [True, False])
def test_text_after_a_peers_last_answer_is_cut_before_it_is_scored(
    tiny_model_dir: Path, tmp_path: Path, cut: bool
) -> None:
    """With the defences' cut, what follows a peer's last answer neither trains nor earns
    a reward (here, sevens after it would raise the score), and the completion ends there."""
    node = _node(tiny_model_dir, tmp_path, seed=2, local=2, external=2, cut_after_answer=cut)
    try:
        texts = ("7<answer>7</answer>777", "<answer>a</answer>", "no tags 7", "ab")
        shared = dataclasses.replace(_shared(22, texts), unfinished=frozenset({0}))
        verdict = node.receive(wire.encode(shared), "peer-a")
        group = node._as_group(verdict.item)
        first = "7<answer>7</answer>" if cut else texts[0]
        assert group.texts == [first, *texts[1:]]
        assert verdict.item.rewards[0] == pytest.approx(first.count("7") / len(first))
        assert group.finished[0] == cut  # cut: it ends at its answer, with the end token
        assert (group.completion_ids[0][-1] == node.policy.end_id) == cut
    finally:
        node.close()


def test_only_finished_peer_completions_end_with_the_end_token(receiver: Node) -> None:
    shared = dataclasses.replace(
        _shared(21, ("77", "7a", "ab", "a7")), unfinished=frozenset({1, 3})
    )
    verdict = receiver.receive(wire.encode(shared), "peer-a")
    group = receiver._as_group(verdict.item)
    end = receiver.policy.end_id
    assert [ids[-1] == end for ids in group.completion_ids] == [True, False, True, False]
    assert group.finished == [True, False, True, False]


def test_a_round_records_the_age_of_the_external_groups_it_trained_on(receiver: Node) -> None:
    old = dataclasses.replace(
        _shared(22, ("777", "x", "y", "z")), created_ms=int(time.time() * 1000) - 120_000
    )
    assert _send(receiver, old) == "accepted"
    record = receiver.run_round(0)
    assert record["groups/external"] == 1
    assert 119 <= record["groups/external_age_s"] <= record["groups/external_age_s_max"] < 200


def test_groups_older_than_the_pool_keeps_are_refused(receiver: Node) -> None:
    stale = dataclasses.replace(
        _shared(23, ("777", "x", "y", "z")),
        created_ms=int((time.time() - receiver.pool.max_age_s - 5) * 1000),
    )
    assert receiver.pool.max_age_s == 300.0  # the default: fresh over stale
    assert _send(receiver, stale) == "too_old"


def _created(group: wire.RolloutGroup, skew_s: float) -> wire.RolloutGroup:
    """``group`` as made by a peer whose clock is ``skew_s`` ahead (negative: behind)."""
    return dataclasses.replace(group, created_ms=int((time.time() + skew_s) * 1000))


@pytest.mark.parametrize(
    ("skew_s", "reason"),
    [
        (120.0, "accepted"),  # 2 minutes ahead: within max_clock_skew_s (300 s)
        (-120.0, "accepted"),  # 2 minutes behind: 120 s old, within max_age_s (300 s)
        (300.0 + 60.0, "from_the_future"),  # beyond the skew allowed ahead: ignored
        (-(300.0 + 60.0), "too_old"),  # older than the pool keeps groups: ignored
    ],
)
def test_a_peer_clock_ahead_or_behind_is_accepted_within_the_spec_tolerance(
    receiver: Node, skew_s: float, reason: str
) -> None:
    """protocol/SPEC.md §5 step 7: a receiver takes a group created up to
    ``pool.max_clock_skew_s`` (300 s) ahead of its own clock and up to ``pool.max_age_s``
    (300 s) behind it; beyond, ``from_the_future`` or ``too_old``, both ignored (whose
    clock is wrong, the receiver cannot tell)."""
    assert receiver.intake.max_clock_skew_s == 300.0 and receiver.pool.max_age_s == 300.0
    verdict = receiver.receive(wire.encode(_created(_shared(30, ("777", "x")), skew_s)), "p")
    assert verdict.reason == reason
    outcome = {"accepted": "accepted", "from_the_future": "ignored", "too_old": "ignored"}
    assert verdict.outcome == outcome[reason]


def test_a_receiver_whose_clock_is_behind_says_so_and_blames_nobody(receiver: Node) -> None:
    """Groups from one peer beyond the skew are that peer's clock; from several, this
    node's own is likely behind: it warns once, and no honest peer is blamed for it."""
    import structlog

    ahead = _created(_shared(32, ("777", "x")), 400.0)
    with structlog.testing.capture_logs() as logs:
        verdicts = [receiver.receive(wire.encode(ahead), "peer-a") for _ in range(2)]
        warned_after_one = [e for e in logs if "clock looks behind" in e["event"]]
        for peer in ("peer-b", "peer-c"):
            verdicts.append(receiver.receive(wire.encode(ahead), peer))
    assert {(v.outcome, v.reason) for v in verdicts} == {("ignored", "from_the_future")}
    assert not warned_after_one
    warnings = [e for e in logs if "clock looks behind" in e["event"]]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"
    assert warnings[0]["peers"] == 2


def test_every_peer_group_is_accounted_for_by_outcome(receiver: Node) -> None:
    """Issue 33: a group too old on arrival (``too_old``), a duplicate and a pooled group
    that aged out unused (``expired``) are counted apart, per peer (``sapo-node pool``,
    ``/metrics``) and per round (``peer_groups/<outcome>``)."""
    from sapo_node.ops.prometheus import metric_families
    from sapo_node.ops.status import Status

    fresh = _shared(31, ("777", "x", "y", "z"))
    assert _send(receiver, _created(fresh, -400.0)) == "too_old"
    assert _send(receiver, fresh) == "accepted"
    assert _send(receiver, fresh) == "duplicate"
    later = time.time() + receiver.pool.max_age_s + 10
    receiver.pool.clock = lambda: later  # the accepted group ages out before any round
    record = receiver.run_round(0)
    assert record["groups/external"] == 0
    outcomes = {"too_old": 1, "accepted": 1, "duplicate": 1, "expired": 1}
    assert {k: v for k, v in record.items() if k.startswith("peer_groups/")} == {
        f"peer_groups/{k}": v for k, v in outcomes.items()
    }
    assert receiver.pool.counts() == {"peer-a": outcomes}
    families = metric_families(Status(receiver.config, node=receiver).facts())
    (groups,) = [f for f in families if f.name == "sapo_peer_groups"]
    assert {s.labels["outcome"]: s.value for s in groups.samples if s.name.endswith("_total")} == (
        outcomes
    )
    assert not any(k.startswith("peer_groups/") for k in receiver.run_round(1))  # nothing new


def _use(model_dir: Path, data_dir: Path, use: str) -> Node:
    overrides = sevens_overrides(
        model_dir,
        data_dir,
        node={"seed": 2},
        generation={"max_new_tokens": 24, "completions_per_task": 4},
        train={"lr": 1e-3, "local_groups": 2, "external_groups": 2, "external_use": use},
        defence={"max_author_share": 1.0},
    )
    return build_node(
        load_config(overrides=overrides, environ={}), transport=MemoryHub().join("me")
    )


def test_with_external_use_tasks_a_node_trains_only_its_own_text_on_peers_tasks(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    node = _use(tiny_model_dir, tmp_path, "tasks")
    try:
        peer_texts = ("777777", "abcdef", "7a7a7a", "xyzxyz")
        shared = _shared(30, peer_texts)
        assert _send(node, shared) == "accepted"
        import sapo_node.node as node_module

        trained: list = []
        build = node_module.training_set
        monkeypatch.setattr(
            node_module,
            "training_set",
            lambda gs, scale, **kw: trained.extend(gs) or build(gs, scale, **kw),
        )
        published: list[bytes] = []
        monkeypatch.setattr(node.transport, "publish", lambda data: published.append(data) or True)
        record = node.run_round(0)
        assert record["groups/practice"] == 1 and record["groups/local"] == 3  # J short: own fill
        assert record["reward/practice_mean"] is not None
        # its own completions on the peer's task were generated, scored and shared ...
        groups = [wire.decode(d) for d in published]
        assert [g.ref for g in groups].count(shared.ref) == 1
        mine = next(g for g in groups if g.ref == shared.ref)
        assert mine.completions != peer_texts
        # ... and the round's training set holds the task with those completions: no
        # peer's text reached the trainer, not even as context
        assert len(trained) == 4
        practised = [g for g in trained if g.task.ref == shared.ref]
        assert len(practised) == 1 and practised[0].origin == "local"
        assert tuple(practised[0].texts) == mine.completions
        assert not any(t in peer_texts for g in trained for t in g.texts)
    finally:
        node.close()


def test_with_external_use_answers_only_a_peers_verified_answer_is_left(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    node = _use(tiny_model_dir, tmp_path, "answers")
    try:
        texts = ("so 7<answer>7</answer> 77", "<answer>a</answer>", "no tags 7", "ab")
        verdict = node.receive(wire.encode(_shared(31, texts)), "peer-a")
        assert verdict.outcome == "accepted"
        group = node._as_group(verdict.item)
        assert group.texts == ["<answer>7</answer>", "<answer>a</answer>", "", ""]
        assert group.finished == [True] * 4  # each ends with the end of turn
        # scored as it trains: one seven in the first text, none in the others
        assert verdict.item.rewards[0] == pytest.approx(1 / len("<answer>7</answer>"))
        assert verdict.item.rewards[1:] == (0.0, 0.0, 0.0)
    finally:
        node.close()


def test_a_node_that_takes_nothing_from_peers_does_not_check_their_messages(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    overrides = sevens_overrides(
        tiny_model_dir,
        tmp_path,
        generation={"max_new_tokens": 6, "completions_per_task": 4},
        train={"local_groups": 4, "external_groups": 0},
    )
    hub = MemoryHub()
    peer = hub.join("peer")
    node = build_node(load_config(overrides=overrides, environ={}), transport=hub.join("me"))
    try:
        peer.publish(wire.encode(_shared(32, ("777", "abc", "7a7", "xyz"))))
        record = node.run_round(0)
        assert record["net/received"] == 1 and record["net/accepted"] == 0
        assert len(node.pool) == 0  # J = 0: nothing is scored, nothing pooled
        assert record["compute_s"] > 0
    finally:
        node.close()
        peer.close()
