"""scripts/bench_release.py still runs: a node of the earlier release and one of this
tree, each from its own sources, on the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_release_benchmark_runs_both_trees(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_release.py"), "--rounds", "2",
         "--model", str(tiny_model_dir), "--data-dir", str(tmp_path / "runs"),
         "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    for name in ("baseline", "current"):
        assert [r["round"] for r in report["runs"][name][0]] == [0, 1]
        assert report[name]["median_round_s"] > 0 and report[name]["peak_rss_mb"] > 0
        log = (tmp_path / "runs" / f"{name}-0" / "node.log").read_text()
        assert ("baseline-src" in log) == (name == "baseline")
    assert report["speedup"] > 0
