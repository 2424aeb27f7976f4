"""scripts/bench_round.py still runs (generation, training, the RSS and heap steps) on the
tiny model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--skip-rounds"], ["forced lengths", "ratio node/plain (float32)", "natural lengths"]),
        (["--training-only"], ["max abs gradient difference", "s/step: old", "optimiser step"]),
        (["--rss-step", "new"], ["new: peak RSS after loading"]),
        (["--heap-steps", "2"], ["step 1:", "peak"]),
        (["--heap-steps", "2", "--compare-threshold", "1048576"], ["total: generate"]),
    ],
)
def test_the_round_benchmark_runs(
    tiny_model_dir: Path, tmp_path: Path, args: list[str], expected: list[str]
) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_round.py"), "--model",
         str(tiny_model_dir), "--data-dir", str(tmp_path), "--repeats", "1", *args],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for text in expected:
        assert text in done.stdout, done.stdout
