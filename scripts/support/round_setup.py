"""The model and the training round of scripts/bench_round.py, which
scripts/bench_paths.py measures with too: the default config's policy and prompts, a
default-shaped round of samples, and the switches the benchmarks turn (float32 compute,
gradient checkpointing)."""

from __future__ import annotations

import argparse
import contextlib
import os

import torch


def default_prompts(args: argparse.Namespace):
    """The default config, the embedded model, and the chat prompts of 4 real tasks."""
    from sapo_node.config import load_config
    from sapo_node.curriculum import Curriculum
    from sapo_node.tasks import build_messages, make_task
    from sapo_node.train.policy import load_policy

    lora = {"SAPO_MODEL__LORA__ENABLED": "true"} if getattr(args, "lora", False) else {}
    # SAPO_* variables in the environment change the config, as they do a node's.
    cfg = load_config(
        environ={**{k: v for k, v in os.environ.items() if k.startswith("SAPO_")}, **lora}
    )
    policy = load_policy(
        args.model,
        device="cpu",
        dtype=cfg.model.dtype,
        lora=cfg.model.lora,
        cache_dir=args.data_dir / "models",
        gradient_checkpointing=cfg.model.gradient_checkpointing
        or getattr(args, "rss_step", None) == "ckpt",
    )
    curriculum = Curriculum(cfg.tasks.families, cfg.curriculum)
    tasks = [make_task(r) for r in curriculum.sample(seed=7, round_=0, count=4)]
    t = cfg.tasks
    prompts = [
        policy.encode_chat(build_messages(task.question, t.system_prompt, t.one_shot))
        for task in tasks
    ]
    return cfg, policy, prompts


@contextlib.contextmanager
def in_float32(policy):
    """The policy computing in float32 (no autocast), as every CPU node did before."""
    dtype, policy.dtype = policy.dtype, torch.float32
    try:
        yield
    finally:
        policy.dtype = dtype


def training_setup(args: argparse.Namespace):
    """The embedded model and a default-shaped round: 4 real prompts x 8 completions.

    Completions are random ordinary tokens of 18-42 tokens (~30, like real ones); the
    advantages are those of random 0/1 rewards, so every group has signal.
    """
    from sapo_node.train import grpo
    from sapo_node.train.trainer import Sample

    cfg, policy, prompts = default_prompts(args)
    g = torch.Generator().manual_seed(0)
    n = cfg.generation.completions_per_task
    samples = []
    for prompt in prompts:
        rewards = torch.tensor([[1.0, 0.0] * (n // 2)])[:, torch.randperm(n, generator=g)]
        adv = grpo.group_advantages(rewards)[0].tolist()
        for a in adv:
            length = int(torch.randint(18, 43, (1,), generator=g))
            vocab = policy.tokenizer.vocab_size  # ordinary tokens: past the first 100
            ids = torch.randint(min(100, vocab // 2), vocab, (length,), generator=g)
            samples.append(Sample(prompt, ids.tolist(), a))
    return cfg, policy, samples


def previous_optimizer(params, settings) -> torch.optim.Optimizer:
    """The optimiser the trainer used before its fused kernel: torch's default Adam(W), a
    loop over the parameters on the CPU."""
    cls = torch.optim.AdamW if settings.optimizer == "adamw" else torch.optim.Adam
    return cls(params, lr=settings.lr, betas=settings.betas, weight_decay=settings.weight_decay)


def is_checkpointing(model) -> bool:
    if hasattr(model, "is_activation_checkpointing"):  # transformers 5's name
        return bool(model.is_activation_checkpointing)
    return bool(model.is_gradient_checkpointing)


@contextlib.contextmanager
def checkpointing(model, on: bool):
    """Gradient checkpointing on or off for the block, as it was after."""
    was = is_checkpointing(model)

    def turn(state: bool) -> None:
        verb = "enable" if state else "disable"
        for name in (f"activation_checkpointing_{verb}", f"gradient_checkpointing_{verb}"):
            if hasattr(model, name):  # transformers 5 renamed it; 4.x has the old name only
                getattr(model, name)()
                return

    if on != was:
        turn(on)
    try:
        yield
    finally:
        if on != was:
            turn(was)
