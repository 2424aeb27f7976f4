"""Benchmark the node's generation path and round overhead on the embedded model.

Prints, for the same batch on the same machine, in one process:
  1. tokens/s of the node's generation path (Policy.generate: every completion of the
     round in one left-padded batched call) vs plain ``model.generate`` called once per
     task with ``num_return_sequences=L`` (how a straightforward loop does it), and vs
     plain ``model.generate`` called with 2 completions at a time (the public reference
     implementation's habit). Lengths are forced (min_new_tokens = max_new_tokens) so
     that every variant produces the same number of tokens; the figures are ratios.
  2. a few real rounds of a Node: the share of wall time per round spent
     outside generate/score/train, and the peak RSS.
  3. training: seconds per training step (forward, backward, clip, AdamW step) of the
     node's path (each prompt once per micro-batch, its KV cache shared by its completions)
     vs the previous unshared step (each row carrying its prompt, tests/support/unshared.py)
     on the same samples, interleaved, and the max abs difference of their gradients.
     ``--rss-step new|old`` instead runs one training step alone and prints the peak RSS
     (run it in a fresh process per path).

Usage: python scripts/bench_round.py [--data-dir DIR] [--rounds 3] [--repeats 2]
       python scripts/bench_round.py --training-only [--repeats 3]
       python scripts/bench_round.py --rss-step new
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "sapo-bench")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--training-only", action="store_true")
    parser.add_argument("--rss-step", choices=["new", "old"])
    args = parser.parse_args()

    from sapo_node.logs import configure_logging

    configure_logging()
    if args.rss_step:
        measure_training_rss(args)
        return
    if not args.training_only:
        measure_generation(args)
        measure_rounds(args)
    measure_training(args)


def measure_generation(args: argparse.Namespace) -> None:
    from sapo_node.config import load_config
    from sapo_node.curriculum import Curriculum
    from sapo_node.policy import load_policy
    from sapo_node.tasks import build_messages, make_task

    cfg = load_config(environ={})
    gen = cfg.generation.model_copy(update={})
    policy = load_policy(
        "embedded",
        device="cpu",
        dtype="auto",
        lora=cfg.model.lora,
        cache_dir=args.data_dir / "models",
    )
    curriculum = Curriculum(cfg.tasks.families, cfg.curriculum)
    tasks = [make_task(r) for r in curriculum.sample(seed=7, round_=0, count=4)]
    prompts = [
        policy.encode_chat(build_messages(t.question, cfg.tasks.system_prompt, cfg.tasks.one_shot))
        for t in tasks
    ]
    n, new = gen.completions_per_task, gen.max_new_tokens
    model, tok = policy.model, policy.tokenizer
    print(
        f"batch: {len(prompts)} tasks x {n} completions, {new} new tokens each, "
        f"prompt {len(prompts[0])} tokens, torch threads {torch.get_num_threads()}"
    )

    def plain(per_call: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            for p in prompts:
                ids = torch.tensor([p])
                for _ in range(n // per_call):
                    model.generate(
                        ids,
                        attention_mask=torch.ones_like(ids),
                        do_sample=True,
                        num_return_sequences=per_call,
                        max_new_tokens=new,
                        min_new_tokens=new,
                        pad_token_id=tok.pad_token_id,
                    )
        return len(prompts) * n * new / (time.perf_counter() - start)

    def node_path() -> float:
        # The node's own call, with EOS suppressed so that it makes as many tokens.
        start = time.perf_counter()
        with torch.inference_mode():
            rows = [p for p in prompts for _ in range(n)]
            ids, mask = policy._left_pad(rows)
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=tok.pad_token_id,
            )
        return len(rows) * new / (time.perf_counter() - start)

    results: dict[str, list[float]] = {"node": [], "plain_per_task": [], "plain_2_at_a_time": []}
    for _ in range(args.repeats):  # interleaved, best of N: the machine is noisy
        results["node"].append(node_path())
        results["plain_per_task"].append(plain(n))
        results["plain_2_at_a_time"].append(plain(2))
    best = {k: max(v) for k, v in results.items()}
    for k, v in best.items():
        ratio = "" if k == "node" else f"   ratio node/{k}: {best['node'] / v:5.2f}x"
        print(f"  {k:18s} {v:7.1f} tok/s{ratio}")

    # Natural lengths through Policy.generate (rows stop at EOS): useful tokens per second.
    start = time.perf_counter()
    out = policy.generate(prompts, gen, n=n)
    useful = out.new_tokens / (time.perf_counter() - start)
    print(f"  node, natural lengths: {useful:.1f} useful tok/s ({out.new_tokens} tokens)")


def measure_rounds(args: argparse.Namespace) -> None:
    from sapo_node.config import load_config
    from sapo_node.node import Node

    run_dir = args.data_dir / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    shutil.copytree(args.data_dir / "models", run_dir / "models")
    node_cfg = load_config(
        overrides={
            "node": {
                "data_dir": str(run_dir),
                "rounds": args.rounds,
                "seed": 7,
                "checkpoint_every": 1000,
            }
        },
        environ={},
    )
    node = Node(node_cfg)
    try:
        node.run()
    finally:
        node.close()
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # Wall time of round k = time between the records of rounds k-1 and k: it includes
    # everything the loop does (task making, pool, records, logs, metrics fsync).
    wall = inside = 0.0
    for prev, r in zip(rows, rows[1:], strict=False):
        w = r["time"] - prev["time"]
        phases = r["t_generate"] + r["t_score"] + r["t_train"]
        wall, inside = wall + w, inside + phases
        print(
            f"  round {r['round']}: {w:.1f} s wall (generate {r['t_generate']:.1f}, "
            f"score {r['t_score']:.2f}, train {r['t_train']:.1f}), outside "
            f"{100 * (1 - phases / w):.2f}%"
        )
    print(f"share of round time outside generate/score/train: {100 * (1 - inside / wall):.2f}%")
    print(f"peak RSS: {max(r['peak_rss_mb'] for r in rows):.0f} MiB")


def _repo_on_path() -> None:
    """Make ``tests.support`` (the unshared reference step) importable."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _training_setup(args: argparse.Namespace):
    """The embedded model and a default-shaped round: 4 real prompts x 8 completions.

    Completions are random ordinary tokens of 18-42 tokens (~30, like real ones); the
    advantages are those of random 0/1 rewards, so every group has signal.
    """
    from sapo_node import grpo
    from sapo_node.config import load_config
    from sapo_node.curriculum import Curriculum
    from sapo_node.policy import load_policy
    from sapo_node.tasks import build_messages, make_task
    from sapo_node.trainer import Sample

    cfg = load_config(environ={})
    policy = load_policy(
        "embedded",
        device="cpu",
        dtype="auto",
        lora=cfg.model.lora,
        cache_dir=args.data_dir / "models",
    )
    curriculum = Curriculum(cfg.tasks.families, cfg.curriculum)
    tasks = [make_task(r) for r in curriculum.sample(seed=7, round_=0, count=4)]
    g = torch.Generator().manual_seed(0)
    n = cfg.generation.completions_per_task
    samples = []
    for t in tasks:
        prompt = policy.encode_chat(
            build_messages(t.question, cfg.tasks.system_prompt, cfg.tasks.one_shot)
        )
        rewards = torch.tensor([[1.0, 0.0] * (n // 2)])[:, torch.randperm(n, generator=g)]
        adv = grpo.group_advantages(rewards)[0].tolist()
        for a in adv:
            length = int(torch.randint(18, 43, (1,), generator=g))
            ids = torch.randint(100, policy.tokenizer.vocab_size, (length,), generator=g)
            samples.append(Sample(prompt, ids.tolist(), a))
    return cfg, policy, samples


def measure_training(args: argparse.Namespace) -> None:
    _repo_on_path()
    from sapo_node.trainer import Trainer
    from tests.support.unshared import unshared_backward

    cfg, policy, samples = _training_setup(args)
    s, new = cfg.train, cfg.generation.max_new_tokens
    prompt_tokens = sum(len(x.prompt_ids) for x in samples)
    completion_tokens = sum(len(x.completion_ids) for x in samples)
    groups = len({tuple(x.prompt_ids) for x in samples})
    dup = (prompt_tokens - prompt_tokens * groups // len(samples)) / (
        prompt_tokens + completion_tokens
    )
    print(
        f"training: {len(samples)} rows, prompts {len(samples[0].prompt_ids)} tokens, "
        f"completions {completion_tokens / len(samples):.1f} tokens on average, "
        f"micro_batch_size {s.micro_batch_size}; duplicate prompt tokens in the unshared "
        f"step: {100 * dup:.0f}%"
    )
    trainer = Trainer(policy, s, new, cfg.generation.temperature)
    params = trainer.params

    start = time.perf_counter()
    trainer.gradients(samples)
    t_new = time.perf_counter() - start
    shared = [p.grad.clone() for p in params]
    start = time.perf_counter()
    unshared_backward(policy, samples, s, new)
    t_old = time.perf_counter() - start
    print(f"  forward+backward only: old {t_old:.2f} s, new {t_new:.2f} s", flush=True)
    diff = max(float((a - p.grad).abs().max()) for a, p in zip(shared, params, strict=True))
    scale = max(float(p.grad.abs().max()) for p in params)
    del shared
    print(f"  max abs gradient difference new vs old: {diff:.2e} (largest gradient {scale:.2e})")

    def old_step() -> float:
        start = time.perf_counter()
        unshared_backward(policy, samples, s, new)
        torch.nn.utils.clip_grad_norm_(params, s.grad_clip)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    def new_step() -> float:
        start = time.perf_counter()
        trainer.step(samples)
        return time.perf_counter() - start

    times: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(args.repeats):  # interleaved, best of N: the machine is noisy
        times["old"].append(old_step())
        times["new"].append(new_step())
        print(f"  step: old {times['old'][-1]:.2f} s, new {times['new'][-1]:.2f} s", flush=True)
    best = {k: min(v) for k, v in times.items()}
    print(
        f"  s/step: old (unshared) {best['old']:.2f}, new (shared prompts) {best['new']:.2f}, "
        f"ratio {best['old'] / best['new']:.2f}x   (all: {times})"
    )


def measure_training_rss(args: argparse.Namespace) -> None:
    import resource

    _repo_on_path()
    from sapo_node.trainer import Trainer
    from tests.support.unshared import unshared_backward

    cfg, policy, samples = _training_setup(args)
    trainer = Trainer(policy, cfg.train, cfg.generation.max_new_tokens)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.rss_step == "new":
        trainer.step(samples)
    else:
        unshared_backward(policy, samples, cfg.train, cfg.generation.max_new_tokens)
        torch.nn.utils.clip_grad_norm_(trainer.params, cfg.train.grad_clip)
        trainer.optimizer.step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{args.rss_step}: peak RSS {peak:.0f} MiB (after loading: {before:.0f} MiB)")


if __name__ == "__main__":
    main()
