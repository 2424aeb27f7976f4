"""The embedded real model end to end (slow: minutes on a CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_embedded_model_runs_two_rounds_and_resumes(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    base = [
        sys.executable,
        "-m",
        "sapo_node.cli",
        "start",
        "--data-dir",
        str(tmp_path),
        "--local",
        "2",
        "--json-logs",
    ]
    first = subprocess.run(
        [*base, "--rounds", "2"], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert (tmp_path / "models" / "smollm2-135m-instruct" / "model.safetensors").is_file()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1]
    assert all(r["rollout/new_tokens"] > 0 and 0 <= r["reward/mean"] <= 1 for r in rows)
    ready = [json.loads(x) for x in first.stderr.splitlines() if '"node ready"' in x]
    assert ready and ready[0]["model"] == "embedded" and ready[0]["device"] == "cpu"

    again = subprocess.run(
        [*base, "--rounds", "3"], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "de-quantising" not in again.stderr  # the safetensors cache was used
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1, 2]
