from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from sapo_node.checkpoint import CheckpointError, CheckpointStore

FP = {"model": "m", "lora": False}


def _save(store: CheckpointStore, round_: int, value: float = 1.0) -> Path:
    weights = {"w": torch.full((3, 2), value), "b": torch.zeros(2)}
    opt = {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1, "params": [0]}]}
    state = {"round": round_, "fingerprint": FP, "curriculum": {"level": {"a": 1}}}
    return store.save(round_, weights, opt, state)


def test_round_trip_and_latest(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    assert store.latest() is None
    _save(store, 5, 1.0)
    _save(store, 10, 2.0)
    ckpt = store.load(store.latest(), FP)
    assert ckpt.state["round"] == 10
    assert torch.equal(ckpt.weights["w"], torch.full((3, 2), 2.0))
    assert ckpt.optimizer["param_groups"][0]["lr"] == 0.1


def test_old_checkpoints_are_pruned(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    for r in (1, 2, 3, 4):
        _save(store, r)
    assert sorted(p.name for p in store.root.glob("round-*")) == ["round-000003", "round-000004"]


def test_corrupt_checkpoint_is_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    path = _save(store, 5)
    data = bytearray((path / "weights.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (path / "weights.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt.*point LATEST at an older one"):
        store.load(store.latest(), FP)
    # export checks the same hashes, and says what to do in its own terms
    from sapo_node.ops.export import ExportError, read_checkpoint

    with pytest.raises(ExportError, match="weights.safetensors does not match.*--checkpoint"):
        read_checkpoint(path)


def test_truncated_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    path = _save(store, 5)
    (path / "MANIFEST.json").write_text("{")
    with pytest.raises(CheckpointError, match="cannot be read"):
        store.load(store.latest(), FP)


def test_foreign_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    _save(store, 5)
    with pytest.raises(CheckpointError, match="use the same --model"):
        store.load(store.latest(), {"model": "other", "lora": False})


def test_missing_latest_pointer_with_checkpoints(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    _save(store, 5)
    (store.root / "LATEST").unlink()
    with pytest.raises(CheckpointError, match="no LATEST"):
        store.latest()
    (store.root / "LATEST").write_text("../../etc\n")
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        store.latest()


def test_a_crash_mid_write_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    store = CheckpointStore(tmp_path)
    _save(store, 5, 1.0)

    def disk_full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("sapo_node.checkpoint.torch.save", disk_full)
    with pytest.raises(OSError):
        _save(store, 10, 2.0)
    ckpt = store.load(store.latest(), FP)
    assert ckpt.state["round"] == 5
    assert not list(store.root.glob(".round-*"))  # no temporary left behind


def test_a_round_saved_again_and_cut_short_keeps_its_first_save(
    tmp_path: Path, monkeypatch
) -> None:
    """Saving a round that already has a checkpoint (a stop right after a resume) and
    being killed between taking the old one out and putting the new one in leaves LATEST
    naming a checkpoint that is whole: the first save of that round."""
    store = CheckpointStore(tmp_path)
    _save(store, 5, 1.0)
    real_replace = os.replace

    def killed_before_the_new_one_is_in(src, dst):
        if Path(src).name.startswith(".round-000005.tmp-"):
            raise KeyboardInterrupt  # the process dies here
        return real_replace(src, dst)

    monkeypatch.setattr("sapo_node.checkpoint.os.replace", killed_before_the_new_one_is_in)
    with pytest.raises(KeyboardInterrupt):
        _save(store, 5, 2.0)
    monkeypatch.undo()
    restarted = CheckpointStore(tmp_path)
    ckpt = restarted.load(restarted.latest(), FP)
    assert ckpt.state["round"] == 5 and torch.equal(ckpt.weights["w"], torch.full((3, 2), 1.0))
    _save(restarted, 5, 3.0)  # and a save of the same round then completes, leaving no copy
    assert torch.equal(restarted.load(restarted.latest(), FP).weights["w"], torch.full((3, 2), 3.0))
    assert not list(restarted.root.glob(".round-*"))


def test_a_write_that_fails_is_an_os_error_and_keeps_the_previous(tmp_path: Path) -> None:
    """Out of space mid-checkpoint, torch reports a RuntimeError; the store makes it the
    OSError its callers handle (the node logs it and goes on), and the previous
    checkpoint stays LATEST. The failure is real: a file-size limit (RLIMIT_FSIZE) in a
    child process, where writes past 1 MiB fail as on a full disk."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        f"""
        import resource, signal, torch
        from pathlib import Path
        from sapo_node.checkpoint import CheckpointStore
        store = CheckpointStore(Path({str(tmp_path)!r}))
        small = {{"state": {{}}, "param_groups": []}}
        store.save(1, {{"w": torch.zeros(4)}}, small, {{"round": 1}})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, 2**20))
        big = {{"state": {{0: {{"exp_avg": torch.zeros(2**20)}}}}, "param_groups": []}}
        try:
            store.save(2, {{"w": torch.zeros(4)}}, big, {{"round": 2}})
        except OSError as exc:
            print("OSError", exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("OSError cannot write the checkpoint")
    store = CheckpointStore(tmp_path)
    assert store.latest().name == "round-000001"
    assert sorted(p.name for p in store.root.iterdir()) == ["LATEST", "round-000001"]
