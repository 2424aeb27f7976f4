"""scripts/bench_paths.py runs on the tiny model and reports, for every path, a finite
ratio against its plain path and the two's equivalence within its tolerance."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_paths  # noqa: E402


def test_the_paths_benchmark_reports_each_path(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "paths.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_paths.py"), "--model", str(tiny_model_dir),
         "--data-dir", str(tmp_path), "--repeats", "1", "--new-tokens", "4",
         "--equivalence-steps", "4", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    paths = report["paths"]
    assert set(bench_paths.PATHS) <= set(paths), sorted(paths)
    assert "decode_mask_one_length" in paths
    measured = 0
    for name, res in paths.items():
        if res.get("applies") is False:  # bfloat16 compute and packing need the CPU's support
            assert name in ("bf16_compute", "packed_weights") and report["machine"]["compute_dtype"]
            continue
        measured += 1
        assert math.isfinite(res["ratio"]) and res["ratio"] > 0, (name, res)
        assert len(res["ratios"]) == 1 and len(res["on"]) == len(res["off"]) == 1
        eq = res["equivalence"]
        assert math.isfinite(eq["relative"]) and eq["ok"], (name, eq)
        assert eq["tolerance"] == bench_paths.TOLERANCE[bench_paths.base_name(name)]
        if res["phase"] == "generation" and name != "bf16_compute":
            assert eq["tokens_identical"], (name, eq)  # same dtype: the same greedy tokens
        assert f"{name}: " in done.stdout
    assert measured >= len(bench_paths.PATHS) - 1  # all but what this CPU cannot do
    assert paths["compact_adam"]["state_mib"]["on"] < paths["compact_adam"]["state_mib"]["off"]
