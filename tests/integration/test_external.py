"""External groups: what one node shares, another re-checks, re-scores and trains on."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sapo_node.config import load_config
from sapo_node.node import Node
from sapo_node.pool import SharedGroup
from sapo_node.tasks import TaskRef, make_task
from tests.support.nodes import sevens_overrides


def _node(model_dir: Path, data_dir: Path, seed: int, local: int, external: int) -> Node:
    overrides = sevens_overrides(
        model_dir,
        data_dir,
        node={"seed": seed},
        generation={"max_new_tokens": 6, "completions_per_task": 4},
        train={"lr": 1e-3, "local_groups": local, "external_groups": external},
    )
    return Node(load_config(overrides=overrides, environ={}))


@pytest.fixture()
def receiver(tiny_model_dir: Path, tmp_path: Path):
    node = _node(tiny_model_dir, tmp_path / "b", seed=2, local=2, external=2)
    yield node
    node.close()


def _shared(index: int, completions: tuple[str, ...]) -> SharedGroup:
    ref = TaskRef.make("tests.support.families:Sevens", {}, 99, index)
    return SharedGroup(ref, make_task(ref).question, completions, author="peer-a")


def test_received_groups_are_rescored_and_trained_on(receiver: Node) -> None:
    good = _shared(0, ("777", "abc", "7a7", "xyz"))
    pooled = receiver.receive(good)
    assert pooled is not None and pooled.rewards == (1.0, 0.0, pytest.approx(2 / 3), 0.0)
    assert receiver.receive(_shared(1, ("7", "7", "7", "7"))) is not None  # no signal
    record = receiver.run_round(0)
    # paper sampling: the group without signal is skipped, one slot is filled locally
    assert record["external_groups"] == 1
    assert record["local_groups"] == 3
    assert record["train/sequences"] >= 4


def test_peers_lies_are_refused(receiver: Node) -> None:
    honest = _shared(3, ("777", "x", "y", "z"))
    wrong_question = dataclasses.replace(honest, question="Write eights (3).")
    assert receiver.receive(wrong_question) is None
    unknown = dataclasses.replace(honest, ref=TaskRef.make("no_such_family", {}, 1, 0))
    assert receiver.receive(unknown) is None
    hostile_module = dataclasses.replace(honest, ref=TaskRef.make("os:system", {}, 1, 0))
    assert receiver.receive(hostile_module) is None
    flood = dataclasses.replace(honest, completions=("7",) * 100_000)
    assert receiver.receive(flood) is None
    assert receiver.receive(dataclasses.replace(honest, completions=("7",))) is None
    assert len(receiver.pool) == 0


def test_two_nodes_share_through_the_pool(tiny_model_dir: Path, tmp_path: Path) -> None:
    sender = _node(tiny_model_dir, tmp_path / "a", seed=1, local=3, external=0)
    try:
        groups, _ = sender._generate(
            [make_task(r) for r in sender.curriculum.sample(sender.seed, 0, 3)], 0
        )
    finally:
        sender.close()
    receiver = _node(tiny_model_dir, tmp_path / "b", seed=2, local=1, external=3)
    try:
        for g in groups:
            shared = SharedGroup(g.task.ref, g.task.question, tuple(g.texts), author="a")
            assert receiver.receive(shared) is not None
        receiver.pool.sampling = "uniform"
        record = receiver.run_round(0)
        assert record["external_groups"] == 3 and record["local_groups"] == 1
    finally:
        receiver.close()


def test_a_full_disk_stops_the_node_cleanly_with_its_state_saved(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    node = _node(tiny_model_dir, tmp_path / "c", seed=3, local=1, external=0)
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
    assert (tmp_path / "c" / "checkpoints" / "LATEST").read_text().strip() == "round-000002"


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
