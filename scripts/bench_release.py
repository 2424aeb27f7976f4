"""A default node's rounds against an earlier release's, same seed, same machine.

Runs ``sapo-node start`` (default config, the swarm off, the embedded model unless
``--model``) from two source trees in turn, interleaved: the commit given as
``--baseline`` (exported with ``git archive``; default 7b8d534, the release before
issue 10's work) and this working tree. Each run trains ``--rounds`` rounds in a fresh
data directory with the same seed; all runs share one model cache, so the model is
de-quantised once. It prints, per tree, each round's seconds (``phase_s/round`` in
its metrics.jsonl, read in the current names whichever tree wrote it) and high-water RSS
(``memory/peak_rss_mb``), and then the ratio of the median
round times (rounds after the first, which also warms up) and the peak RSS of each.

With ``--rounds 100 --only current`` it is the memory series of issue 10: the node's
high-water RSS after each round, which must stay flat (within 5%) from round 5 on.

Usage: python scripts/bench_release.py [--baseline COMMIT] [--rounds 4] [--pairs 1]
           [--lora] [--model PATH] [--threads N] [--only baseline|current] [--data-dir DIR]
           [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sapo_node.metrics import read_metrics  # noqa: E402  (the baseline's old names too)

DEFAULT_BASELINE = "7b8d534"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="Commit to compare with.")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=1, help="Interleaved runs of each tree.")
    parser.add_argument("--lora", action="store_true", help="Train LoRA adapters (--lora).")
    parser.add_argument("--model", help="Model name or path (default: the embedded model).")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--threads", type=int, help="torch threads of each node (default: its own)."
    )
    parser.add_argument("--only", choices=["baseline", "current"])
    parser.add_argument(
        "--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "sapo-bench-release"
    )
    parser.add_argument("--json", type=Path, help="Also write the figures here.")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the first round also warms up)")

    args.data_dir.mkdir(parents=True, exist_ok=True)
    trees = {}
    if args.only != "current":
        trees["baseline"] = export(args.baseline, args.data_dir / "baseline-src")
    if args.only != "baseline":
        trees["current"] = ROOT
    cache = args.data_dir / "models"  # shared: the model is de-quantised once
    cache.mkdir(exist_ok=True)

    runs: dict[str, list[list[dict]]] = {name: [] for name in trees}
    for pair in range(args.pairs):
        for name, tree in trees.items():
            data = args.data_dir / f"{name}-{pair}"
            shutil.rmtree(data, ignore_errors=True)
            data.mkdir()
            (data / "models").symlink_to(cache)
            started = time.perf_counter()
            records = run_node(tree, data, args)
            took = time.perf_counter() - started
            print(f"{name} run {pair}: {len(records)} rounds in {took:.0f} s", flush=True)
            for r in records:
                print(
                    f"  round {r['round']:3d}  {r['phase_s/round']:6.1f} s  "
                    f"(generate {r.get('phase_s/generate', 0):5.1f}, "
                    f"train {r.get('phase_s/train', 0):5.1f})"
                    f"  {r.get('rollout/new_tokens', 0):5d} tokens  "
                    f"peak RSS {r['memory/peak_rss_mb']:6.0f} MiB",
                    flush=True,
                )
            runs[name].append(records)
    figures = summarise(runs)
    print(json.dumps(figures, indent=1))
    if args.json:
        report = {"args": vars(args), **figures, "runs": runs}
        args.json.write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    return 0


def export(commit: str, dest: Path) -> Path:
    """The tree of ``commit`` in ``dest`` (``git archive``: no worktree to clean up)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    done = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit], capture_output=True
    )
    if done.returncode != 0:
        sys.exit(f"cannot export {commit!r}: {done.stderr.decode(errors='replace').strip()}")
    archive = done.stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def run_node(tree: Path, data: Path, args: argparse.Namespace) -> list[dict]:
    """``sapo-node start`` from ``tree``'s sources for ``args.rounds`` rounds; its metrics."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SAPO_")},  # ours alone
        "PYTHONPATH": str(tree),  # ahead of the editable install of this tree
        "SAPO_NODE__DATA_DIR": json.dumps(str(data)),  # TOML values
        "SAPO_NODE__ROUNDS": str(args.rounds),
        "SAPO_NODE__SEED": str(args.seed),
        "SAPO_NODE__CHECKPOINT_EVERY": str(10 * args.rounds),
        "SAPO_NET__ENABLED": "false",
    }
    if "[status]" in (tree / "configs" / "default.toml").read_text(encoding="utf-8"):
        env["SAPO_STATUS__ENABLED"] = "false"
    if args.model:
        env["SAPO_MODEL__NAME"] = json.dumps(args.model)
    if args.threads:
        env["SAPO_NODE__THREADS"] = str(args.threads)
    code = (
        "import sys, sapo_node; print('sources:', sapo_node.__file__, file=sys.stderr, flush=True)"
        "\nfrom sapo_node.cli import main; main()"
    )
    command = [sys.executable, "-c", code, "start"]
    if args.lora:
        command.append("--lora")
    log = data / "node.log"
    with log.open("wb") as out:
        done = subprocess.run(command, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        sys.exit(f"the node from {tree} failed ({done.returncode}); see {log}")
    if f"sources: {tree.resolve() / 'sapo_node'}" not in log.read_text(encoding="utf-8"):
        sys.exit(f"the node did not run {tree}'s sources; see {log}")
    return read_metrics(data / "metrics.jsonl")


def summarise(runs: dict[str, list[list[dict]]]) -> dict:
    """Median round seconds after the first round, peak RSS, and the ratio of the two trees."""
    out: dict = {}
    for name, records in runs.items():
        later = [r["phase_s/round"] for run in records for r in run if r["round"] > 0]
        rss = [r["memory/peak_rss_mb"] for run in records for r in run]
        out[name] = {
            "median_round_s": statistics.median(later) if later else None,
            "peak_rss_mb": max(rss) if rss else None,
            "tokens_per_round": statistics.mean(
                r.get("rollout/new_tokens", 0) for run in records for r in run
            ),
        }
        series = [r["memory/peak_rss_mb"] for r in records[-1]]
        if len(series) > 5:
            out[name]["rss_growth_from_round_5"] = series[-1] / series[5] - 1
    if "baseline" in out and "current" in out:
        b, c = out["baseline"]["median_round_s"], out["current"]["median_round_s"]
        if b and c:
            out["speedup"] = b / c
    return out


if __name__ == "__main__":
    raise SystemExit(main())
