"""Whether a path of scripts/bench_paths.py, switched off, changes what the model computes:
greedy tokens and logits of generation, gradients of training, the default path's
against the other's."""

from __future__ import annotations

import contextlib

import torch

from scripts.support.round_setup import in_float32


def relative_diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """Largest |a - b| and the largest |b|."""
    return float((a.float() - b.float()).abs().max()), float(b.float().abs().max())


def greedy_logits(policy, prompts, steps, **switches) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy decoding of 2 completions a prompt: the tokens of every row and the logits
    [rows, vocabulary] of every step (decode.sample_next wrapped)."""
    from sapo_node.train import decode

    seen: list[torch.Tensor] = []
    real = decode.sample_next

    def record(logits, sampling):
        seen.append(logits.clone())
        return real(logits, sampling)

    float32 = switches.pop("float32", False)
    dtype = in_float32(policy) if float32 else contextlib.nullcontext()
    decode.sample_next = record
    try:
        packed = switches.pop("packed", True)
        with dtype, torch.inference_mode(), policy.compute_weights(packed=packed):
            out = decode.sample(
                policy.model.eval(),
                prompts,
                2,
                max_new_tokens=steps,
                sampling=decode.Sampling(1.0, 1, 1.0),
                eos_ids=[],
                device=policy.device,
                max_batch_sequences=64,
                autocast=policy.autocast,
                preallocated_cache=switches.pop("preallocated", True),
                decode_mask=switches.pop("mask", True),
            )
    finally:
        decode.sample_next = real
    return [c for g in out for c in g], seen


def generation_equivalence(policy, prompts, steps: int, **off) -> dict:
    """Greedy tokens and logits of the default path against the path switched off: the
    logits compared up to the first step where any row's token differs."""
    tokens_on, logits_on = greedy_logits(policy, prompts, steps)
    tokens_off, logits_off = greedy_logits(policy, prompts, steps, **off)
    same_steps = steps
    for t in range(steps):
        if any(a[t] != b[t] for a, b in zip(tokens_on, tokens_off, strict=True)):
            same_steps = t + 1  # this step's logits still come from identical inputs
            break
    diff = scale = 0.0
    for a, b in zip(logits_on[:same_steps], logits_off[:same_steps], strict=True):
        d, s = relative_diff(a, b)
        diff, scale = max(diff, d), max(scale, s)
    identical = sum(a == b for a, b in zip(tokens_on, tokens_off, strict=True))
    return {
        "kind": f"greedy decoding, {steps} tokens: logits of the steps before tokens differ",
        "tokens_identical": identical == len(tokens_on),
        "rows_identical": f"{identical}/{len(tokens_on)}",
        "max_abs_diff": diff,
        "largest": scale,
        "relative": diff / scale if scale else 0.0,
    }


def grads(trainer, samples) -> torch.Tensor:
    trainer.gradients(samples)
    out = torch.cat([p.grad.detach().float().flatten() for p in trainer.params])
    trainer.optimizer.zero_grad(set_to_none=True)
    return out


def grad_equivalence(a: torch.Tensor, b: torch.Tensor) -> dict:
    diff, scale = relative_diff(a, b)
    return {
        "kind": "gradients of one forward and backward",
        "max_abs_diff": diff,
        "largest": scale,
        "relative": diff / scale if scale else 0.0,
    }
