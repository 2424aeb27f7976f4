"""scripts/bench_round.py still runs (generation, training, the RSS and heap steps) on the
tiny model.

Every mode runs in one Python process, one after another, each as the script runs from a
command line (``runpy`` as ``__main__``, its own ``sys.argv`` and data directory): a
process's start-up (torch, transformers) costs more than a mode on the tiny model. The
RSS step goes first, so its peak is of that step alone, as in a fresh process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_round.py"

CASES = [
    (["--rss-step", "new"], ["new: peak RSS after loading"]),
    (["--skip-rounds"], ["forced lengths", "ratio node/plain (float32)", "natural lengths"]),
    (["--training-only"], ["max abs gradient difference", "s/step: old", "optimiser step"]),
    (["--heap-steps", "2"], ["step 1:", "peak"]),
    (["--heap-steps", "2", "--compare-threshold", "1048576"], ["total: generate"]),
]

# Runs each case's command line in turn; writes its stdout and exit status to OUT/<i>.out
# and OUT/<i>.rc (a case that fails leaves its traceback there and the next still runs).
DRIVER = """
import contextlib, json, runpy, sys, traceback
script, out, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
for i, argv in enumerate(cases):
    rc = 0
    with open(f"{out}/{i}.out", "w") as f, contextlib.redirect_stdout(f):
        sys.argv = [script, *argv]
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc(file=f)
            rc = 1
    open(f"{out}/{i}.rc", "w").write(str(rc))
"""


@pytest.mark.timeout(300)
def test_the_round_benchmark_runs_each_mode(tiny_model_dir: Path, tmp_path: Path) -> None:
    cases = [
        ["--model", str(tiny_model_dir), "--data-dir", str(tmp_path / f"data-{i}"),
         "--repeats", "1", *args]
        for i, (args, _) in enumerate(CASES)
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(SCRIPT), str(tmp_path), json.dumps(cases)],
        capture_output=True, text=True, timeout=280, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for i, (args, expected) in enumerate(CASES):
        out = (tmp_path / f"{i}.out").read_text()
        rc = (tmp_path / f"{i}.rc").read_text()
        assert rc == "0", (args, out, done.stderr[-4000:])
        for text in expected:
            assert text in out, (args, out)
