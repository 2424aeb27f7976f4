"""What merging a group's identical completions saves in a training step, on real groups.

``groups.training_set`` turns a group's identical completions (same tokens, advantage and
taught flags) into one ``Sample`` with ``copies``: one forward and backward for the
gradient of them all. This measures it on the completions a run's nodes wrote: the
peers' groups kept in a JSON-lines sample (``scripts/peer_tokens.py --sample``; default
docs/results/screening-cpu/peer-completions.jsonl, the evidence setting: the embedded
model, 8 completions of at most 48 tokens), grouped as the pools held them, only those
with signal, 4 groups to a step as a 2/2 round trains them. For each step, in one process
and interleaved (merged first in odd repeats): seconds of ``Trainer.step`` on the merged
samples and on one sample per completion (``copies`` undone), each from the same weights
and optimiser state. Prints one JSON object: the samples a step trains either way, the
seconds, their ratio, and the largest difference between the two ways' gradients (from
``Trainer.gradients``, beside the largest gradient).

    python scripts/bench_merge.py [--steps 8] [--repeats 3] [--model DIR]
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sapo_node.groups import training_set  # noqa: E402
from scripts.support.sample_setup import parser, trainer_and_groups  # noqa: E402


def main() -> None:
    args = parser(__doc__, 4).parse_args()
    with tempfile.TemporaryDirectory() as cache:
        trainer, groups = trainer_and_groups(args, Path(cache))
        policy = trainer.policy
        start = copy.deepcopy((trainer.policy.trainable_state(), trainer.optimizer.state_dict()))
        seconds: dict[str, list[float]] = {"merged": [], "each": []}
        rows = {"merged": 0, "each": 0}
        worst, largest = 0.0, 0.0
        for step in range(args.steps):
            batch = training_set(groups[4 * step : 4 * step + 4], "std")
            if not batch.samples:
                break
            each = [replace(s, copies=1) for s in batch.samples for _ in range(s.copies)]
            runs = {"merged": batch.samples, "each": each}
            rows["merged"] += len(batch.samples)
            rows["each"] += len(each)
            grads = {}
            for name, samples in runs.items():
                policy.load_trainable_state(start[0])
                trainer.gradients(
                    samples, batch_rows=batch.batch_rows, batch_tokens=batch.batch_tokens
                )
                grads[name] = [p.grad.clone() for p in policy.trainable_parameters()]
            for a, b in zip(grads["merged"], grads["each"], strict=True):
                worst = max(worst, float((a - b).abs().max()))
                largest = max(largest, float(b.abs().max()))
            for rep in range(args.repeats):
                for name in ("merged", "each") if rep % 2 else ("each", "merged"):
                    policy.load_trainable_state(start[0])
                    trainer.optimizer.load_state_dict(copy.deepcopy(start[1]))
                    t0 = time.perf_counter()
                    trainer.step(
                        runs[name], batch_rows=batch.batch_rows, batch_tokens=batch.batch_tokens
                    )
                    seconds[name].append(time.perf_counter() - t0)
    merged, each = statistics.median(seconds["merged"]), statistics.median(seconds["each"])
    print(
        json.dumps(
            {
                "model": args.model,
                "signal_groups": len(groups),
                "steps": len(seconds["merged"]) // args.repeats,
                "samples_merged": rows["merged"],
                "samples_each": rows["each"],
                "seconds_merged_median": round(merged, 4),
                "seconds_each_median": round(each, 4),
                "merged_over_each": round(merged / each, 3),
                "max_gradient_difference": worst,
                "max_gradient": largest,
            }
        )
    )


if __name__ == "__main__":
    main()
