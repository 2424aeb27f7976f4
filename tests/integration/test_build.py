"""``build_node`` makes a node's parts from its config, and a part that fails leaves
nothing held: the data directory's lock is released for the next try."""

from __future__ import annotations

from pathlib import Path

import pytest

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
