"""``node.min_round_s``: a node whose rounds are quicker waits in between, and a stop
ends the wait at once."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from sapo_node.build import build_node
from sapo_node.config import load_config
from sapo_node.node import Node
from tests.support.nodes import sevens_overrides


def _node(model_dir: Path, data_dir: Path, rounds: int, min_round_s: float) -> Node:
    overrides = sevens_overrides(
        model_dir, data_dir, node={"rounds": rounds, "min_round_s": min_round_s}
    )
    return build_node(load_config(overrides=overrides, environ={}))


def test_quick_rounds_wait_out_the_least_round_time(tiny_model_dir: Path, tmp_path: Path):
    """A round quicker than 2 s is followed by a wait of what it left, and none follows
    the last round. The waits are read as the node asks for them, not bounded by the
    wall clock, which a loaded machine stretches (a round slower than 2 s waits not)."""
    node = _node(tiny_model_dir, tmp_path, rounds=3, min_round_s=2.0)
    waits: dict[int, float] = {}
    real_wait = node.stop.wait

    def wait(timeout: float) -> bool:
        waits[node.round - 1] = timeout  # after the round just counted
        return real_wait(timeout)

    node.stop.wait = wait
    try:
        start = time.monotonic()
        assert node.run() == 3
        elapsed = time.monotonic() - start
    finally:
        node.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert waits and set(waits) <= {0, 1}, waits  # none after the last round
    for r, rest in waits.items():
        assert 0 < rest <= 2.0 - rows[r]["phase_s/round"] + 1e-6  # at most what it left
    assert elapsed >= sum(row["phase_s/round"] for row in rows) + sum(waits.values())
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
