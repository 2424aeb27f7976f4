"""scripts/bench_round.py still runs (generation, training, the RSS and heap steps) on the
tiny model.

Every mode runs in one Python process, one after another, each as the script runs from a
command line (tests/support/scripts.py: a process's start-up costs more than a mode on the
tiny model). The RSS step goes first, so its peak is of that step alone, as in a fresh
process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.scripts import run_in_one_process

ROOT = Path(__file__).resolve().parents[2]

CASES = [
    (["--rss-step", "new"], ["new: peak RSS after loading"]),
    (["--skip-rounds"], ["forced lengths", "ratio node/plain (float32)", "natural lengths"]),
    (["--training-only"], ["max abs gradient difference", "s/step: old", "optimiser step"]),
    (["--heap-steps", "2"], ["step 1:", "peak"]),
    (["--heap-steps", "2", "--compare-threshold", "1048576"], ["total: generate"]),
]


@pytest.mark.timeout(300)
def test_the_round_benchmark_runs_each_mode(tiny_model_dir: Path, tmp_path: Path) -> None:
    runs = [
        ["--model", str(tiny_model_dir), "--data-dir", str(tmp_path / f"data-{i}"),
         "--repeats", "1", *args]
        for i, (args, _) in enumerate(CASES)
    ]  # fmt: skip
    results, stderr = run_in_one_process(
        ROOT / "scripts" / "bench_round.py", runs, tmp_path / "out", ROOT, timeout=280
    )
    for (args, expected), (rc, out) in zip(CASES, results, strict=True):
        assert rc == 0, (args, out, stderr[-4000:])
        for text in expected:
            assert text in out, (args, out)
