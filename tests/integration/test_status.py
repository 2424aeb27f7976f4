"""The status endpoint of a real `sapo-node start` process, asked with a real HTTP client:
/metrics parses as Prometheus text, /status as JSON, /healthz turns 503 when the network
process or the round loop is stuck (each stopped with SIGSTOP, then let go), and
`sapo-node status` finds the node through its data directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sapo_node.cli import main

REPO = Path(__file__).resolve().parents[2]
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _config(tmp_path: Path, model_dir: Path) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(
        f"""
[node]
seed = 5
checkpoint_every = 1000
[model]
name = "{model_dir}"
[generation]
completions_per_task = 4
max_new_tokens = 4
[tasks]
one_shot = false
system_prompt = "Reply."
[[tasks.families]]
name = "basic_arithmetic"
levels = [{{ min_terms = 2, max_terms = 2, max_digits = 1 }}]
[scoring]
timeout_s = 600.0   # a stopped verifier worker holds the round loop (the stuck case)
[net]
dht = false
[status]
stall_min_s = 2.0
stall_factor = 2.0
net_stall_s = 3.0
"""
    )
    return path


def _get(url: str) -> tuple[int, bytes]:
    try:
        with NO_PROXY.open(url, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _wait(pred: Callable[[], object], timeout: float, what: str, proc: subprocess.Popen):
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        if proc.poll() is not None:
            pytest.fail(f"node exited while waiting for {what}: {proc.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.1)
    return value


def _status(base: str) -> dict:
    return json.loads(_get(f"{base}/status")[1])


def _status_command(data: Path, capsys) -> tuple[int, str, str]:
    """``sapo-node status --data-dir DATA``: its exit code, stdout and stderr."""
    try:
        main(["status", "--data-dir", str(data)])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def _child(proc: subprocess.Popen, marker: str) -> psutil.Process:
    """The node's child process whose command line holds ``marker``."""
    for child in psutil.Process(proc.pid).children(recursive=True):
        if any(marker in part for part in child.cmdline()):
            return child
    raise AssertionError(f"no child process running {marker}")


@pytest.fixture()
def node(tmp_path: Path, tiny_model_dir: Path):
    data = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SAPO_NET__ENABLED": "true"}
    argv = [sys.executable, "-m", "sapo_node.cli", "start", "--json-logs"]
    argv += ["--config", str(_config(tmp_path, tiny_model_dir)), "--data-dir", str(data)]
    argv += ["--status-listen", "127.0.0.1:0", "--swarm", f"status-{os.getpid()}"]
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        yield proc, data, tiny_model_dir
    finally:
        if proc.poll() is None:  # the test failed midway: let go of what it stopped, kill
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.send_signal(signal.SIGCONT)
            proc.kill()
        proc.communicate(timeout=30)


def test_metrics_status_healthz_and_the_status_command(node, capsys) -> None:
    proc, data, model_dir = node
    _wait(lambda: (data / "status.json").exists(), 120, "status.json", proc)
    base = json.loads((data / "status.json").read_text())["url"]
    assert base.startswith("http://127.0.0.1:")
    _wait(lambda: _status(base)["round"] >= 2, 120, "2 rounds", proc)

    code, body = _get(f"{base}/metrics")
    assert code == 200
    metrics = {
        s.name: s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if not s.labels or s.name == "sapo_info"
    }
    assert metrics["sapo_round"] >= 2
    for name in (
        "sapo_reward",
        "sapo_cumulative_reward",
        "sapo_pool_groups",
        "sapo_peers",
        "sapo_net_published_total",
        "sapo_net_sent_bytes_total",
        "sapo_resident_memory_bytes",
        "sapo_last_round_timestamp_seconds",
    ):
        assert name in metrics, name
    assert metrics["sapo_healthy"] == 1.0 and metrics["sapo_resident_memory_bytes"] > 2**20
    phases = {
        s.labels["phase"]
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if s.name == "sapo_phase_seconds"
    }
    every = {"generate", "score", "screen", "train", "round"}
    assert every <= phases <= every | {"eval"}  # eval: a round that ran the held-out set

    facts = _status(base)
    assert facts["role"] == "node" and facts["model"] == str(model_dir)
    assert facts["peer_id"].startswith("12D3Koo") and facts["pid"] == proc.pid
    assert facts["round"] - 2 <= facts["last_round"]["round"] < facts["round"]
    assert facts["net"]["published"] >= 2 * 4 and facts["healthy"]  # 4 own groups a round
    assert _get(f"{base}/healthz")[0] == 200

    code, out, _ = _status_command(data, capsys)
    assert code == 0 and "rounds done" in out and out.rstrip().endswith("healthy"), out

    # The network process stopped: /healthz says so, and recovers when it goes on.
    net = _child(proc, "sapo_node.net.host")
    net.send_signal(signal.SIGSTOP)
    _wait(lambda: _get(f"{base}/healthz")[0] == 503, 30, "503 for the network", proc)
    problems = json.loads(_get(f"{base}/healthz")[1])["problems"]
    assert any(p.startswith("network process: silent") for p in problems), problems
    code, out, _ = _status_command(data, capsys)
    assert code == 1 and "UNHEALTHY: network process" in out
    net.send_signal(signal.SIGCONT)
    _wait(lambda: _get(f"{base}/healthz")[0] == 200, 30, "200 again", proc)

    # The verifier's worker stopped: the round loop waits in 'score' and /healthz says so.
    worker = _child(proc, "spawn_main")
    worker.send_signal(signal.SIGSTOP)
    _wait(lambda: _get(f"{base}/healthz")[0] == 503, 60, "503 for the round loop", proc)
    problems = json.loads(_get(f"{base}/healthz")[1])["problems"]
    assert any("round loop" in p and "'score'" in p for p in problems), problems
    worker.send_signal(signal.SIGCONT)
    _wait(lambda: _get(f"{base}/healthz")[0] == 200, 60, "200 again", proc)

    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert not (data / "status.json").exists()
    code, _, err = _status_command(data, capsys)
    assert code == 1 and "no sapo-node is running with data directory" in err


def test_polling_status_while_distrust_expires_leaves_the_rounds_running(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Issue 47: the status endpoint's thread asks the defences who is distrusted while
    the round loop reads and changes the same records (``Defence.suspects``, the screen).
    The node starts with the most records the defences keep (peers-defence.json, as a node
    restarts with it), every one distrusted until a moment of the next seconds, so
    distrust ends all through the rounds while clients ask for /status as fast as they
    can, with threads switching often. Every round runs and every answer is whole."""
    import sys
    import threading

    from sapo_node.build import build_node
    from sapo_node.config import load_config
    from sapo_node.intake import peerstate
    from sapo_node.intake.defence import MAX_TRACKED
    from sapo_node.ops.status import Status, StatusServer
    from tests.support.nodes import sevens_overrides

    data, rounds, clients = tmp_path / "n", 10, 4
    data.mkdir()
    now = time.time()
    authors = [f"peer-{i}" for i in range(MAX_TRACKED)]
    start, spread = 2.0, 4.0  # s: distrust ends from then, one peer after another
    peerstate.save(
        data / peerstate.DEFENCE_FILE,
        "defence",
        {
            "history": {a: ["0" * 256, now] for a in authors},  # a full record each
            "distrusted": {
                a: now + start + spread * i / len(authors) for i, a in enumerate(authors)
            },
        },
    )
    overrides = sevens_overrides(
        tiny_model_dir,
        data,
        node={"rounds": rounds, "min_round_s": (start + spread) / (rounds - 1)},
        generation={"max_new_tokens": 4, "completions_per_task": 4},
        train={"local_groups": 2, "external_groups": 2},
        defence={"enabled": True},
    )
    node = build_node(load_config(overrides=overrides, environ={}))
    assert node.defence is not None and node.defence.distrusted_now()  # still, mostly
    server = StatusServer("127.0.0.1:0")
    server.serve(Status(node.config, node=node))
    answers: list[int] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            code, body = _get(f"{server.url}/status")
            answers.append(code)
            if code == 200:
                json.loads(body)

    pollers = [threading.Thread(target=poll, daemon=True) for _ in range(clients)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for p in pollers:
            p.start()
        ran = node.run()
    finally:
        sys.setswitchinterval(interval)
        done.set()
        for p in pollers:
            p.join(timeout=30)
        server.close()
        node.close()
    assert ran == rounds
    assert len(answers) > 10 and set(answers) == {200}, answers[-5:]
    assert not node.defence.distrusted_now()  # it all ended during the rounds
