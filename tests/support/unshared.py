"""The training step as it was before prompt sharing: each row carries its whole prompt.

A reference for tests and ``scripts/bench_round.py`` only (not in the package): one
epoch's forward and backward over micro-batches of ``micro_batch_size`` rows sorted by
length, logits for the last ``C + 1`` positions, weights over the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sapo_node.config import TrainSection
from sapo_node.train import grpo
from sapo_node.train.policy import Policy
from sapo_node.train.trainer import Sample


@dataclass
class Packed:
    """A padded micro-batch, each row with its prompt (see the module docstring)."""

    input_ids: torch.Tensor  # [B, P + C]
    attention_mask: torch.Tensor  # [B, P + C]
    position_ids: torch.Tensor  # [B, P + C]
    targets: torch.Tensor  # [B, C] completion tokens
    mask: torch.Tensor  # [B, C] 1 on real completion tokens
    advantages: torch.Tensor  # [B]


def pack(samples: Sequence[Sample], pad_id: int) -> Packed:
    """Pad a list of samples into tensors: prompts on the left, completions on the right."""
    p_width = max(len(s.prompt_ids) for s in samples)
    c_width = max(len(s.completion_ids) for s in samples)
    b = len(samples)
    ids = torch.full((b, p_width + c_width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, p_width + c_width), dtype=torch.long)
    mask = torch.zeros((b, c_width), dtype=torch.float32)
    for i, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        ids[i, p_width - p : p_width] = torch.tensor(s.prompt_ids)
        ids[i, p_width : p_width + c] = torch.tensor(s.completion_ids)
        attn[i, p_width - p : p_width + c] = 1
        mask[i, :c] = 1.0
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    return Packed(
        input_ids=ids,
        attention_mask=attn,
        position_ids=positions,
        targets=ids[:, p_width:],
        mask=mask,
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
    )


def unshared_backward(
    policy: Policy,
    samples: Sequence[Sample],
    settings: TrainSection,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    batch_rows: int | None = None,
    batch_tokens: int | None = None,
) -> float:
    """Accumulate the loss's gradients into ``.grad`` (zeroed first); return the loss."""
    model = policy.model
    for p in policy.trainable_parameters():
        p.grad = None
    order = sorted(
        range(len(samples)),
        key=lambda i: len(samples[i].prompt_ids) + len(samples[i].completion_ids),
    )
    size = settings.micro_batch_size
    lengths = torch.tensor([len(s.completion_ids) for s in samples])
    full_mask = (torch.arange(int(lengths.max()))[None, :] < lengths[:, None]).float()
    row_weight = (
        grpo.loss_weights(
            full_mask,
            settings.loss_norm,
            max_tokens=max_new_tokens,
            batch_rows=batch_rows,
            batch_tokens=batch_tokens,
        )
        .max(dim=1)
        .values
    )
    model.train()
    total = 0.0
    for start in range(0, len(order), size):
        idx = order[start : start + size]
        mb = pack([samples[i] for i in idx], policy.tokenizer.pad_token_id)
        c = mb.targets.shape[1]
        with policy.autocast():
            logits = model(
                input_ids=mb.input_ids,
                attention_mask=mb.attention_mask,
                position_ids=mb.position_ids,
                logits_to_keep=c + 1,
                use_cache=False,
            ).logits[:, :c]
        logp = grpo.token_logprobs(logits.float(), mb.targets, temperature)
        weights = mb.mask * row_weight[idx][:, None]
        loss, _ = grpo.clipped_surrogate(
            logp,
            logp.detach(),
            mb.advantages,
            weights,
            eps_low=settings.eps_low,
            eps_high=settings.eps_high,
        )
        loss.backward()
        total += float(loss.detach())
    model.eval()
    return total
