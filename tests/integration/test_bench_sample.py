"""scripts/bench_sample.py runs on the tiny model over the committed peers' completions:
k of each group's completions train fewer sequences than all of them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_sample_benchmark_trains_k_of_each_group(tiny_model_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_sample.py"), "--model", str(tiny_model_dir),
         "--steps", "2", "--repeats", "1", "--k", "2"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["steps"] == 2 and report["prompt_tokens_mean"] > 0
    every, two = report["per_k"]["0"], report["per_k"]["2"]
    assert two["sequences"] == 2 * 2 * 2 < every["sequences"]  # 2 steps of 2 groups
    assert every["over_all"] == 1.0 and two["seconds_median"] > 0
