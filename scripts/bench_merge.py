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

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sapo_node.config import Config  # noqa: E402
from sapo_node.groups import Group, training_set  # noqa: E402
from sapo_node.tasks import build_messages  # noqa: E402
from sapo_node.train.policy import load_policy  # noqa: E402
from sapo_node.train.trainer import Trainer  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[1] / "docs/results/screening-cpu/peer-completions.jsonl"


def signal_groups(path: Path, policy, cfg: Config) -> list[Group]:
    """The sample's groups (pool, author, task), tokenised by ``policy``, with signal."""
    by_group: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        by_group[(row["pool"], row["author"], row["task"])].append(row)
    t, limit = cfg.tasks, cfg.generation.max_new_tokens
    out = []
    for (_, _, question), rows in by_group.items():
        if len({r["reward"] for r in rows}) < 2:
            continue
        prompt = policy.encode_chat(build_messages(question, t.system_prompt, t.one_shot))
        done = [policy.encode_completion(r["text"], r["finished"], limit) for r in rows]
        out.append(
            Group(
                None,
                prompt,
                [c.ids for c in done],
                [c.text for c in done],
                [r["finished"] for r in rows],
                [r["reward"] for r in rows],
            )
        )
    return out


def parser(doc: str, groups_per_step: int) -> argparse.ArgumentParser:
    """The options these training benchmarks share (this one's and bench_sample.py's)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--sample", type=Path, default=SAMPLE)
    ap.add_argument("--steps", type=int, default=8, help=f"steps of {groups_per_step} groups each")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="embedded", help="a model directory (tests: tiny)")
    ap.add_argument("--threads", type=int, default=1)
    return ap


def trainer_and_groups(args: argparse.Namespace, cache: Path) -> tuple[Trainer, list[Group]]:
    """The default config's trainer on ``args.model`` (one CPU thread per
    ``args.threads``) and the sample's groups with signal, tokenised by its policy."""
    torch.set_num_threads(args.threads)
    cfg = Config()
    policy = load_policy(
        args.model,
        device="cpu",
        dtype=cfg.model.dtype,
        lora=cfg.model.lora,
        cache_dir=cache,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        seed=0,
    )
    trainer = Trainer(policy, cfg.train, cfg.generation.max_new_tokens)
    return trainer, signal_groups(args.sample, policy, cfg)


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
