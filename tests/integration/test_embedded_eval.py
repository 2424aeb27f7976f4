"""The held-out evaluation on the embedded real model (slow: a few minutes on a CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_embedded_model_eval_command(tmp_path: Path) -> None:
    """`sapo-node eval` on the untrained embedded model: arithmetic at its easiest has
    signal (REASONING_GYM.md: about 20% correct with the one-shot prompt)."""
    config = tmp_path / "eval.toml"
    config.write_text(
        "[[tasks.families]]\n"
        'name = "basic_arithmetic"\n'
        "levels = [{}]\n"
        "config = { min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 1, "
        'operators = ["+"] }\n'
        "[eval]\ntasks = 16\nsamples = 2\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "sapo_node.cli", "eval", "--config", str(config)]
    cmd += ["--data-dir", str(tmp_path / "d"), "--device", "cpu", "--json"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert "untrained" in report["evaluated"]
    assert report["eval/tasks"] == 16 and report["eval/samples"] == 2
    assert 0.0 < report["eval/answer_tag_rate"] <= 1.0
    assert 0.0 <= report["eval/pass1"] <= 1.0 and 0.0 <= report["eval/greedy"] <= 1.0
    assert report["eval/pass1"] + report["eval/greedy"] > 0  # the model has signal here
    assert "eval/greedy/basic_arithmetic" in report
