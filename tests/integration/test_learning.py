"""An honest learning test: a tiny random model must learn a trivially verifiable task.

The Sevens task rewards the share of '7' in a completion. A random character-level
model writes about 1% sevens; if advantages, the clipped loss, the log-probs or the
optimiser step were wrong (a flipped sign, a detached graph, padding in the loss),
reward would stay flat or fall and this test fails.
"""

from __future__ import annotations

import json
from pathlib import Path

from sapo_node.build import build_node
from sapo_node.config import load_config
from tests.support.nodes import sevens_overrides


def _config(model_dir: Path, data_dir: Path, rounds: int):
    overrides = sevens_overrides(
        model_dir,
        data_dir,
        node={"rounds": rounds},
        train={"lr": 1e-2, "local_groups": 8, "micro_batch_size": 32},
    )
    return load_config(overrides=overrides, environ={})


def test_reward_rises_within_a_few_rounds(tiny_model_dir: Path, tmp_path: Path) -> None:
    node = build_node(_config(tiny_model_dir, tmp_path, rounds=12))
    try:
        assert node.run() == 12
    finally:
        node.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward/mean"] for r in rows]
    first, last = sum(rewards[:2]) / 2, sum(rewards[-3:]) / 3
    assert first < 0.1, rewards
    assert last > 0.5 and last > 5 * first, rewards
    assert rows[-1]["reward/cumulative"] > sum(rewards) - 1e-6
    for key in (
        "round",
        "reward/mean",
        "reward/cumulative",
        "groups/local",
        "groups/external",
        "phase_s/generate",
        "phase_s/score",
        "phase_s/train",
        "phase_s/round",
        "rollout/tokens_per_s",
        "memory/peak_rss_mb",
    ):
        assert key in rows[0]
    assert (tmp_path / "checkpoints" / "LATEST").read_text().strip() == "round-000012"
