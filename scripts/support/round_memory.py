"""The memory modes of scripts/bench_round.py: the peak resident size of a training step
(``--rss-step``) and the heap over training steps of changing shapes
(``--heap-steps``, ``--compare-threshold``)."""

from __future__ import annotations

import argparse
import os
import time

import torch

from scripts.support.measure import glibc_heap, rss_mb
from scripts.support.round_setup import previous_optimizer, training_setup


def measure_training_rss(args: argparse.Namespace) -> None:
    import resource

    from sapo_node.ops.lifecycle import fix_mmap_threshold
    from sapo_node.train.trainer import Trainer
    from tests.support.unshared import unshared_backward

    fix_mmap_threshold()  # the allocator as a node sets it
    cfg, policy, samples = training_setup(args)
    trainer = Trainer(policy, cfg.train, cfg.generation.max_new_tokens)
    old_optimizer = previous_optimizer(trainer.params, cfg.train)
    peaks = [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024]
    for _ in range(2):  # the second step is the first with AdamW's state in memory
        if args.rss_step == "old":
            unshared_backward(policy, samples, cfg.train, cfg.generation.max_new_tokens)
            torch.nn.utils.clip_grad_norm_(trainer.params, cfg.train.grad_clip)
            old_optimizer.step()
            old_optimizer.zero_grad(set_to_none=True)
        else:
            trainer.step(samples)
        peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(
        f"{args.rss_step}: peak RSS after loading {peaks[0]:.0f} MiB, after step 1 "
        f"{peaks[1]:.0f} MiB, after step 2 {peaks[2]:.0f} MiB"
    )


def measure_heap(args: argparse.Namespace) -> None:
    """Training steps of changing shapes, as a node's rounds are: does memory settle?"""
    import random
    import resource

    from sapo_node.ops.lifecycle import fix_mmap_threshold
    from sapo_node.train.trainer import Sample, Trainer

    fix_mmap_threshold()  # what a node does, unless MALLOC_MMAP_THRESHOLD_ is set
    cfg, policy, samples = training_setup(args)
    trainer = Trainer(policy, cfg.train, cfg.generation.max_new_tokens)
    rng = random.Random(0)
    batches = [
        [
            Sample(x.prompt_ids, (x.completion_ids * 3)[: rng.randint(5, 64)], x.advantage)
            for x in samples[: rng.choice([8, 16, 24, 32])]
        ]
        for _ in range(args.heap_steps)
    ]
    if args.compare_threshold:
        _compare_thresholds(args, cfg, policy, trainer, samples, batches)
        return
    threshold = os.environ.get("MALLOC_MMAP_THRESHOLD_", "the node's")
    print(f"heap: {args.heap_steps} steps, mmap threshold {threshold}")
    for step, batch in enumerate(batches):
        start = time.perf_counter()
        trainer.step(batch)
        seconds = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        heap = glibc_heap()
        print(
            f"  step {step}: {len(batch)} sequences, {seconds:.1f} s, RSS {rss_mb():.0f} MiB, "
            f"peak {peak:.0f} MiB"
            + (f", heap in use {heap[0]:.0f} MiB, free {heap[1]:.0f} MiB" if heap else ""),
            flush=True,
        )


def _compare_thresholds(args, cfg, policy, trainer, samples, batches) -> None:
    """Generation tokens/s and training seconds under two mmap thresholds, interleaved."""
    import ctypes

    from sapo_node.ops.lifecycle import MMAP_THRESHOLD

    mallopt = ctypes.CDLL("libc.so.6").mallopt
    prompts = [list(p) for p in dict.fromkeys(tuple(x.prompt_ids) for x in samples)]  # the 4 tasks'
    gen = cfg.generation
    # [generate s, tokens, train s]; each run trains, so the next generation differs.
    totals = {MMAP_THRESHOLD: [0.0, 0, 0.0], args.compare_threshold: [0.0, 0, 0.0]}
    print(f"heap: mmap threshold {MMAP_THRESHOLD} (the node's) vs {args.compare_threshold}")
    for step, batch in enumerate(batches):
        order = list(totals) if step % 2 == 0 else list(totals)[::-1]
        for threshold in order:
            mallopt(-3, threshold)  # M_MMAP_THRESHOLD
            torch.manual_seed(step)
            start = time.perf_counter()
            made = policy.generate(prompts, gen, n=gen.completions_per_task).new_tokens
            middle = time.perf_counter()
            trainer.step(batch)
            end = time.perf_counter()
            totals[threshold][0] += middle - start
            totals[threshold][1] += made
            totals[threshold][2] += end - middle
            print(
                f"  step {step}, threshold {threshold}: generate {made} tokens "
                f"{middle - start:.1f} s, train {len(batch)} sequences {end - middle:.1f} s",
                flush=True,
            )
    (g1, n1, t1), (g2, n2, t2) = totals.values()
    print(
        f"  total: generate {n1 / g1:.1f} vs {n2 / g2:.1f} tok/s ({(n1 / g1) / (n2 / g2):.3f}x), "
        f"train {t1:.1f} vs {t2:.1f} s ({t2 / t1:.3f}x)"
    )
