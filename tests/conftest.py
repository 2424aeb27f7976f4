"""Shared fixtures. Tests never reach a model hub (HF_HUB_OFFLINE is forced on) nor any
address but loopback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One compute thread per process: the models here are tiny, and `make test` runs two
# workers, each starting node processes; torch's default (a thread per core in every one
# of them) oversubscribes the cores (docs/development.md, "The test suite's time").
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("SAPO_NODE__THREADS", "1")
# A tiny model's round takes well under 0.1 s: nodes that wait for peers would spin
# through rounds (and checkpoints) as fast as the CPU allows, starving the processes the
# tests are waiting on. A quarter of a second a round is still quicker than any check.
os.environ.setdefault("SAPO_NODE__MIN_ROUND_S", "0.25")
# Tests never touch a network beyond loopback: nodes start offline unless a test turns the
# network on (it then listens on 127.0.0.1), and mDNS, which multicasts on every
# interface, stays off (it is tested only inside a network namespace of its own).
os.environ["SAPO_NET__ENABLED"] = "false"
os.environ["SAPO_NET__MDNS"] = "false"
os.environ["SAPO_NET__LISTEN"] = '["/ip4/127.0.0.1/tcp/0"]'
# Status endpoints on loopback, each on a free port (never a running node's 9141).
os.environ["SAPO_STATUS__LISTEN"] = '"127.0.0.1:0"'
# oneDNN's and ideep's per-shape caches capped as a node's program caps them
# (lifecycle.cap_kernel_caches): read at the process's first matrix product.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")
os.environ.setdefault("LRU_CACHE_CAPACITY", "16")

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
    from sapo_node.train.policy import load_policy

    torch.manual_seed(0)
    return load_policy(
        str(tiny_model_dir),
        device="cpu",
        dtype="float32",
        lora=LoraSection(),
        cache_dir=tiny_model_dir,
    )
