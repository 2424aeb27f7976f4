"""scripts/bench_prefix.py runs on the tiny model over the committed peers' completions:
with the prompts' shared start computed once, a step computes fewer tokens, and its
gradients are those of computing it in every row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_prefix_benchmark_computes_fewer_tokens_for_the_same_gradients(
    tiny_model_dir: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_prefix.py"), "--model", str(tiny_model_dir),
         "--steps", "2", "--repeats", "1"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["steps"] == 2
    for case in ("whole", "k2"):
        assert 0 < report[case]["row_tokens_shared"] < report[case]["row_tokens_each_row"]
    assert report["k2"]["row_tokens_shared"] < report["whole"]["row_tokens_shared"]
    assert all(report[c]["ratio"] > 0 for c in ("whole", "k2", "ranks"))
    assert report["grad_max_abs_diff"] <= 1e-2 * report["grad_max_abs"]
