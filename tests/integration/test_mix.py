"""Adaptive J (train.external_max) in a real node on the tiny model: alone, it runs the
very rounds of a node with J = 0; with peers, J follows the node's own answer-format rate
when ``train.external_by = "format"``, rising by at most 1 a round, and its skill at its
current levels under ``"skill"``, reopening after a level-up; while J is 0, peers' groups
are pooled but not scored."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from sapo_node.build import build_node
from sapo_node.config import load_config
from sapo_node.net.memory import MemoryHub
from sapo_node.node import Node
from sapo_node.tasks import Scorer, ScoreResult, Task
from tests.support.nodes import sevens_overrides


def _node(model_dir: Path, data_dir: Path, local: int, external: int, **train) -> Node:
    overrides = sevens_overrides(
        model_dir,
        data_dir,
        node={"seed": 11},
        generation={"max_new_tokens": 6, "completions_per_task": 4},
        train={"lr": 1e-2, "local_groups": local, "external_groups": external, **train},
    )
    return build_node(load_config(overrides=overrides, environ={}))


def _format_node(model_dir: Path, data_dir: Path, seed: int, **sections) -> Node:
    overrides = sevens_overrides(
        model_dir,
        data_dir,
        node={"seed": seed},
        generation={"max_new_tokens": 8, "completions_per_task": 4},
        train={"lr": 1e-2, "external_max": 3, "external_by": "format"},
        pool={"sampling": "uniform"},  # groups without signal are taken too
        defence={"max_author_share": 1.0},  # one peer may fill all J
    )
    for name, values in sections.items():
        overrides[name] = {**overrides.get(name, {}), **values}
    return build_node(load_config(overrides=overrides, environ={}))


class CountingScorer:
    """The node's own scorer, counting the completions it is asked to score."""

    def __init__(self, inner: Scorer) -> None:
        self.inner, self.scored = inner, 0

    def score(self, task: Task, completions: Sequence[str]) -> list[ScoreResult]:
        self.scored += len(completions)
        return self.inner.score(task, completions)


def _rounds(node: Node, n: int) -> list[dict]:
    rows = []
    try:
        for r in range(n):
            rows.append(node.run_round(r))
            node.round = r + 1
        return rows
    finally:
        node.close()


def test_a_lone_node_with_adaptive_j_runs_the_rounds_of_j_0(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    adaptive = _node(
        tiny_model_dir, tmp_path / "adaptive", 2, 2, external_by="signal", external_max=3
    )
    fixed = _node(tiny_model_dir, tmp_path / "fixed", 4, 0)
    torch.manual_seed(0)
    a = _rounds(adaptive, 3)
    torch.manual_seed(0)
    f = _rounds(fixed, 3)
    assert [r["train/external_target"] for r in a] == [0, 0, 0]  # nothing pooled
    assert [r["groups/local"] for r in a] == [4, 4, 4]
    assert [r["groups/external"] for r in a] == [0, 0, 0]
    assert [r["reward/mean"] for r in a] == [r["reward/mean"] for r in f]
    assert [r["train/loss"] for r in a] == [r["train/loss"] for r in f]
    wa, wf = adaptive.policy.model.state_dict(), fixed.policy.model.state_dict()
    assert all(torch.equal(wa[k], wf[k]) for k in wa)
    assert all(0.0 <= r["train/own_signal_rate"] <= 1.0 for r in a)


def test_j_by_format_follows_the_moving_answer_format_rate(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """J = 3 x (1 - the moving share of own finished completions with answer tags), rounded
    half up and at most 1 above the last J chosen, the moving rate recomputed here from
    each round's recorded rate (a round where none finished leaves it); own groups fill
    the rest of I + J = 4."""
    hub = MemoryHub()
    nodes = [_format_node(tiny_model_dir, tmp_path / n, s) for n, s in (("a", 1), ("b", 2))]
    for name, n in zip("ab", nodes, strict=True):
        n.transport = hub.join(name)
    rows: dict[int, list[dict]] = {0: [], 1: []}
    try:
        for r in range(6):
            if r == 2:  # as if node a had learned the format: it takes less, then none
                nodes[0].own_stats.format_rate = 0.9
            if r == 4:  # as if it had lost it at once: J climbs back one a round
                nodes[0].own_stats.format_rate = 0.0
            for k, n in enumerate(nodes):
                rows[k].append(n.run_round(r))
                n.round = r + 1
    finally:
        for n in nodes:
            n.close()
    taken = 0
    for k, recs in rows.items():
        rate, last = None, None
        for r, rec in enumerate(recs):
            if k == 0 and r in (2, 4):
                rate = {2: 0.9, 4: 0.0}[r]
            expected = 2 if rate is None else int(3 * (1 - rate) + 0.5)
            if last is not None:
                expected = min(expected, last + 1)
            if rec["pool/groups"] or rec["groups/external"]:  # something was pooled
                assert rec["train/external_target"] == expected
                last = expected
            assert rec["groups/local"] == 4 - rec["groups/external"]
            assert rec["groups/external"] <= rec["train/external_target"]
            taken += rec["groups/external"]
            tags = rec["rollout/answer_tag_rate_finished"]
            if tags is not None:
                rate = tags if rate is None else 0.8 * rate + 0.2 * tags
            assert rec["train/own_format_rate"] == pytest.approx(rate)
    assert taken  # the nodes did take peers' groups
    targets = [rec["train/external_target"] for rec in rows[0][2:]]
    assert targets == [0, int(3 * (1 - 0.9 * 0.8) + 0.5), 2, 3]  # 0.9, 0.72; 0: 1 up a round


def test_while_j_is_0_peers_groups_are_pooled_unscored_until_a_round_may_draw_them(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Scoring a peer's group costs this node as much as the peer's generation of it: a node
    that takes none (its format rate keeps J at 0) checks and pools them, but scores them
    only once its J rises again, before that round's draw."""
    hub = MemoryHub()
    a = _format_node(tiny_model_dir, tmp_path / "a", 1)
    alone = {"external_by": "fixed", "local_groups": 4, "external_groups": 0}
    b = _format_node(tiny_model_dir, tmp_path / "b", 2, train=alone)  # publishes 4 a round
    a.transport, b.transport = hub.join("a"), hub.join("b")
    spy = CountingScorer(a.intake.scorer)
    a.intake.scorer = spy
    rows = []
    try:
        for r in range(4):
            b.run_round(r)
            b.round = r + 1
            a.own_stats.format_rate = 1.0 if r < 2 else 0.0  # has the format, then loses it
            rows.append(a.run_round(r))
            a.round = r + 1
            if r < 2:
                assert rows[-1]["train/external_target"] == 0
                assert rows[-1]["net/accepted"] == 4 and len(a.pool) == 4 * (r + 1)
                assert spy.scored == 0, "peers' groups were scored with J at 0"
                assert len(a.pool.unscored()) == 4 * (r + 1)
            if r == 2:  # J 1: everything pooled is scored before the draw, then one drawn
                assert rows[-1]["train/external_target"] == 1
                assert rows[-1]["groups/external"] == 1
                assert spy.scored == 4 * 12 and a.pool.unscored() == []
    finally:
        a.close()
        b.close()
    assert rows[3]["train/external_target"] == 2  # scored on arrival again
    assert spy.scored == 4 * 16 and rows[3]["groups/external"] == 2


def test_j_by_skill_reopens_when_the_curriculum_moves_a_family_up(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A node that has shown skill at its level takes nothing; once the curriculum moves it
    up, it has shown none at the new level, and J climbs back, one a round."""
    family = "tests.support.families:Levelled"
    tasks = {"families": [{"name": family, "levels": [{"level": 0}, {"level": 1}]}]}
    skill = {
        "train": {"external_by": "skill"},
        "tasks": tasks,
        "curriculum": {"window": 32},  # level 0 scores 1: it moves up after 32 completions
    }
    hub = MemoryHub()
    a, b = (_format_node(tiny_model_dir, tmp_path / n, s, **skill) for n, s in (("a", 1), ("b", 2)))
    a.transport, b.transport = hub.join("a"), hub.join("b")
    a.own_stats.skill[(family, 0)] = 0.95  # as if it had practised level 0 for a while
    rows = []
    try:
        for r in range(5):
            b.run_round(r)
            b.round = r + 1
            rows.append(a.run_round(r))
            a.round = r + 1
    finally:
        a.close()
        b.close()
    levels = [rec[f"family_level/{family}"] for rec in rows]
    targets = [rec["train/external_target"] for rec in rows]
    assert levels == [0, 1, 1, 1, 1]  # as recorded after each round: up after round 1
    assert targets == [0, 0, 1, 2, 3]
    assert [rec["train/own_skill"] for rec in rows][2:] == sorted(
        rec["train/own_skill"] for rec in rows[2:]
    )
