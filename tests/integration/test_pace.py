"""``node.min_round_s``: a node whose rounds are quicker waits in between, and a stop
ends the wait at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sapo_node.config import load_config
from sapo_node.node import Node
from tests.support.nodes import sevens_overrides


def _node(model_dir: Path, data_dir: Path, rounds: int, min_round_s: float) -> Node:
    overrides = sevens_overrides(
        model_dir, data_dir, node={"rounds": rounds, "min_round_s": min_round_s}
    )
    return Node(load_config(overrides=overrides, environ={}))


def test_quick_rounds_wait_out_the_least_round_time(tiny_model_dir: Path, tmp_path: Path):
    node = _node(tiny_model_dir, tmp_path, rounds=3, min_round_s=0.6)
    try:
        start = time.monotonic()
        assert node.run() == 3
        elapsed = time.monotonic() - start
    finally:
        node.close()
    # three rounds of well under 0.6 s each: two waits, none after the last round
    assert 1.2 <= elapsed < 1.2 + 3 * 0.6 + 5.0, elapsed
    assert node.round == 3


def test_a_stop_ends_the_wait_at_once(tiny_model_dir: Path, tmp_path: Path):
    node = _node(tiny_model_dir, tmp_path, rounds=0, min_round_s=60.0)
    done: list[int] = []
    runner = threading.Thread(target=lambda: done.append(node.run()))
    try:
        runner.start()
        deadline = time.monotonic() + 60
        while node.round < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert node.round == 1  # the first round is done; the node now waits
        time.sleep(0.3)
        stopped = time.monotonic()
        node.stop.set()
        runner.join(30)
        assert not runner.is_alive()
        assert time.monotonic() - stopped < 5.0
    finally:
        node.stop.set()
        runner.join(30)
        node.close()
    assert done == [1]
