"""Two runs of one experiment configuration compared node by node, as the evidence
experiment's pre-registered rule reads them (docs/results/evidence-cpu/PREREGISTRATION.md):
cumulative reward of own completions, paired by node seed, exact sign-flip p, the ratio of
each replicate swarm, the rule's verdict; the same per second of each node's compute
(``compute_s``, or the wall seconds of its phases in older rows); held-out greedy accuracy
at the end, paired.

    python scripts/compare_runs.py TREATMENT_DIR BASELINE_DIR [--nodes 8 --per-swarm 4 --rounds 40]

Each DIR holds node-0 ... node-N (metrics.jsonl, eval.jsonl), e.g. an experiment's 2-2/.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sapo_node.experiment.analysis import compute_seconds, conclusion  # noqa: E402
from sapo_node.experiment.significance import sign_flip_p  # noqa: E402
from sapo_node.experiment.spec import EvalLog  # noqa: E402
from sapo_node.metrics import read_metrics  # noqa: E402


def cumulative(d: Path, nodes: int, rounds: int, key=lambda row: row["reward/mean"]):
    """Per node, the sum of ``key`` over rounds 0..rounds-1 (reward by default)."""
    out = []
    for i in range(nodes):
        rows = {int(r["round"]): r for r in read_metrics(d / f"node-{i}" / "metrics.jsonl")}
        if set(range(rounds)) - set(rows):
            raise SystemExit(f"{d}/node-{i}: rounds missing")
        out.append(sum(float(key(rows[r])) for r in range(rounds)))
    return out


def greedy_at(d: Path, nodes: int, rounds: int) -> list[float]:
    out = []
    for i in range(nodes):
        ends = [e for e in EvalLog(d / f"node-{i}" / "eval.jsonl").read() if e["round"] == rounds]
        if not ends:
            raise SystemExit(f"{d}/node-{i}: no evaluation at round {rounds}")
        out.append(float(ends[-1]["eval/greedy"]))
    return out


def compare(a_dir: Path, b_dir: Path, nodes: int, per_swarm: int, rounds: int) -> dict:
    a, b = cumulative(a_dir, nodes, rounds), cumulative(b_dir, nodes, rounds)
    p = sign_flip_p([x - y for x, y in zip(a, b, strict=True)])
    swarms = range(0, nodes, per_swarm)
    replicates = [sum(a[k : k + per_swarm]) / sum(b[k : k + per_swarm]) for k in swarms]
    ga, gb = greedy_at(a_dir, nodes, rounds), greedy_at(b_dir, nodes, rounds)
    # per compute-second: each node's reward over its compute (analysis.compute_seconds)
    ca = cumulative(a_dir, nodes, rounds, compute_seconds)
    cb = cumulative(b_dir, nodes, rounds, compute_seconds)
    ra, rb = (
        [x / c for x, c in zip(a, ca, strict=True)],
        [y / c for y, c in zip(b, cb, strict=True)],
    )
    p_rate = sign_flip_p([x - y for x, y in zip(ra, rb, strict=True)])
    rate_reps = [
        (sum(a[k : k + per_swarm]) / sum(ca[k : k + per_swarm]))
        / (sum(b[k : k + per_swarm]) / sum(cb[k : k + per_swarm]))
        for k in swarms
    ]
    rate_a, rate_b = sum(a) / sum(ca), sum(b) / sum(cb)
    return {
        "cumulative_reward": [round(sum(a), 2), round(sum(b), 2)],
        "ratio": round(sum(a) / sum(b), 3),
        "p": round(p, 4),
        "pairs_favouring_treatment": sum(x > y for x, y in zip(a, b, strict=True)),
        "replicate_ratios": [round(r, 3) for r in replicates],
        "verdict": conclusion(p, sum(a), replicates, sum(b)),
        "greedy_end": [round(sum(ga) / nodes, 4), round(sum(gb) / nodes, 4)],
        "greedy_p": round(sign_flip_p([x - y for x, y in zip(ga, gb, strict=True)]), 4),
        "compute_seconds": [round(sum(ca), 1), round(sum(cb), 1)],
        "ratio_per_compute_s": round(rate_a / rate_b, 3),
        "p_per_compute_s": round(p_rate, 4),
        "replicate_ratios_per_compute_s": [round(r, 3) for r in rate_reps],
        "verdict_per_compute_s": conclusion(p_rate, rate_a, rate_reps, rate_b),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("treatment", type=Path)
    parser.add_argument("baseline", type=Path)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--per-swarm", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    result = compare(args.treatment, args.baseline, args.nodes, args.per_swarm, args.rounds)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
