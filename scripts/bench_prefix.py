"""What computing the prompts' shared first tokens once a step saves, on real groups.

Every prompt starts with the same tokens (chat template, system prompt, worked example:
90 of the embedded model's ~105 with the default tasks); ``train.shared_prefix`` computes
them once per step and lets every prompt row read their keys and values, instead of
computing them again in each row. This measures it on the peers' groups with signal of
a run's sample (scripts/support/sample_setup.py's ``signal_groups``; default the evidence
setting's, docs/results/screening-cpu/peer-completions.jsonl), 4 groups to a step, in two
round shapes: ``whole`` (every completion of the 4 groups trains, as in today's 2/2 or a
4/0 round whose groups all have signal) and ``k2`` (2 groups whole and 2 peers' groups
of which 2 completions train, as with ``train.external_completions = 2``); and the
first-choices rank check over 2 whole groups (its forward pass without a gradient,
prefix shared or not: ``_states`` as ``Trainer.completion_ranks`` runs it). Each from
the same weights and optimiser state, with the prefix shared and not, interleaved in
alternating order, in one process. Prints one JSON object: per case the median seconds
either way and their ratio (shared over not), the tokens a step computes either way
(padding left out), and the largest difference between the two ways' gradients beside
the largest gradient.

    python scripts/bench_prefix.py [--steps 8] [--repeats 3] [--model DIR]
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

import torch  # noqa: E402

from sapo_node.groups import training_set  # noqa: E402
from sapo_node.train import grpo  # noqa: E402
from sapo_node.train.trainer import Trainer, _per_token, _with_head  # noqa: E402
from scripts.support.sample_setup import parser, trainer_and_groups  # noqa: E402


def row_tokens(trainer: Trainer, samples) -> int:
    """Tokens a step computes (padding left out): the shared prefix once, then in each
    micro-batch each distinct prompt's rest and each completion's input tokens."""
    n = len(trainer._shared_prefix(samples))
    out = n
    for idx, _ in trainer._micro_batches(samples, n):
        out += sum(len(p) - n for p in {tuple(samples[i].prompt_ids) for i in idx})
        out += sum(len(samples[i].completion_ids) - 1 for i in idx)
    return out


@torch.no_grad()
def ranks(trainer: Trainer, samples) -> None:
    """The rank check's forward passes and ranks, with the prefix shared when the
    trainer's settings share it (the node's check keeps whole prompts)."""
    shared = trainer._shared_prefix(samples)
    prefix = trainer._prefix(trainer.policy.model, shared)
    for _, mb in trainer._micro_batches(samples, len(shared)):
        states, head = trainer._states(trainer.policy.model, mb, prefix)
        _per_token(mb, states, _with_head(grpo.token_ranks, head))


def compare_gradients(ways: dict, start: tuple, batches: dict, tokens: dict) -> tuple[float, float]:
    """The gradients of the whole batch both ways, from ``start``: their largest difference
    and the largest gradient; each way's row tokens of every batch added to ``tokens``."""
    grads = {}
    for w, trainer in ways.items():
        trainer.policy.load_trainable_state(start[0])
        b = batches["whole"]
        trainer.gradients(b.samples, batch_rows=b.batch_rows, batch_tokens=b.batch_tokens)
        grads[w] = [p.grad.clone() for p in trainer.policy.trainable_parameters()]
        for c, batch in batches.items():
            tokens[c][w] += row_tokens(trainer, batch.samples)
    worst, largest = 0.0, 0.0
    for a, b in zip(grads["shared"], grads["each row"], strict=True):
        worst = max(worst, float((a - b).abs().max()))
        largest = max(largest, float(b.abs().max()))
    return worst, largest


def time_steps(
    ways: dict, start: tuple, batches: dict, checked: list, repeats: int, seconds: dict
) -> None:
    """Each way's training step on each batch from ``start``, and its ranks of ``checked``,
    ``repeats`` times, the ways' order reversed every repeat; seconds added to ``seconds``."""
    for rep in range(repeats):
        for w in list(ways)[:: 1 if rep % 2 else -1]:
            trainer = ways[w]
            for c, batch in batches.items():
                trainer.policy.load_trainable_state(start[0])
                trainer.optimizer.load_state_dict(copy.deepcopy(start[1]))
                t0 = time.perf_counter()
                trainer.step(
                    batch.samples, batch_rows=batch.batch_rows, batch_tokens=batch.batch_tokens
                )
                seconds[c][w].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ranks(trainer, checked)
            seconds["ranks"][w].append(time.perf_counter() - t0)


def main() -> None:
    args = parser(__doc__, 4).parse_args()
    with tempfile.TemporaryDirectory() as cache:
        on, groups = trainer_and_groups(args, Path(cache))
        policy = on.policy
        off = Trainer(
            policy,
            on.settings.model_copy(update={"shared_prefix": False}),
            on.max_new_tokens,
            on.temperature,
        )
        start = copy.deepcopy((policy.trainable_state(), on.optimizer.state_dict()))
        ways = {"shared": on, "each row": off}
        cases = ("whole", "k2", "ranks")
        seconds = {c: {w: [] for w in ways} for c in cases}
        tokens = {c: dict.fromkeys(ways, 0) for c in ("whole", "k2")}
        worst, largest, steps = 0.0, 0.0, 0
        for step in range(args.steps):
            four = groups[4 * step : 4 * step + 4]
            if len(four) < 4:
                break
            steps += 1
            peers = [replace(g, origin="peer") for g in four[2:]]
            batches = {
                "whole": training_set(four, "std"),
                "k2": training_set(
                    four[:2] + peers, "std", external_completions=2, rng=random.Random(step)
                ),
            }
            diff, scale = compare_gradients(ways, start, batches, tokens)
            worst, largest = max(worst, diff), max(largest, scale)
            checked = [s for s in batches["whole"].samples if s.prompt_ids in
                       (four[2].prompt_ids, four[3].prompt_ids)]  # fmt: skip
            time_steps(ways, start, batches, checked, args.repeats, seconds)
    report = {"model": args.model, "steps": steps}
    for c in cases:
        a, b = (statistics.median(seconds[c][w]) for w in ways)
        report[c] = {"shared_s": round(a, 4), "each_row_s": round(b, 4), "ratio": round(a / b, 3)}
        if c in tokens:
            report[c]["row_tokens_shared"] = tokens[c]["shared"]
            report[c]["row_tokens_each_row"] = tokens[c]["each row"]
    print(json.dumps(report | {"grad_max_abs_diff": worst, "grad_max_abs": largest}))


if __name__ == "__main__":
    main()
