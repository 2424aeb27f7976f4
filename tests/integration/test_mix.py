"""Adaptive J (train.external_max) in a real node on the tiny model: alone, it runs the
very rounds of a node with J = 0; with peers, J follows the node's own answer-format rate
when ``train.external_by = "format"``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sapo_node.build import build_node
from sapo_node.config import load_config
from sapo_node.net.memory import MemoryHub
from sapo_node.node import Node
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


def _format_node(model_dir: Path, data_dir: Path, seed: int) -> Node:
    overrides = sevens_overrides(
        model_dir,
        data_dir,
        node={"seed": seed},
        generation={"max_new_tokens": 8, "completions_per_task": 4},
        train={"lr": 1e-2, "external_max": 3, "external_by": "format"},
        pool={"sampling": "uniform"},  # groups without signal are taken too
        defence={"max_author_share": 1.0},  # one peer may fill all J
    )
    return build_node(load_config(overrides=overrides, environ={}))


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
        tiny_model_dir, tmp_path / "adaptive", 2, 2, external_by="signal", external_max=4
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
    """J = round(3 x (1 - the moving share of own completions with answer tags)), the
    moving rate recomputed here from each round's recorded tag rate; own groups fill the
    rest of I + J = 4."""
    hub = MemoryHub()
    nodes = [_format_node(tiny_model_dir, tmp_path / n, s) for n, s in (("a", 1), ("b", 2))]
    for name, n in zip("ab", nodes, strict=True):
        n.transport = hub.join(name)
    rows: dict[int, list[dict]] = {0: [], 1: []}
    try:
        for r in range(4):
            if r == 2:  # as if node a had learned the format: it takes less, then none
                nodes[0].mix.format_rate = 0.9
            for k, n in enumerate(nodes):
                rows[k].append(n.run_round(r))
                n.round = r + 1
    finally:
        for n in nodes:
            n.close()
    taken = 0
    for k, recs in rows.items():
        rate = None
        for r, rec in enumerate(recs):
            if k == 0 and r == 2:
                rate = 0.9
            expected = 2 if rate is None else round(3 * (1 - rate))
            if rec["pool/groups"] or rec["groups/external"]:  # something was pooled
                assert rec["train/external_target"] == expected
            assert rec["groups/local"] == 4 - rec["groups/external"]
            assert rec["groups/external"] <= rec["train/external_target"]
            taken += rec["groups/external"]
            tags = rec["rollout/answer_tag_rate"]
            rate = tags if rate is None else 0.8 * rate + 0.2 * tags
            assert rec["train/own_format_rate"] == pytest.approx(rate)
    assert taken  # the nodes did take peers' groups
    assert [rec["train/external_target"] for rec in rows[0][2:]] == [0, round(3 * 0.28)]
