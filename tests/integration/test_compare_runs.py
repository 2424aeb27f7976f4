"""scripts/compare_runs.py reproduces the evidence run's committed verdict from its data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "results" / "evidence-cpu"


def test_compare_runs_reproduces_the_evidence_verdict() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compare_runs.py"), str(RUN / "2-2"),
         str(RUN / "4-0")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    # docs/results/evidence-cpu/results.md: 79.54 against 64.41, p = 0.0078, 1.11x and 1.37x
    assert result["cumulative_reward"] == [79.54, 64.41]
    assert result["p"] == 0.0078 and result["pairs_favouring_treatment"] == 8
    assert result["replicate_ratios"] == [1.108, 1.365]
    assert result["verdict"] == "helped"
    assert result["greedy_end"] == [0.2109, 0.2422]
    # per second of the nodes' phases (rows from before compute_s: their wall seconds),
    # as docs/results/screening-cpu/README.md cites it: 1.11x, p = 0.086, not significant
    assert result["compute_seconds"] == [7806.5, 7007.8]
    assert result["ratio_per_compute_s"] == 1.109 and result["p_per_compute_s"] == 0.0859
    assert result["replicate_ratios_per_compute_s"] == [1.022, 1.193]
    assert result["verdict_per_compute_s"] == "no detectable difference"
