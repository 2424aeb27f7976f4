"""What sharing did, per round, in metrics.jsonl (issue 28): the peers' groups' reward, own
and peers' groups by outcome, the gradient clip and the age of the peers' groups in rounds.

Real nodes on the tiny model, in process over the in-memory hub; every figure is recomputed
from the groups the round actually trained on (captured on their way to the trainer)."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import pytest

from sapo_node import node as node_module
from sapo_node.build import build_node
from sapo_node.config import load_config
from sapo_node.groups import Group
from sapo_node.intake import wire
from sapo_node.metrics import MetricsLog, read_metrics
from sapo_node.net.memory import MemoryHub
from sapo_node.node import Node
from sapo_node.tasks import TaskRef, generator_of, make_task
from tests.support.nodes import sevens_overrides

SEVENS = "tests.support.families:Sevens"
THRESHOLD = 0.999  # tasks.correct_threshold's default: what counts as correct
KINDS = ("all_wrong", "all_right", "signal")


def _node(
    model_dir: Path, data_dir: Path, seed: int, defence: bool = True, whole: bool = False, **train
) -> Node:
    """A node of the sevens swarm; ``whole``: peers' completions train whole (no
    ``answer_only``), so that every completion drawn teaches something."""
    overrides = sevens_overrides(
        model_dir,
        data_dir,
        node={"seed": seed},
        generation={"max_new_tokens": 8, "completions_per_task": 8},  # ~half with a 7
        train={"lr": 1e-2, "local_groups": 3, "external_groups": 2, **train},
        pool={"sampling": "uniform"},  # groups without signal are taken too
        defence={  # one peer may fill all J
            "enabled": defence,
            "max_author_share": 1.0,
            **({"answer_only": False, "teach_first_choices": False} if whole else {}),
        },
    )
    return build_node(load_config(overrides=overrides, environ={}))


@pytest.fixture()
def trained(monkeypatch) -> list[list[Group]]:
    """Each round's groups as passed to the trainer (own, then the peers' as screened)."""
    seen: list[list[Group]] = []
    real = node_module.training_set

    def spy(groups, scale, **kwargs):
        seen.append(list(groups))
        return real(groups, scale, **kwargs)

    monkeypatch.setattr(node_module, "training_set", spy)
    return seen


def _kind(rewards: list[float]) -> str:
    """The outcome, written out independently of ``Group.outcome``."""
    if max(rewards) != min(rewards):
        return "signal"
    return "all_right" if all(x >= THRESHOLD for x in rewards) else "all_wrong"


def _expected(groups: list[Group], r: int) -> dict:
    own = [g for g in groups if g.origin == "local"]
    theirs = [g for g in groups if g.origin != "local"]
    out: dict = {}
    for side, gs in (("groups/local", own), ("groups/external", theirs)):
        out[side] = len(gs)
        for kind in KINDS:
            out[f"{side}_{kind}"] = sum(_kind(g.rewards) == kind for g in gs)
    rewards = [x for g in theirs for x in g.rewards]
    out["reward/external_mean"] = sum(rewards) / len(rewards) if rewards else None
    ages = [r - g.pooled.received_round for g in theirs]
    out["groups/external_age_rounds"] = sum(ages) / len(ages) if ages else None
    out["groups/external_age_rounds_max"] = max(ages) if ages else None
    return out


def test_two_sharing_nodes_record_what_they_trained_on(
    tiny_model_dir: Path, tmp_path: Path, trained: list[list[Group]]
) -> None:
    hub = MemoryHub()
    clips = {"a": 1e-6, "b": 1e6}  # a: every step clipped; b: none
    nodes = {
        name: _node(tiny_model_dir, tmp_path / name, seed, grad_clip=clips[name])
        for name, seed in (("a", 1), ("b", 2))
    }
    for name, n in nodes.items():
        n.transport = hub.join(name)
    rows: dict[str, list[dict]] = {"a": [], "b": []}
    try:
        for r in range(4):
            for name, n in nodes.items():
                before = len(trained)
                rec = n.run_round(r)
                assert len(trained) == before + 1
                rows[name].append((rec, trained[-1]))
                n.metrics.append(rec)  # JSON without NaN: every fact serialises
                n.round = r + 1
        for n in nodes.values():
            assert [x["round"] for x in read_metrics(n.metrics.path)] == [0, 1, 2, 3]
    finally:
        for n in nodes.values():
            n.close()

    external_rounds = 0
    for name, pairs in rows.items():
        steps = 0
        for r, (rec, groups) in enumerate(pairs):
            want = _expected(groups, r)
            for side in ("groups/local", "groups/external"):
                assert sum(rec[f"{side}_{k}"] for k in KINDS) == rec[side] == want[side]
                for kind in KINDS:
                    assert rec[f"{side}_{kind}"] == want[f"{side}_{kind}"], (name, r, side)
            assert (
                rec["groups/local_signal"] + rec["groups/external_signal"]
                == (rec["groups/trained"])
            )
            if want["groups/external"]:
                external_rounds += 1
                assert rec["reward/external_mean"] == pytest.approx(want["reward/external_mean"])
                assert rec["groups/external_age_rounds"] == pytest.approx(
                    want["groups/external_age_rounds"]
                )
                assert (
                    rec["groups/external_age_rounds_max"] == want["groups/external_age_rounds_max"]
                )
                # a group enters the pool at the start of a round, or between two rounds
                assert all(0 <= g.pooled.received_round <= r for g in groups if g.pooled)
            else:
                assert rec["reward/external_mean"] is None
                assert (
                    "groups/external_age_rounds" not in rec and "groups/external_age_s" not in rec
                )
            if rec["train/steps"]:
                steps += 1
                norm = rec["train/grad_norm_max"]
                assert norm == rec["train/grad_norm"] > 0  # one step: its norm
                assert rec["train/grad_clipped"] == float(norm > clips[name])
                assert rec["train/grad_clipped"] == (1.0 if name == "a" else 0.0)
            else:
                assert rec["train/grad_norm_max"] is None and rec["train/grad_clipped"] is None
        assert steps, f"node {name} never trained"
    assert external_rounds >= 4  # each node took peers' groups in rounds 1-3 at least


def _crafted(index: int, completions: tuple[str, ...]) -> wire.RolloutGroup:
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


def test_peers_groups_of_every_outcome_are_counted_and_aged_in_rounds(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Known groups from a peer: all right, all wrong, one with signal; received while the
    node was at round 1 and trained on in round 3."""
    # defences off: the peer's completions train as sent
    node = _node(tiny_model_dir, tmp_path / "n", 3, False, local_groups=1, external_groups=3)
    try:
        node.round = 1
        crafted = {
            "all_right": ("7777", "7777", "7777", "7777"),
            "all_wrong": ("abcd", "abcd", "xyz", "ab"),
            "signal": ("7777", "abcd", "77ab", "ab"),
        }
        for i, texts in enumerate(crafted.values()):
            verdict = node.receive(wire.encode(_crafted(i, texts)), "peer-a")
            assert verdict.outcome == "accepted", verdict
        rewards = [1.0] * 4 + [0.0] * 4 + [1.0, 0.0, 0.5, 0.0]
        node.round = 3
        rec = node.run_round(3)
    finally:
        node.close()
    assert rec["groups/external"] == 3
    assert [rec[f"groups/external_{k}"] for k in KINDS] == [1, 1, 1]
    assert rec["reward/external_mean"] == pytest.approx(sum(rewards) / len(rewards))
    assert rec["groups/external_age_rounds"] == rec["groups/external_age_rounds_max"] == 2
    assert 0 <= rec["groups/external_age_s"] < 60


def test_a_skipped_step_records_no_norm_and_still_serialises(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """A non-finite gradient norm skips the step (trainer.py); the row says so with nulls
    (JSON has no NaN) instead of failing to be written."""
    node = _node(tiny_model_dir, tmp_path / "n", 4, local_groups=4, external_groups=0)
    monkeypatch.setattr(node.trainer, "_apply_gradients", lambda: math.nan)
    try:
        for r in range(6):
            rec = node.run_round(r)
            if rec["train/skipped_steps"]:
                break
        else:
            pytest.fail("no round had a group with signal")
        MetricsLog(tmp_path / "m.jsonl").append(rec)
    finally:
        node.close()
    assert rec["train/steps"] == 0
    assert rec["train/grad_norm"] is None
    assert rec["train/grad_norm_max"] is None and rec["train/grad_clipped"] is None


def test_a_nan_loss_is_recorded_as_null_and_the_node_runs_on(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """Issue 47: the loss itself is NaN (as from a model that overflowed), so its gradient
    is too and the step is skipped. The round is still recorded, its loss and norm as null,
    and ``Node.run`` goes on to the configured total instead of dying on the write."""
    from sapo_node.train import grpo

    real = grpo.clipped_surrogate

    def nan_loss(*args, **kwargs):
        loss, info = real(*args, **kwargs)
        return loss * math.nan, info

    monkeypatch.setattr(grpo, "clipped_surrogate", nan_loss)
    overrides = sevens_overrides(
        tiny_model_dir,
        tmp_path / "n",
        node={"seed": 4, "rounds": 4, "checkpoint_every": 2},
        train={"lr": 1e-2, "local_groups": 4, "external_groups": 0},
    )
    node = build_node(load_config(overrides=overrides, environ={}))
    try:
        assert node.run() == 4
    finally:
        node.close()
    rows = read_metrics(tmp_path / "n" / "metrics.jsonl")
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    stepped = [r for r in rows if r["train/sequences"]]
    assert stepped, "no round had a group with signal"
    for r in stepped:
        assert r["train/loss"] is None and r["train/grad_norm"] is None
        assert r["train/steps"] == 0 and r["train/skipped_steps"] == 1
    assert node.last_record is not None


def _rounds_around_expiry(node: Node, crafted: list[tuple[str, ...]]) -> tuple[dict, dict]:
    """Each crafted group from its own peer, made now; round 0; then round 1 once every
    group still pooled is older than ``pool.max_age_s`` (the pool's clock, which the
    intake reads too, is the test's). Closes the node."""
    now = [time.time()]
    node.pool.clock = lambda: now[0]
    try:
        for i, completions in enumerate(crafted):
            group = dataclasses.replace(_crafted(i, completions), created_ms=int(now[0] * 1000))
            assert node.receive(wire.encode(group), f"peer-{i}").outcome == "accepted"
        filled = node.run_round(0)
        now[0] += node.config.pool.max_age_s + 1
        node.round = 1
        return filled, node.run_round(1)
    finally:
        node.close()


def test_a_j_left_unfilled_because_groups_expired_is_recorded(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Issue 47: peers' groups that age out of the pool (``pool.max_age_s``) before a
    round draws them leave J to own groups; the round says how many slots, and a round
    whose J was filled says 0. The pool's clock (which the intake reads too) is the
    test's."""
    node = _node(tiny_model_dir, tmp_path / "n", 5, False, local_groups=2, external_groups=2)
    # the two groups left after round 0 are too old in round 1
    filled, starved = _rounds_around_expiry(node, [("7777", "abcd", "77ab", "ab")] * 4)
    assert filled["groups/external"] == 2 and filled["train/j_unfilled_expired"] == 0
    assert starved["peer_groups/expired"] == 2 and starved["groups/external"] == 0
    assert starved["train/j_unfilled_expired"] == 2


def _paper_node(model_dir: Path, data_dir: Path, max_author_share: float) -> Node:
    overrides = sevens_overrides(
        model_dir,
        data_dir,
        node={"seed": 5},
        generation={"max_new_tokens": 8, "completions_per_task": 8},
        # J fixed at 2: what is left unfilled is the draw's doing, not J's choice
        train={"lr": 1e-2, "local_groups": 2, "external_groups": 2, "external_by": "fixed"},
        pool={"sampling": "paper"},  # only groups with signal are drawn
        defence={"enabled": True, "max_author_share": max_author_share},
    )
    return build_node(load_config(overrides=overrides, environ={}))


SIGNAL, NO_SIGNAL = ("7777", "abcd", "77ab", "ab"), ("abcd", "ab", "abc", "xyz")


def test_only_groups_a_draw_could_take_count_as_expired_for_j(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A J left unfilled is blamed on expiry only as far as groups the draw could have
    taken aged out: with ``paper`` sampling, groups with signal. Groups without signal
    aging out at the same time are no reason (the tasks-cpu run's 2/2 arm was called void
    for them: the count then took every expired group)."""
    node = _paper_node(tiny_model_dir, tmp_path / "n", 1.0)
    # round 0 draws two of the three with signal; the one left and both without age out
    filled, starved = _rounds_around_expiry(node, [SIGNAL, SIGNAL, SIGNAL, NO_SIGNAL, NO_SIGNAL])
    assert filled["groups/external"] == 2 and filled["train/j_unfilled"] == 0
    assert starved["peer_groups/expired"] == 3 and starved["groups/external"] == 0
    assert starved["train/j_unfilled"] == 2
    assert starved["train/j_unfilled_expired"] == 1
    assert starved["train/j_unfilled_capped"] == 0


def test_a_j_left_unfilled_by_the_share_cap_says_so(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Three groups with signal, all from one peer, and J = 2 with at most half of it from
    one peer: the draw takes one, and the round names the cap, not expiry, as the reason."""
    node = _paper_node(tiny_model_dir, tmp_path / "n", 0.5)
    try:
        for i in range(3):
            assert node.receive(wire.encode(_crafted(i, SIGNAL)), "peer-a").outcome == "accepted"
        rec = node.run_round(0)
    finally:
        node.close()
    assert rec["groups/external"] == 1
    assert rec["train/j_unfilled"] == 1 and rec["train/j_unfilled_capped"] == 1
    assert rec["train/j_unfilled_expired"] == 0


def test_external_completions_trains_k_of_each_peers_group(
    tiny_model_dir: Path, tmp_path: Path, trained: list[list[Group]]
) -> None:
    """``train.external_completions``: of each peer's group with signal only k completions
    train (its own groups whole), and train/sequences says so. Peers' completions train
    whole here: one that teaches nothing (a cut completion without an answer, under
    ``answer_only``) is not trained at all, so it would not count."""
    hub = MemoryHub()
    nodes = [
        _node(tiny_model_dir, tmp_path / name, seed, whole=True, external_completions=3)
        for name, seed in (("a", 1), ("b", 2))
    ]
    for name, n in zip("ab", nodes, strict=True):
        n.transport = hub.join(name)
    sampled = 0
    try:
        for r in range(4):
            for n in nodes:
                rec = n.run_round(r)
                groups = [g for g in trained[-1] if g.has_signal]
                own = sum(len(g.completion_ids) for g in groups if g.origin == "local")
                theirs = [len(g.completion_ids) for g in groups if g.origin != "local"]
                assert rec["train/sequences"] == own + sum(min(3, k) for k in theirs)
                sampled += sum(k > 3 for k in theirs)
                n.round = r + 1
    finally:
        for n in nodes:
            n.close()
    assert sampled  # some peer's group had more than 3 completions to sample from
