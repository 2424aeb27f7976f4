"""Resuming is exact: a node stopped and restarted learns what an uninterrupted one does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sapo_node.build import build_node
from sapo_node.checkpoint import CheckpointError
from sapo_node.config import load_config
from tests.support.nodes import sevens_overrides


def _run(model_dir: Path, data_dir: Path, rounds: int, lora: bool = False) -> list[dict]:
    overrides = sevens_overrides(
        model_dir,
        data_dir,
        node={"rounds": rounds, "checkpoint_every": 2},
        model={"lora": {"enabled": lora, "r": 4}},
        train={"lr": 1e-2, "local_groups": 4},
    )
    node = build_node(load_config(overrides=overrides, environ={}))
    try:
        node.run()
    finally:
        node.close()
    lines = (data_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_stop_and_resume_equals_an_uninterrupted_run(
    tiny_model_dir: Path, tmp_path: Path, lora: bool
) -> None:
    # Each run starts from another state of torch's RNG, as after other work in the same
    # process: what a node draws (its adapter) must come from its seed alone.
    torch.manual_seed(1)
    straight = _run(tiny_model_dir, tmp_path / "straight", 5, lora)
    torch.manual_seed(2)
    _run(tiny_model_dir, tmp_path / "resumed", 2, lora)
    torch.manual_seed(3)
    resumed = _run(tiny_model_dir, tmp_path / "resumed", 5, lora)
    keys = (
        "round",
        "reward/mean",
        "rollout/new_tokens",
        "train/sequences",
        "family_level/" + ("tests.support.families:Sevens"),
    )
    assert [[r[k] for k in keys] for r in resumed] == [[r[k] for k in keys] for r in straight]
    assert resumed[-1]["reward/cumulative"] == pytest.approx(straight[-1]["reward/cumulative"])


def test_a_full_model_checkpoint_does_not_load_into_a_lora_node(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    _run(tiny_model_dir, tmp_path, 2, lora=False)
    with pytest.raises(CheckpointError, match="LoRA setting"):
        _run(tiny_model_dir, tmp_path, 4, lora=True)
