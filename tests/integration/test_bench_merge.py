"""scripts/bench_merge.py runs on the tiny model over the committed peers' completions:
merging trains fewer samples than there are completions, for gradients within rounding."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_merge_benchmark_reports_fewer_samples_and_the_same_gradient(
    tiny_model_dir: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_merge.py"), "--model", str(tiny_model_dir),
         "--steps", "2", "--repeats", "1"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["steps"] == 2 and report["signal_groups"] > 8
    assert 0 < report["samples_merged"] < report["samples_each"]
    assert report["seconds_merged_median"] > 0 and report["seconds_each_median"] > 0
    # bfloat16 compute where the CPU has it: rounding of other batch shapes, nothing more
    assert report["max_gradient_difference"] <= 0.05 * report["max_gradient"]
