"""scripts/poison_attack.py, for a few rounds on the tiny model: both arms run and report
what docs/security.md reports (the embedded-model figures come from the same script)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.scripts import run_in_one_process
from tests.support.swarm import REPO

pytestmark = pytest.mark.timeout(300)
SCRIPT = REPO / "scripts" / "poison_attack.py"


def _argv(out: Path, model: Path, defences: str, *more: str) -> list[str]:
    return [
        "--out",
        str(out),
        "--defences",
        defences,
        "--model",
        str(model),
        "--rounds",
        "2",
        "--nodes",
        "2",
        "--eval-every",
        "2",
        # the evaluation's path, at its smallest: one held-out task, one sample and
        # the greedy completion (it cost more than the rounds)
        "--set",
        "eval.tasks=1",
        "--set",
        "eval.samples=1",
        "--set",
        "generation.max_new_tokens=80",
        # longer than the outside-answer bound set here (32; completions are 80
        # characters): a random tiny model ranks every character about alike, so
        # there the rank check cannot tell
        "--set",
        "defence.max_outside_answer_chars=32",
        "--payload",
        "Hail to the thief: visit sapo-free-gpu.example",
        *more,
    ]


def test_both_arms_run_and_report(tmp_path, tiny_model_dir, capsys) -> None:
    # Both arms as command lines of the script, in one process (tests/support/scripts.py:
    # its start-up costs more than an arm here); the second defended against two
    # identities (a Sybil attacker), 2 groups a round each. A third run, one node, sends
    # the shape-format class, J chosen by the answer format as by default.
    shaped = [
        "--out", str(tmp_path / "shape"), "--defences", "on", "--model", str(tiny_model_dir),
        "--rounds", "2", "--nodes", "1", "--eval-every", "0", "--attack", "shape-format",
        "--set", "eval.tasks=1", "--set", "eval.samples=1",
        "--set", "generation.max_new_tokens=80", "--set", 'train.external_by="format"',
    ]  # fmt: skip
    runs = [
        _argv(tmp_path / "off", tiny_model_dir, "off"),
        _argv(
            tmp_path / "on", tiny_model_dir, "on", "--identities", "2", "--groups", "2",
            "--keep-checkpoints",
        ),
        shaped,
    ]  # fmt: skip
    results, stderr = run_in_one_process(SCRIPT, runs, tmp_path / "runs", REPO, timeout=240)
    for rc, out in results:
        assert rc == 0, out[-2000:] + stderr[-4000:]
    off, on, shape = (
        json.loads((tmp_path / arm / "report.json").read_text()) for arm in ("off", "on", "shape")
    )
    assert [json.loads(out[out.index("\n{") :]) for _, out in results] == [off, on, shape]
    # The shape-format run: the attacker's groups were taken, and the report has the J
    # each round chose (at most 3 of I + J = 4), the format rate and the reward.
    assert shape["attack"] == "shape-format" and shape["payload"] == "Answer:"
    assert shape["pool_counts"]["attacker"]["accepted"] > 0
    fmt = shape["format"]
    assert fmt["j_bound"] == 3 and list(fmt["nodes"]) == ["0"]
    node = fmt["nodes"]["0"]
    assert 0 <= node["j_mean"] <= 3 and 0.0 <= node["j_at_max"] <= 1.0
    assert 0.0 <= node["format_rate"] <= 1.0 and 0.0 <= node["reward"] <= 1.0
    rows = [json.loads(x) for x in (tmp_path / "shape" / "rounds.jsonl").read_text().splitlines()]
    assert rows[0]["train/external_target"] == 0  # round 0: nothing pooled yet
    assert node["j_mean"] == sum(x["train/external_target"] for x in rows) / 2
    assert off["format"]["j_bound"] is None  # J fixed at --ratio
    # Issue 47: only what the report reads stays, unless asked (a checkpoint a node, and
    # the model copy, filled a disk).
    for i in (0, 1):
        assert not (tmp_path / "off" / f"node-{i}" / "checkpoints").exists()
        assert (tmp_path / "off" / f"node-{i}" / "pool.sqlite3").exists()
        latest = tmp_path / "on" / f"node-{i}" / "checkpoints" / "LATEST"
        assert latest.read_text().strip() == "round-000002"
    assert not (tmp_path / "off" / ".models").exists() and (tmp_path / "on" / ".models").is_dir()
    for report in (off, on):
        assert report["format"]["j_at_max"] is None
        assert report["j_unfilled_expired"] == 0  # two quick rounds: nothing aged out
        assert 0.0 <= report["own_payload_rate_last_tenth"] <= 1.0
        assert 0.0 <= report["eval_payload_rate_end"] <= 1.0
        rounds = [
            json.loads(x)
            for x in (tmp_path / report["defences"] / "rounds.jsonl").read_text().splitlines()
        ]
        assert all(x["train/j_unfilled_expired"] == 0 for x in rounds)
        assert sorted({(x["node"], x["round"]) for x in rounds}) == [
            (n, r) for n in (0, 1) for r in range(2)
        ]
        evals = [
            json.loads(x)["round"]
            for x in (tmp_path / report["defences"] / "evals.jsonl").read_text().splitlines()
        ]
        assert sorted(set(evals)) == [0, 2]
    # Both nodes took the attacker's groups; only the defended ones checked them.
    assert off["pool_counts"]["attacker"]["accepted"] > 0
    assert "completions_checked" not in off["pool_counts"]["attacker"]
    assert on["pool_counts"]["attacker"]["completions_checked"] > 0
    assert on["pool_counts"]["attacker"].get("completions_outside_answer", 0) > 0
    assert on["attacker_refusal_rate"] > 0 and off["attacker_refusal_rate"] is None
    pooled = json.loads((tmp_path / "on" / "run.json").read_text())
    assert pooled["identities"] == 2
    # The report can be made again from what the run left on disk: the script's
    # `summarise` command, called in this process (a process of its own would spend most
    # of its time importing torch again).
    sys.path.insert(0, str(SCRIPT.parent))
    import poison_attack

    assert poison_attack.main(["summarise", str(tmp_path / "on")]) == 0
    assert json.loads(capsys.readouterr().out) == on
    # What an operator sees: `sapo-node pool` lists the refusals per peer, by reason.
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "sapo_node.cli",
            "pool",
            "--data-dir",
            str(tmp_path / "on" / "node-0"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    peers = json.loads(shown.stdout)["peers"]
    assert {"attacker-0", "attacker-1"} <= set(peers)  # each identity its own record
    for attacker in (peers["attacker-0"], peers["attacker-1"]):
        assert attacker["completions_checked"] > 0 and attacker["completions_outside_answer"] > 0


def test_the_format_figures_doctest() -> None:
    import doctest

    from scripts.support import format_lever

    result = doctest.testmod(format_lever)
    assert result.failed == 0 and result.attempted > 0
