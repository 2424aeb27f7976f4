"""How much GRPO signal a lone, untrained node gets at round 0, per task setting.

For each candidate setting of basic_arithmetic, a node of an experiment file's base
config (the embedded model by default) generates and scores round 0 of several node
seeds, training nothing, through the real ``Node.run_round``. Prints one row a setting:
the share of groups whose rewards differ (signal), whose completions are all wrong, and
the mean reward and answer-tag rate. Used to choose the signal-scarce setting of
docs/results/evidence-cpu/ (its table there is this script's output).

Usage: python scripts/signal_probe.py [--experiment configs/experiments/cpu.toml]
           [--groups 16] [--seeds 2] [--setting NAME ...] [--json OUT.jsonl]
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

# name -> basic_arithmetic config (one level: the config as it is)
SETTINGS: dict[str, dict] = {
    "2t-1d-plus": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                   "operators": ["+"]},
    "2t-1-2d-plus": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2,
                     "operators": ["+"]},
    "2t-2d-plus": {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2,
                   "operators": ["+"]},
    "2t-2d-plusminus": {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2,
                        "operators": ["+", "-"]},
    "2-3t-1d-plusminus": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1,
                          "operators": ["+", "-"]},
    "3t-1d-plus": {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1,
                   "operators": ["+"]},
}  # fmt: skip
FIXED = {"allow_parentheses": True, "allow_negation": False}


def probe(spec_path: Path, setting: dict, groups: int, seed: int, data_dir: Path) -> dict:
    """Round 0 of one lone node on ``setting``: its metrics row."""
    from sapo_node.build import build_node
    from sapo_node.config import Config, _deep_merge
    from sapo_node.experiment import load_spec, node_seed

    spec = load_spec(spec_path)
    family = {"name": "basic_arithmetic", "config": {**FIXED, **setting}, "levels": [{}]}
    forced = {
        "node": {"data_dir": str(data_dir), "seed": node_seed(spec, seed), "threads": 1},
        "tasks": {"families": [family]},
        "train": {"enabled": False, "local_groups": groups, "external_groups": 0},
        "curriculum": {"enabled": False},
        "net": {"enabled": False},
        "defence": {"enabled": False},
    }
    node = build_node(Config.model_validate(_deep_merge(spec.base, forced)))
    try:
        return node.run_round(0)
    finally:
        node.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", type=Path, default=Path("configs/experiments/cpu.toml"))
    parser.add_argument("--groups", type=int, default=16, help="groups per node seed")
    parser.add_argument("--seeds", type=int, default=2, help="node seeds (indices 0..N-1)")
    parser.add_argument("--setting", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--json", type=Path, help="append each row here as JSON")
    args = parser.parse_args()

    from sapo_node.logs import configure_logging

    configure_logging(level=logging.WARNING)
    print("| setting | groups | with signal | all wrong | reward | answer tags | s |")
    print("|---|---|---|---|---|---|---|")
    for name in args.setting:
        rows, t0 = [], time.monotonic()
        for seed in range(args.seeds):
            with tempfile.TemporaryDirectory() as tmp:
                rows.append(probe(args.experiment, SETTINGS[name], args.groups, seed, Path(tmp)))
        n = sum(r["groups/local"] for r in rows)
        signal = sum(r["groups/trained"] for r in rows)
        wrong = sum(r.get("groups/local_all_wrong", float("nan")) for r in rows)
        reward = sum(r["reward/mean"] * r["groups/local"] for r in rows) / n
        tags = sum(r["rollout/answer_tag_rate"] * r["groups/local"] for r in rows) / n
        seconds = time.monotonic() - t0
        print(
            f"| {name} | {n} | {signal / n:.0%} | {wrong / n:.0%} | {reward:.3f} | {tags:.0%} "
            f"| {seconds:.0f} |",
            flush=True,
        )
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps({"setting": name, "config": SETTINGS[name], "rows": rows}))
                f.write("\n")


if __name__ == "__main__":
    main()
