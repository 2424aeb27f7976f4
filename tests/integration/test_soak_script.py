"""scripts/soak.py, for a short time: two real nodes, one SIGKILLed and restarted; and
its options for harder runs refusing bad input."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.swarm import REPO, wait_until

pytestmark = pytest.mark.timeout(300)
SOAK = REPO / "scripts" / "soak.py"


def _left(out: Path) -> list[str]:
    """Processes still running with ``out`` in their command line."""
    left = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(out) in cmd:
            left.append(f"{p.pid} {cmd[:120]}")
    return left


def _soak(out: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, str(SOAK), "--out", str(out), "--nodes", "2", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_short_soak_kills_one_node_which_resumes_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    # n1's clock 2 minutes ahead, where scripts/clock_skew.c can be built
    skew = ["--skewed-peer", "120"] if shutil.which("cc") else []
    # once both run: a kill at 5 s (or once one has saved a checkpoint, 5 rounds: about
    # 2 s here), the end at 10 s, so no second kill; the soak then waits for the restarted
    # process's first round (about 20 s after the kill, loaded), which ends it
    proc = _soak(
        out,
        *("--kill-every", "5", "--duration", "10", "--tokens", "32"),
        *("--warmup", "0", "--settle", "5", "--sample-every", "2", *skew),
    )
    stdout, _ = proc.communicate(timeout=240)
    assert (out / "report.json").exists(), stdout
    rep = json.loads((out / "report.json").read_text())
    assert proc.returncode == (0 if rep["ok"] else 1), stdout
    assert not _left(out)  # every process it started has ended
    assert rep["kills"] == 1 and not rep["survivor_crashes"], stdout
    (restart,) = rep["restarts"]
    # it resumed from the checkpoint the killed process saved and went on from there
    assert restart["resumed"] and restart["resumed_round"] > 0, restart
    assert restart["resumed_round"] >= restart["last_checkpoint_logged"]
    for name, node in rep["nodes"].items():
        assert node["groups_published"] > 0 and not node["unable_to_publish"], (name, stdout)
        assert sum(node["received_by_others"].values()) > 0, (name, stdout)
        assert node["stop_exit_code"] == 0, (name, stdout)
        assert node["rss"]["peak_mb"] > 50
    assert rep["nodes"][restart["node"]]["processes"] == 2
    (survivor,) = (v for k, v in rep["nodes"].items() if k != restart["node"])
    rss = survivor["rss"]  # the restarted one may not have settled before the end
    assert rss["first_mb"] > 50 and rss["last_mb"] > 50 and rss["growth_pct"] is not None
    assert rep["targets"]["every_restart_resumed"]["ok"], stdout
    assert rep["targets"]["children_end_with_their_node"]["ok"], stdout
    if skew:  # its groups are taken all the same (SPEC.md, the clock rule)
        assert rep["targets"]["skewed_peer"]["ok"], stdout
    assert "restarts resumed: 1 of 1" in stdout
    assert len(json.loads((out / "state.json").read_text())["kills"]) == rep["kills"]


def test_an_interrupted_soak_leaves_no_process(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    proc = _soak(out, "--kill-every", "60", "--duration", "600")
    logs = [out / "nodes" / f"n{i}" / "node.0.log" for i in range(2)]
    try:
        assert wait_until(lambda: all(p.exists() for p in logs), 60), proc.stdout.read()
        time.sleep(1.0)
        assert _left(out)  # the nodes run
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert wait_until(lambda: not _left(out), 10), _left(out)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--partition-at", "60"], "--partition-at and --partition-for go together"),
        (["--partition-at", "60", "--partition-for", "10"], "--partition-for at least 40 s"),
        (
            ["--duration", "300", "--partition-at", "60", "--partition-for", "60"],
            "--partition-at + --partition-for + --heal-within must fit in --duration",
        ),
        (["--skewed-peer", "0"], "--skewed-peer must not be 0"),
    ],
)
def test_bad_options_for_a_harder_soak_are_refused_with_a_clear_line(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    soak = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "soak", soak)  # for its dataclasses
    spec.loader.exec_module(soak)
    with pytest.raises(SystemExit) as exc:
        soak.parse(["--out", "unused", *args])
    assert exc.value.code == 2
    assert says in capsys.readouterr().err
