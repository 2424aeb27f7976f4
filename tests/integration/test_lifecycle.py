"""The daemon as a user runs it: a real `sapo-node start` process, killed and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, model_dir: Path, extra: str = "") -> Path:
    path = tmp_path / "node.toml"
    path.write_text(
        extra
        + f"""
[node]
checkpoint_every = 2
seed = 5
[model]
name = "{model_dir}"
[generation]
completions_per_task = 4
max_new_tokens = 6
[tasks]
one_shot = false
system_prompt = "Reply."
[[tasks.families]]
name = "basic_arithmetic"
levels = [{{ min_terms = 2, max_terms = 2, max_digits = 1 }}]
[train]
local_groups = 2
lr = 1e-3
"""
    )
    return path


def _start(
    config: Path, data_dir: Path, *extra: str, session: bool = False, net: bool = False
) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    if net:  # on loopback (conftest), mDNS off
        env["SAPO_NET__ENABLED"] = "true"
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sapo_node.cli",
            "start",
            "--config",
            str(config),
            "--data-dir",
            str(data_dir),
            "--json-logs",
            *extra,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=session,
    )


def _rounds(data_dir: Path) -> list[int]:
    path = data_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["round"] for line in path.read_text().splitlines() if line]


def _wait_for_rounds(proc: subprocess.Popen, data_dir: Path, n: int, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while len(_rounds(data_dir)) < n:
        if proc.poll() is not None:
            pytest.fail(f"node exited early: {proc.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("node too slow")
        time.sleep(0.2)


def _finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("node did not stop in time")
    return proc.returncode, err


def _latest(data_dir: Path) -> int:
    return int((data_dir / "checkpoints" / "LATEST").read_text().strip().split("-")[1])


def test_sigkill_then_resume_loses_at_most_the_rounds_since_the_checkpoint(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    config, data = _config(tmp_path, tiny_model_dir), tmp_path / "data"
    proc = _start(config, data)
    _wait_for_rounds(proc, data, 5)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    saved = _latest(data)
    assert saved >= 4
    lost = len(_rounds(data)) - saved
    assert 0 <= lost < 2 + 1  # at most the rounds since the last checkpoint (every 2)

    proc = _start(config, data, "--rounds", str(saved + 3))
    code, err = _finish(proc)
    assert code == 0, err[-2000:]
    resumed = [json.loads(x) for x in err.splitlines() if '"resumed"' in x]
    assert resumed and resumed[0]["round"] == saved
    assert _rounds(data) == list(range(saved + 3))  # every round once, in order
    assert _latest(data) == saved + 3


def test_a_busy_data_dir_sigint_and_a_corrupt_checkpoint(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A second node on a data directory in use is refused with a clear error; SIGINT
    stops the first cleanly with every recorded round in its checkpoint; a corrupt
    checkpoint is a clear error, not a traceback. (One data directory for the three:
    the node stopped by SIGINT leaves the checkpoint that is then corrupted.)"""
    config, data = _config(tmp_path, tiny_model_dir), tmp_path / "data"
    first = _start(config, data)  # runs until stopped, holding the data directory
    _wait_for_rounds(first, data, 1)
    second = _start(config, data)
    code, err = _finish(second, timeout=120)
    assert code == 1 and "in use by another sapo-node" in err
    _wait_for_rounds(first, data, 3)
    first.send_signal(signal.SIGINT)
    code, err = _finish(first, timeout=120)
    assert code == 0, err[-3000:]
    assert "Traceback" not in err
    assert _latest(data) == len(_rounds(data))  # every recorded round is in the checkpoint

    ckpt = data / "checkpoints" / f"round-{_latest(data):06d}" / "weights.safetensors"
    ckpt.write_bytes(ckpt.read_bytes()[:-10] + b"0123456789")
    proc = _start(config, data, "--rounds", "50")
    code, err = _finish(proc, timeout=120)
    assert code == 1
    assert "is corrupt" in err and "Traceback" not in err


LOOPBACK_NET = """
[net]
swarm = "sigterm-test"
listen = ["/ip4/127.0.0.1/tcp/0"]
mdns = false
dht = false
[status]
enabled = false
"""


def test_sigterm_to_the_whole_process_group_stops_cleanly_with_no_network_restart(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Issue 33: ``timeout`` and some supervisors send SIGTERM to the node's whole process
    group, its network process included. That process used to die of it, and the node
    logged "network process died; restarting" and started another one while stopping.
    Now the network process leaves the signal to the node, which stops it."""
    import psutil

    config = _config(tmp_path, tiny_model_dir, LOOPBACK_NET)
    data = tmp_path / "data"
    proc = _start(config, data, session=True, net=True)  # its own group, as a supervisor's
    _wait_for_rounds(proc, data, 3)
    children = psutil.Process(proc.pid).children(recursive=True)
    net = [c for c in children if "sapo_node.net.host" in " ".join(c.cmdline())]
    assert len(net) == 1, [c.cmdline() for c in children]
    os.killpg(proc.pid, signal.SIGTERM)
    code, err = _finish(proc, timeout=120)
    exited = time.monotonic()
    assert code == 0, err[-3000:]
    assert "Traceback" not in err
    assert "network process died" not in err and "network process restarted" not in err
    assert _latest(data) == len(_rounds(data))  # every recorded round is in the checkpoint
    assert (data / "peers-net.json").exists()  # the peer state was saved on the way out
    _, alive = psutil.wait_procs(children, timeout=max(0.0, 5.0 - (time.monotonic() - exited)))
    assert alive == [], [c.cmdline() for c in alive]  # no child outlives its node by 5 s


def test_a_model_that_fails_to_load_stops_the_network_started_beside_it(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The network process starts while the model loads. When the model then fails to
    load, the node says why in one line and exits 1, and stops that network process on
    the way out (which saves the peer state: a transport orphaned would not)."""
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    config = _config(tmp_path, empty, LOOPBACK_NET)
    data = tmp_path / "data"
    code, err = _finish(_start(config, data, net=True), timeout=120)
    assert code == 1, err[-3000:]
    assert "not a model directory" in err and "Traceback" not in err
    assert "swarm joined" in err  # it was in the swarm while the model loaded
    assert (data / "peers-net.json").exists()
