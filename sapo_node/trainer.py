"""The GRPO update over one round's training set: batching, micro-batches, optimiser.

Layout of a micro-batch: prompts left-padded, completions right-padded, so every
completion token sits in the last ``C + 1`` positions and the model computes logits
only there (``logits_to_keep``): the vocabulary projection of prompt tokens is skipped.

Old-policy log-probs are real: with ``ppo_epochs > 1`` a no-grad forward before the
first step records them, and each later step's ratio moves away from 1, so the clip
acts. With one step per batch the current log-probs (detached) are exactly the old ones.
Loss weights are computed once over the whole batch, so micro-batching changes memory,
never the gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from sapo_node import grpo
from sapo_node.config import TrainSection
from sapo_node.policy import Policy


@dataclass(frozen=True)
class Sample:
    """One training sequence: a prompt, a completion and the completion's advantage."""

    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float


@dataclass
class Packed:
    """A padded micro-batch (see the module docstring for its layout)."""

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


@dataclass
class TrainStats:
    """What one update did."""

    sequences: int = 0
    tokens: int = 0
    steps: int = 0
    loss: float = 0.0
    clip_frac: float = 0.0
    kl: float = 0.0
    grad_norm: float = 0.0


class Trainer:
    """Owns the optimiser; turns a training set into ``ppo_epochs`` optimiser steps."""

    def __init__(
        self,
        policy: Policy,
        settings: TrainSection,
        max_new_tokens: int,
        temperature: float = 1.0,
    ) -> None:
        self.policy = policy
        self.settings = settings
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature  # log-probs of the distribution that was sampled
        params = policy.trainable_parameters()
        opt_cls = torch.optim.AdamW if settings.optimizer == "adamw" else torch.optim.Adam
        self.optimizer = opt_cls(
            params, lr=settings.lr, betas=settings.betas, weight_decay=settings.weight_decay
        )
        self.params = params

    def _micro_batches(self, samples: Sequence[Sample]) -> list[tuple[list[int], Packed]]:
        """Micro-batches of similar length (less padding), with their sample indices."""
        order = sorted(
            range(len(samples)),
            key=lambda i: len(samples[i].prompt_ids) + len(samples[i].completion_ids),
        )
        size = self.settings.micro_batch_size
        pad = self.policy.tokenizer.pad_token_id
        chunks = [order[i : i + size] for i in range(0, len(order), size)]
        return [(idx, pack([samples[i] for i in idx], pad)) for idx in chunks]

    def _logprobs(self, model: torch.nn.Module, mb: Packed) -> torch.Tensor:
        dev = self.policy.device
        c = mb.targets.shape[1]
        with self.policy.autocast():
            logits = model(
                input_ids=mb.input_ids.to(dev),
                attention_mask=mb.attention_mask.to(dev),
                position_ids=mb.position_ids.to(dev),
                logits_to_keep=c + 1,
                use_cache=False,
            ).logits[:, :c]
        return grpo.token_logprobs(logits.float(), mb.targets.to(dev), self.temperature)

    def step(
        self, samples: Sequence[Sample], should_stop: Callable[[], bool] = lambda: False
    ) -> TrainStats | None:
        """Update the policy on ``samples``; a no-op for an empty list.

        Returns None, with no step taken, if ``should_stop()`` turns true mid-way.
        """
        if not samples:
            return TrainStats()
        s = self.settings
        dev = self.policy.device
        model = self.policy.model
        batches = self._micro_batches(samples)
        lengths = torch.tensor([len(smp.completion_ids) for smp in samples])
        full_mask = (torch.arange(int(lengths.max()))[None, :] < lengths[:, None]).float()
        row_weight = grpo.loss_weights(full_mask, s.loss_norm, max_tokens=self.max_new_tokens)
        row_weight = row_weight.max(dim=1).values  # weights are constant along a sequence
        total_weight = max(float((row_weight * lengths).sum()), 1e-12)

        old: list[torch.Tensor | None] = [None] * len(batches)
        ref: list[torch.Tensor | None] = [None] * len(batches)
        with torch.no_grad():
            if s.ppo_epochs > 1:
                model.eval()
                old = [self._logprobs(model, mb) for _, mb in batches]
            if s.kl_coef > 0:
                with self.policy.reference() as ref_model:
                    ref = [self._logprobs(ref_model, mb) for _, mb in batches]

        stats = TrainStats(sequences=len(samples), tokens=int(lengths.sum()))
        model.train()
        for _ in range(s.ppo_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            loss_sum = clip_sum = kl_sum = 0.0
            for k, (idx, mb) in enumerate(batches):
                if should_stop():
                    self.optimizer.zero_grad(set_to_none=True)
                    model.eval()
                    return None
                logp = self._logprobs(model, mb)
                weights = (mb.mask * row_weight[idx][:, None]).to(dev)
                old_logp = old[k] if old[k] is not None else logp.detach()
                loss, info = grpo.clipped_surrogate(
                    logp,
                    old_logp,
                    mb.advantages.to(dev),
                    weights,
                    eps_low=s.eps_low,
                    eps_high=s.eps_high,
                    ref_logp=ref[k],
                    kl_coef=s.kl_coef,
                )
                loss.backward()
                share = float(weights.sum())
                loss_sum += float(loss.detach())
                clip_sum += float(info["clip_frac"]) * share
                kl_sum += float(info.get("kl", torch.tensor(0.0))) * share
            max_norm = s.grad_clip if s.grad_clip > 0 else float("inf")
            norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
            self.optimizer.step()
            stats.steps += 1
            stats.loss = loss_sum
            stats.clip_frac, stats.kl = clip_sum / total_weight, kl_sum / total_weight
            stats.grad_norm = float(norm)
        self.optimizer.zero_grad(set_to_none=True)
        model.eval()
        return stats
