"""A signal in any phase of a round leaves a consistent checkpoint (issue 47).

Real signals, delivered to this process by ``os.kill`` through the daemon's own handler
(``lifecycle.on_signals``): one signal stops cleanly, a second aborts without saving.
Each case starts from the same checkpoint of round 1 of a real node on the tiny model,
runs rounds 1 and 2 (a checkpoint every 3 rounds: the one on the way out is
``Node.run``'s), and sends the signal(s) once round 2 has begun, at one point of it.
Whatever checkpoint is there afterwards must be exactly what an uninterrupted node saved
for the same round: weights, optimiser, reward sum, mix, curriculum and the rounds of
metrics.jsonl it counts. A clean stop saves every round it recorded; an abort saves
nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sapo_node import checkpoint as checkpoint_module
from sapo_node.build import build_node
from sapo_node.config import load_config
from sapo_node.node import Node
from sapo_node.ops.lifecycle import on_signals
from tests.support.nodes import sevens_overrides

STATE_KEYS = ("round", "cumulative_reward", "mix", "curriculum")


def _node(model_dir: Path, data_dir: Path, rounds: int, every: int, stop=None) -> Node:
    overrides = sevens_overrides(
        model_dir,
        data_dir,
        node={"rounds": rounds, "checkpoint_every": every, "keep_checkpoints": 5},
        generation={"max_new_tokens": 6, "completions_per_task": 4},
        train={"lr": 1e-2, "local_groups": 2, "micro_batch_size": 2},
    )
    return build_node(load_config(overrides=overrides, environ={}), stop=stop)


def _run(node: Node) -> None:
    try:
        node.run()
    finally:
        node.close()


def _saved(data_dir: Path) -> tuple[int, dict, dict, Path]:
    """The checkpoint LATEST names: its round, state, weights and directory."""
    root = data_dir / "checkpoints"
    path = root / (root / "LATEST").read_text().strip()
    state = json.loads((path / "state.json").read_text())
    return state["round"], state, load_file(str(path / "weights.safetensors")), path


def _assert_same(a, b, where: str = "optimizer") -> None:
    """Equal to the last bit: tensors, and the dicts and lists that hold them."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}/{i}")
    else:
        assert a == b, where


@pytest.fixture(scope="module")
def runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The checkpoint of round 1 every case starts from, and an uninterrupted node's
    checkpoints of rounds 1, 2 and 3 from it (one a round)."""
    root = tmp_path_factory.mktemp("signals")
    base, ref = root / "base", root / "ref"
    _run(_node(tiny_model_dir, base, 1, 1))
    shutil.copytree(base, ref)
    reference = {}
    for k in (2, 3):
        _run(_node(tiny_model_dir, ref, k, 1))
    for path in sorted((ref / "checkpoints").glob("round-*")):
        state = json.loads((path / "state.json").read_text())
        optimizer = torch.load(path / "optimizer.pt", weights_only=False)
        reference[state["round"]] = (state, load_file(str(path / "weights.safetensors")), optimizer)
    assert sorted(reference) == [1, 2, 3]
    return base, reference


@pytest.fixture()
def handlers():
    """The daemon's signal handlers on a fresh stop event, the test's own put back after."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    stop = threading.Event()
    on_signals(stop)
    yield stop
    for s, h in before.items():
        signal.signal(s, h)


# (phase, the object holding the function, its name, signal before or after calling it)
PHASES: list[tuple[str, Callable[[Node], object], str, str]] = [
    ("start of the round", lambda n: n, "_take_in", "before"),
    ("generating", lambda n: n.policy, "generate", "before"),
    ("scoring", lambda n: n.scorer, "score", "after"),
    ("sharing", lambda n: n, "_share", "after"),
    ("screening", lambda n: n.defence, "screen", "after"),
    ("a micro-batch's forward", lambda n: n.trainer, "_logprobs", "before"),
    ("just before the optimiser step", lambda n: n.trainer, "_apply_gradients", "before"),
    ("just after the optimiser step", lambda n: n.trainer, "_apply_gradients", "after"),
    ("the curriculum's move", lambda n: n.curriculum, "record", "after"),
    ("the round's record", lambda n: n, "_record", "after"),
    ("recorded, not yet counted", lambda n: n.metrics, "append", "after"),
    ("writing a checkpoint", lambda n: checkpoint_module, "save_file", "after"),
    ("between rounds", lambda n: n, "_pace", "before"),
]


# The cases of the default run (each takes a node's start and two rounds): those a change
# is likeliest to break. Every other phase and signal count runs with -m slow.
QUICK = {
    ("screening", 1),  # stopped before the step, after the round's own groups were scored
    ("a micro-batch's forward", 1),
    ("just after the optimiser step", 1),
    ("just after the optimiser step", 2),
    ("recorded, not yet counted", 2),
    ("writing a checkpoint", 2),
}
CASES = [
    pytest.param(
        signals, *phase, id=f"{phase[0]}-{'stop' if signals == 1 else 'abort'}",
        marks=() if (phase[0], signals) in QUICK else pytest.mark.slow,
    )
    for phase in PHASES
    for signals in (1, 2)
]  # fmt: skip


@pytest.mark.parametrize(("signals", "phase", "owner", "name", "when"), CASES)
def test_a_signal_in_any_phase_leaves_a_consistent_checkpoint(
    runs, tiny_model_dir: Path, tmp_path: Path, handlers, monkeypatch, signals: int,
    phase: str, owner, name: str, when: str,
) -> None:  # fmt: skip
    base, reference = runs
    data = tmp_path / "data"
    shutil.copytree(base, data)
    node = _node(tiny_model_dir, data, 3, 3, stop=handlers)
    fired = []

    def fire() -> None:
        if not fired and node.round >= 2:
            fired.append(phase)
            for _ in range(signals):
                os.kill(os.getpid(), signal.SIGTERM)

    target = owner(node)
    real = getattr(target, name)

    def hooked(*args, **kwargs):
        if when == "before":
            fire()
        out = real(*args, **kwargs)
        if when == "after":
            fire()
        return out

    monkeypatch.setattr(target, name, hooked)
    if signals == 1:
        _run(node)
    else:
        with pytest.raises(SystemExit) as exited:
            _run(node)
        assert exited.value.code == 128 + signal.SIGTERM
    assert fired == [phase], "the phase was never reached in round 2"

    saved_round, state, weights, path = _saved(data)
    recorded = (data / "metrics.jsonl").read_bytes()
    if signals == 2:
        assert saved_round == 1  # aborted: nothing saved, the last checkpoint stands
    else:
        assert saved_round >= 2  # a clean stop saves every round it recorded
        assert recorded.count(b"\n") == saved_round
    ref_state, ref_weights, ref_optimizer = reference[saved_round]
    assert {k: state[k] for k in STATE_KEYS} == {k: ref_state[k] for k in STATE_KEYS}
    assert weights.keys() == ref_weights.keys()
    for key, tensor in weights.items():
        assert torch.equal(tensor, ref_weights[key]), key
    _assert_same(torch.load(path / "optimizer.pt", weights_only=False), ref_optimizer)
    # the rounds the checkpoint counts in metrics.jsonl (a resume cuts the file there)
    assert recorded[: state["metrics_offset"]].count(b"\n") == saved_round


def test_no_caller_can_save_a_round_part_way(runs, tiny_model_dir: Path, tmp_path: Path) -> None:
    """The experiment runner and the attack script drive ``run_round`` themselves and save
    in their own ``finally``: ``Node.save`` itself writes nothing between a round's step
    and its count (the caller's ``round += 1``), so none of them can label round 2's
    weights 2."""
    base, reference = runs
    data = tmp_path / "data"
    shutil.copytree(base, data)
    node = _node(tiny_model_dir, data, 3, 3)
    try:
        node.resume()
        record = node.run_round(node.round)
        node.save()  # as a caller's finally would, after an error or a second signal
        assert _saved(data)[0] == 1
        node.metrics.append(record)
        node.round += 1  # counted: now it saves
        node.save()
    finally:
        node.close()
    saved_round, state, weights, _ = _saved(data)
    ref_state, ref_weights, _ = reference[2]
    assert saved_round == 2 and state["mix"] == ref_state["mix"]
    assert all(torch.equal(t, ref_weights[k]) for k, t in weights.items())
