"""``build_node`` makes a node's parts from its config, and a part that fails leaves
nothing held: the data directory's lock is released for the next try. The weights a node
draws (LoRA's A matrices) come from its seed, not from what the process drew before."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from sapo_node.build import build_node
from sapo_node.config import load_config
from sapo_node.datadir import lock_data_dir
from sapo_node.intake.pool import PoolError
from sapo_node.train.policy import ModelLoadError
from tests.support.nodes import sevens_overrides


def test_a_model_that_fails_to_load_leaves_the_data_dir_free(tmp_path: Path) -> None:
    overrides = sevens_overrides(tmp_path / "no-such-model", tmp_path / "data")
    with pytest.raises(ModelLoadError) as failed:
        build_node(load_config(overrides=overrides, environ={}))
    assert failed.value is not None  # the failure (and its frames) still held here
    lock_data_dir(tmp_path / "data").close()  # a second process, or a retry, may start


def test_a_pool_that_cannot_open_leaves_the_data_dir_free(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    (data / "pool.sqlite3").mkdir(parents=True)  # the pool's file is a directory
    overrides = sevens_overrides(tiny_model_dir, data)
    with pytest.raises(PoolError) as failed:
        build_node(load_config(overrides=overrides, environ={}))
    assert failed.value is not None
    lock_data_dir(data).close()
    (data / "pool.sqlite3").rmdir()
    node = build_node(load_config(overrides=overrides, environ={}))
    try:
        assert node.round == 0 and node.trains and node.pool is not None
    finally:
        node.close()


def _adapter(model_dir: Path, data_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    overrides = sevens_overrides(
        model_dir, data_dir, node={"seed": seed}, model={"lora": {"enabled": True, "r": 4}}
    )
    node = build_node(load_config(overrides=overrides, environ={}))
    try:
        return node.policy.trainable_state()
    finally:
        node.close()


def test_a_lora_node_draws_its_adapter_from_its_seed_not_the_process(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    torch.manual_seed(1)
    first = _adapter(tiny_model_dir, tmp_path / "a", seed=7)
    torch.manual_seed(2)  # another test, or an earlier node, drew before this one
    before = torch.get_rng_state()
    second = _adapter(tiny_model_dir, tmp_path / "b", seed=7)
    after = torch.get_rng_state()
    other = _adapter(tiny_model_dir, tmp_path / "c", seed=8)
    a_matrices = [n for n in first if "lora_A" in n]
    assert a_matrices and first.keys() == second.keys() == other.keys()
    assert all(torch.equal(first[n], second[n]) for n in first)
    assert not all(torch.equal(first[n], other[n]) for n in a_matrices)
    assert torch.equal(after, before)  # and the process's RNG is left as it was


SWARM_FILE = """
[swarm]
name = "moving"
protocol = 2
bootstrap = ["/dnsaddr/boot.example.org"]

[[tasks.families]]
name = "basic_arithmetic"

[recommended.model]
name = "{model}"
"""


def test_a_swarms_change_of_model_starts_a_new_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    moved = tmp_path / "next-model"
    shutil.copytree(tiny_model_dir, moved)
    swarm = tmp_path / "swarm.toml"
    own = sevens_overrides(tiny_model_dir, data)
    del own["model"]  # the model is the swarm file's

    def follow(model: Path):
        swarm.write_text(SWARM_FILE.format(model=model), encoding="utf-8")
        net = {"enabled": False, "swarm_file": str(swarm)}
        return load_config(overrides={**own, "net": net}, environ={})

    node = build_node(follow(tiny_model_dir))
    try:
        node.resume()
        node.round = 3
        node.save()
    finally:
        node.close()
    node = build_node(follow(moved))  # the organiser moved the swarm to another model
    try:
        node.resume()  # resumes nothing, rather than failing on the fingerprint
        assert node.round == 0 and node.config.model.name == str(moved)
    finally:
        node.close()
    (old,) = (data / "runs").iterdir()
    assert (old / "checkpoints" / "LATEST").read_text().strip() == "round-000003"
