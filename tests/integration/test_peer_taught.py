"""scripts/peer_taught.py runs on the tiny model over the committed peers' completions:
the bound on the context teaches no token the rule before did not, and the two
screenings keep the same completions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_taught_measure_compares_the_bound_with_the_rule_before(tiny_model_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "peer_taught.py"), "--model", str(tiny_model_dir),
         "--groups", "6"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    now, before = report["default"], report["before"]
    assert report["groups"] == 6 and now["format_tokens"] == before["format_tokens"] > 0
    assert 0 <= now["format_taught"] <= before["format_taught"] <= before["format_tokens"]
    assert now["format_taught"] <= now["taught"] <= before["taught"]
    assert 0.0 <= report["above_mean_in_bound"] <= 1.0
