"""Adaptive J (train.external_max) in a real node on the tiny model: alone, it runs the
very rounds of a node with J = 0; with a pool, it takes what its own signal asks for."""

from __future__ import annotations

from pathlib import Path

import torch

from sapo_node.build import build_node
from sapo_node.config import load_config
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
    adaptive = _node(tiny_model_dir, tmp_path / "adaptive", 2, 2, external_max=4)
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
