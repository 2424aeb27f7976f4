"""Shared fixtures. Tests never reach a model hub: HF_HUB_OFFLINE is forced on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture()
def tiny_policy(tiny_model_dir: Path):
    """A fresh tiny policy on the CPU (tests may train it)."""
    import torch

    from sapo_node.config import LoraSection
    from sapo_node.policy import load_policy

    torch.manual_seed(0)
    return load_policy(
        str(tiny_model_dir),
        device="cpu",
        dtype="auto",
        lora=LoraSection(),
        cache_dir=tiny_model_dir,
    )
