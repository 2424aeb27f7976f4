"""What training only k of a peer group's completions saves in a step, on real groups.

``train.external_completions = k`` trains a stratified, weighted sample of k of each
peer group's completions (``groups.stratified``). A group's completions train after one
shared prompt row (the trainer packs them), so the saving is less than k/8 when the
prompt is long beside the completions. This measures it on the peers' groups with signal
of a run's sample (scripts/support/sample_setup.py's ``signal_groups``; default the evidence
setting's, docs/results/screening-cpu/peer-completions.jsonl), 2 groups to a step as a
2/2 round's peers' part trains: seconds of ``Trainer.step`` with every completion and
with k of them, each from the same weights and optimiser state, interleaved in rotating
order, in one process. Prints one JSON object: per k, the sequences a step trains, the
median seconds and their ratio to training all; and the mean prompt and completion
tokens of the groups.

    python scripts/bench_sample.py [--k 4 2] [--steps 8] [--repeats 3] [--model DIR]
"""

from __future__ import annotations

import copy
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sapo_node.groups import training_set  # noqa: E402
from scripts.support.sample_setup import parser, trainer_and_groups  # noqa: E402


def report(args, ks: list[int], seconds: dict, sequences: dict, used: list) -> dict:
    """The figures: the groups' sizes, and per k its sequences and median step seconds,
    against every completion's (k = 0)."""
    all_s = statistics.median(seconds[0])
    return {
        "model": args.model,
        "steps": len(seconds[0]) // args.repeats,
        "prompt_tokens_mean": round(statistics.mean(len(g.prompt_ids) for g in used), 1),
        "completion_tokens_mean": round(
            statistics.mean(len(c) for g in used for c in g.completion_ids), 1
        ),
        "completions_per_group_mean": round(
            statistics.mean(len(g.completion_ids) for g in used), 2
        ),
        "per_k": {
            str(k): {
                "sequences": sequences[k],
                "seconds_median": round(statistics.median(seconds[k]), 4),
                "over_all": round(statistics.median(seconds[k]) / all_s, 3),
            }
            for k in ks
        },
    }


def main() -> None:
    ap = parser(__doc__, 2)
    ap.add_argument("--k", type=int, nargs="+", default=[4, 2], help="completions per group")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        trainer, groups = trainer_and_groups(args, Path(cache))
        policy = trainer.policy
        groups = [replace(g, origin="peer") for g in groups]
        start = copy.deepcopy((trainer.policy.trainable_state(), trainer.optimizer.state_dict()))
        ks = [0, *args.k]  # 0: every completion
        seconds: dict[int, list[float]] = {k: [] for k in ks}
        sequences = dict.fromkeys(ks, 0)
        used = groups[: 2 * args.steps]
        for step in range(args.steps):
            pair = groups[2 * step : 2 * step + 2]
            if len(pair) < 2:
                break
            batches = {
                k: training_set(pair, "std", external_completions=k, rng=random.Random(step))
                for k in ks
            }
            for k, batch in batches.items():
                sequences[k] += sum(s.copies for s in batch.samples)
            for rep in range(args.repeats):
                for k in ks[rep % len(ks) :] + ks[: rep % len(ks)]:
                    batch = batches[k]
                    policy.load_trainable_state(start[0])
                    trainer.optimizer.load_state_dict(copy.deepcopy(start[1]))
                    t0 = time.perf_counter()
                    trainer.step(
                        batch.samples, batch_rows=batch.batch_rows, batch_tokens=batch.batch_tokens
                    )
                    seconds[k].append(time.perf_counter() - t0)
    print(json.dumps(report(args, ks, seconds, sequences, used)))


if __name__ == "__main__":
    main()
