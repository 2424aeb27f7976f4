"""scripts/bench_scale.py still runs: two lightweight members, one topic and two shards,
each arm measured (no warm-up, a short idle window) and fitted."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_the_scale_benchmark_runs_both_arms(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_scale.py"), "--nodes", "2,3",
         "--seconds", "1", "--idle-seconds", "0.2", "--warm-seconds", "0", "--round-s", "1",
         "--arms", "single,sharded", "--shards", "2", "--shards-joined", "2",
         "--shard-members", "0", "--settle-s", "5", "--log", str(tmp_path / "net.log")],
        capture_output=True, text=True, timeout=170, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    points = {(p["arm"], p["nodes"]): p for p in result["points"]}
    assert set(points) == {(a, n) for a in ("single", "sharded") for n in (2, 3)}
    assert points[("single", 2)]["shards"] == 1 and points[("sharded", 2)]["shards"] == 2
    for p in points.values():
        assert len(p["per_node"]) == p["nodes"] and p["banned"] == 0
        for node in p["per_node"]:
            assert math.isfinite(node["cpu"]) and node["bytes_in_s"] >= 0
            assert 0 <= node["idle_cpu"] < math.inf
    # one topic: every member hears the others
    assert all(n["groups_s"] > 0 for n in points[("single", 3)]["per_node"])
    for arm in ("single", "sharded"):
        assert math.isfinite(result["model"][arm]["cpu"]["b"])
