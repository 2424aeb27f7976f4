"""The GRPO update over one round's training set: batching, micro-batches, optimiser.

Each prompt is computed once per micro-batch, not once per completion. A micro-batch is a
run of at most ``micro_batch_size`` completions, taken group by group (a group = the
completions of one prompt); its distinct prompts run forward first (left-padded, with
gradient, ``use_cache=True``), their keys and values are expanded over the completion rows
(``DynamicCache.batch_select_indices``, an indexing op that autograd sums back), and the
completions (right-padded) run forward on that cache, with positions continuing each
prompt and an attention mask that hides prompt padding. The first completion token's
log-prob comes from the prompt's last position. Backward runs through both passes, so the
loss and every gradient equal those of the unshared computation (each row carrying its
prompt) up to float rounding: ``tests/unit/test_trainer.py`` checks it. With L = 8
completions of ~30 tokens after a ~104-token prompt, this removes ~70% of training tokens.
A group split over two micro-batches runs its prompt in each of them.

Under gradient checkpointing Hugging Face drops the cache inside checkpointed layers, so
prompts cannot be shared: each row then carries its prompt (``pack``, prompts left-padded,
completions right-padded, logits only for the last ``C + 1`` positions).

Old-policy log-probs are real: with ``ppo_epochs > 1`` the first epoch's log-probs
(detached) are the old policy's, since no step has been taken yet, and are kept for the
later epochs, whose ratios move away from 1, so the clip acts. No separate pass.

Loss weights are computed once over the whole batch, so micro-batching changes memory,
never the gradient. They are normalised over the round's whole batch (``batch_rows``,
``batch_tokens``), not over the rows with signal passed here: see ``grpo``'s docstring.

A step whose gradient norm is not finite is skipped (gradients zeroed, counted in
``TrainStats.skipped_steps``, logged), so no NaN reaches the weights. In float16 the loss is
scaled by a ``torch.amp.GradScaler`` and the gradients unscaled before clipping.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog
import torch

from sapo_node import grpo
from sapo_node.config import TrainSection
from sapo_node.policy import Policy

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Sample:
    """One training sequence: a prompt, a completion and the completion's advantage."""

    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float


@dataclass
class Packed:
    """A padded micro-batch, each row with its prompt (see the module docstring)."""

    input_ids: torch.Tensor  # [B, P + C]
    attention_mask: torch.Tensor  # [B, P + C]
    position_ids: torch.Tensor  # [B, P + C]
    targets: torch.Tensor  # [B, C] completion tokens
    mask: torch.Tensor  # [B, C] 1 on real completion tokens
    advantages: torch.Tensor  # [B]


@dataclass
class SharedPacked:
    """A micro-batch whose rows share their prompts' forward (see the module docstring)."""

    prompt_ids: torch.Tensor  # [G, P] distinct prompts, left-padded
    prompt_mask: torch.Tensor  # [G, P]
    prompt_positions: torch.Tensor  # [G, P]
    row_prompt: torch.Tensor  # [B] index of each row's prompt in [0, G)
    attention_mask: torch.Tensor  # [B, P + C] the row's prompt mask, then its completion's
    positions: torch.Tensor  # [B, C] positions of the completion tokens
    targets: torch.Tensor  # [B, C] completion tokens, right-padded
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


def pack_shared(samples: Sequence[Sample], pad_id: int) -> SharedPacked:
    """Pad samples with their distinct prompts apart: prompts left, completions right."""
    index: dict[tuple[int, ...], int] = {}
    for s in samples:
        index.setdefault(tuple(s.prompt_ids), len(index))
    prompts = list(index)
    p_width = max(len(p) for p in prompts)
    c_width = max(len(s.completion_ids) for s in samples)
    g, b = len(prompts), len(samples)
    p_ids = torch.full((g, p_width), pad_id, dtype=torch.long)
    p_mask = torch.zeros((g, p_width), dtype=torch.long)
    for j, p in enumerate(prompts):
        p_ids[j, p_width - len(p) :] = torch.tensor(p)
        p_mask[j, p_width - len(p) :] = 1
    row_prompt = torch.tensor([index[tuple(s.prompt_ids)] for s in samples], dtype=torch.long)
    targets = torch.full((b, c_width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, c_width), dtype=torch.float32)
    for i, s in enumerate(samples):
        targets[i, : len(s.completion_ids)] = torch.tensor(s.completion_ids)
        mask[i, : len(s.completion_ids)] = 1.0
    p_len = p_mask.sum(-1)
    return SharedPacked(
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        prompt_positions=(p_mask.cumsum(-1) - 1).clamp(min=0),
        row_prompt=row_prompt,
        attention_mask=torch.cat([p_mask[row_prompt], mask.long()], dim=1),
        positions=p_len[row_prompt][:, None] + torch.arange(c_width)[None, :],
        targets=targets,
        mask=mask,
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
    )


@dataclass
class TrainStats:
    """What one update did; loss and the per-token means are those of the last step.

    ``clip_frac``, ``approx_kl`` (k3 of KL(old || new)), ``kl`` (to the reference) and
    ``entropy`` (nats, of the sampled distribution) are means over completion tokens,
    weighted like the loss. ``skipped_steps``: steps not taken for a non-finite gradient.
    """

    sequences: int = 0
    tokens: int = 0
    steps: int = 0
    skipped_steps: int = 0
    loss: float = 0.0
    clip_frac: float = 0.0
    kl: float = 0.0
    approx_kl: float = 0.0
    entropy: float = 0.0
    grad_norm: float = 0.0


@dataclass
class _Plan:
    """One update's micro-batches, weights and fixed log-probs (old: set by epoch 1)."""

    batches: list[tuple[list[int], Packed | SharedPacked]]
    row_weight: torch.Tensor  # [N] loss weight of each sample's tokens
    total_weight: float
    tokens: int
    ref: list[torch.Tensor | None]
    old: list[torch.Tensor | None]


def uses_checkpointing(model: torch.nn.Module) -> bool:
    """True if any module of ``model`` recomputes activations (gradient checkpointing)."""
    return any(vars(m).get("gradient_checkpointing") is True for m in model.modules())


FUSED_OPTIMIZER_DEVICES = ("cpu", "cuda")  # where torch has fused Adam(W) kernels


class Trainer:
    """Owns the optimiser; turns a training set into ``ppo_epochs`` optimiser steps."""

    def __init__(
        self,
        policy: Policy,
        settings: TrainSection,
        max_new_tokens: int,
        temperature: float = 1.0,
        *,
        top_p: float = 1.0,
        top_k: int = 0,
    ) -> None:
        self.policy = policy
        self.settings = settings
        self.max_new_tokens = max_new_tokens
        # Log-probs of the distribution that was sampled (grpo.truncated_logits).
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        params = policy.trainable_parameters()
        opt_cls = torch.optim.AdamW if settings.optimizer == "adamw" else torch.optim.Adam
        # One fused kernel per parameter on CPU and CUDA: the same update as the default
        # loop, 3x faster here and without its per-parameter temporaries (docs/benchmarks.md).
        fused = True if policy.device.type in FUSED_OPTIMIZER_DEVICES else None
        self.optimizer = opt_cls(
            params,
            lr=settings.lr,
            betas=settings.betas,
            weight_decay=settings.weight_decay,
            fused=fused,
        )
        self.params = params
        self.scaler = (
            torch.amp.GradScaler(policy.device.type) if policy.dtype == torch.float16 else None
        )

    def _micro_batches(
        self, samples: Sequence[Sample]
    ) -> list[tuple[list[int], Packed | SharedPacked]]:
        """Micro-batches with their sample indices: group by group, similar lengths together."""
        size = self.settings.micro_batch_size
        pad = self.policy.tokenizer.pad_token_id
        if uses_checkpointing(self.policy.model):
            order = sorted(
                range(len(samples)),
                key=lambda i: len(samples[i].prompt_ids) + len(samples[i].completion_ids),
            )
            chunks = [order[i : i + size] for i in range(0, len(order), size)]
            return [(idx, pack([samples[i] for i in idx], pad)) for idx in chunks]
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, s in enumerate(samples):
            groups.setdefault(tuple(s.prompt_ids), []).append(i)
        ordered = sorted(groups.values(), key=lambda idx: len(samples[idx[0]].prompt_ids))
        order = [
            i for idx in ordered for i in sorted(idx, key=lambda i: len(samples[i].completion_ids))
        ]
        chunks = [order[i : i + size] for i in range(0, len(order), size)]
        return [(idx, pack_shared([samples[i] for i in idx], pad)) for idx in chunks]

    def _logprobs(
        self, model: torch.nn.Module, mb: Packed | SharedPacked, *, entropy: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Log-probs [B, C] of the completion tokens; with ``entropy``, also their entropy."""
        parts = self._completion_logits(model, mb)
        warp = {"top_k": self.top_k, "top_p": self.top_p}
        logp = torch.cat(
            [grpo.token_logprobs(x, t, self.temperature, **warp) for x, t in parts], dim=1
        )
        if not entropy:
            return logp
        ent = torch.cat(
            [grpo.token_entropy(x.detach(), self.temperature, **warp) for x, _ in parts], dim=1
        )
        return logp, ent

    def _completion_logits(
        self, model: torch.nn.Module, mb: Packed | SharedPacked
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The logits [B, t, V] that predict the completion tokens, with those tokens
        [B, t], in consecutive parts that together cover all C of them."""
        dev = self.policy.device
        c = mb.targets.shape[1]
        targets = mb.targets.to(dev)
        parts: list[tuple[torch.Tensor, torch.Tensor]] = []
        with self.policy.autocast():
            if isinstance(mb, Packed):
                logits = model(
                    input_ids=mb.input_ids.to(dev),
                    attention_mask=mb.attention_mask.to(dev),
                    position_ids=mb.position_ids.to(dev),
                    logits_to_keep=c + 1,
                    use_cache=False,
                ).logits[:, :c]
                parts.append((logits, targets))
            else:
                out = model(
                    input_ids=mb.prompt_ids.to(dev),
                    attention_mask=mb.prompt_mask.to(dev),
                    position_ids=mb.prompt_positions.to(dev),
                    logits_to_keep=1,
                    use_cache=True,
                )
                rows = mb.row_prompt.to(dev)
                parts.append((out.logits[rows], targets[:, :1]))
                if c > 1:
                    cache = out.cache
                    if mb.row_prompt.tolist() != list(range(len(mb.prompt_ids))):
                        cache.batch_select_indices(rows)
                    rest = model(
                        input_ids=targets[:, : c - 1],
                        attention_mask=mb.attention_mask[:, :-1].to(dev),
                        position_ids=mb.positions[:, : c - 1].to(dev),
                        cache=cache,
                        use_cache=True,
                    ).logits
                    parts.append((rest, targets[:, 1:]))
                del out
        return parts

    @torch.no_grad()
    def completion_logprobs(self, samples: Sequence[Sample]) -> list[list[float]]:
        """Each sample's completion-token log-probs under the current policy, in the
        distribution the node samples from (temperature, top-k, top-p); trains nothing."""
        out: list[list[float]] = [[] for _ in samples]
        for idx, mb in self._micro_batches(samples):
            logp = self._logprobs(self.policy.model, mb)
            for row, i in enumerate(idx):
                out[i] = logp[row, : len(samples[i].completion_ids)].float().tolist()
        return out

    @torch.no_grad()
    def completion_ranks(self, samples: Sequence[Sample]) -> list[list[int]]:
        """Each sample's completion tokens' ranks under the current policy: how many
        vocabulary tokens it finds likelier than the one written (0: its first choice).
        Temperature, top-k and top-p keep this order, so the rank needs no sampling
        settings; trains nothing."""
        out: list[list[int]] = [[] for _ in samples]
        for idx, mb in self._micro_batches(samples):
            ranks = torch.cat(
                [grpo.token_ranks(x, t) for x, t in self._completion_logits(self.policy.model, mb)],
                dim=1,
            )
            for row, i in enumerate(idx):
                out[i] = ranks[row, : len(samples[i].completion_ids)].tolist()
        return out

    def step(
        self,
        samples: Sequence[Sample],
        should_stop: Callable[[], bool] = lambda: False,
        *,
        batch_rows: int | None = None,
        batch_tokens: int | None = None,
    ) -> TrainStats | None:
        """Update the policy on ``samples``; a no-op for an empty list.

        ``batch_rows``/``batch_tokens``: completions and completion tokens of the round's
        whole batch (all I + J groups, with or without signal; ``samples`` are usually only
        those with signal); None: those of ``samples``. See ``grpo.loss_weights``.
        Returns None, with no step taken, if ``should_stop()`` turns true mid-way.
        """
        if not samples:
            return TrainStats()
        plan = self._plan(samples, batch_rows, batch_tokens)
        stats = TrainStats(sequences=len(samples), tokens=plan.tokens)
        model = self.policy.model
        try:
            for _ in range(self.settings.ppo_epochs):
                sums = self._accumulate(plan, should_stop)
                if sums is None:
                    return None
                norm = self._apply_gradients()
                stats.grad_norm = norm
                if math.isfinite(norm):
                    stats.steps += 1
                else:
                    stats.skipped_steps += 1
                stats.loss = sums.pop("loss")
                for key, value in sums.items():
                    setattr(stats, key, value / plan.total_weight)
        finally:
            self.optimizer.zero_grad(set_to_none=True)
            model.eval()
        return stats

    def gradients(
        self,
        samples: Sequence[Sample],
        *,
        batch_rows: int | None = None,
        batch_tokens: int | None = None,
    ) -> float:
        """One epoch's forward and backward, no step: the loss; gradients stay in ``.grad``."""
        self.optimizer.zero_grad(set_to_none=True)
        sums = self._accumulate(self._plan(samples, batch_rows, batch_tokens), lambda: False)
        self.policy.model.eval()
        assert sums is not None
        return sums["loss"]

    def _plan(
        self, samples: Sequence[Sample], batch_rows: int | None, batch_tokens: int | None
    ) -> _Plan:
        """Micro-batches, per-row loss weights and the reference log-probs of one update."""
        s = self.settings
        batches = self._micro_batches(samples)
        lengths = torch.tensor([len(smp.completion_ids) for smp in samples])
        full_mask = (torch.arange(int(lengths.max()))[None, :] < lengths[:, None]).float()
        row_weight = grpo.loss_weights(
            full_mask,
            s.loss_norm,
            max_tokens=self.max_new_tokens,
            batch_rows=batch_rows,
            batch_tokens=batch_tokens,
        )
        row_weight = row_weight.max(dim=1).values  # weights are constant along a sequence
        ref: list[torch.Tensor | None] = [None] * len(batches)
        if s.kl_coef > 0:
            with torch.no_grad(), self.policy.reference() as ref_model:
                ref = [self._logprobs(ref_model, mb) for _, mb in batches]
        return _Plan(
            batches=batches,
            row_weight=row_weight,
            total_weight=max(float((row_weight * lengths).sum()), 1e-12),
            tokens=int(lengths.sum()),
            ref=ref,
            old=[None] * len(batches),
        )

    def _accumulate(self, plan: _Plan, should_stop: Callable[[], bool]) -> dict[str, float] | None:
        """Forward and backward over every micro-batch; None (grads zeroed) on a stop.

        The first call records the old-policy log-probs in ``plan.old`` (detached).
        """
        s = self.settings
        dev = self.policy.device
        model = self.policy.model
        model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = dict.fromkeys(("loss", "clip_frac", "kl", "approx_kl", "entropy"), 0.0)
        for k, (idx, mb) in enumerate(plan.batches):
            if should_stop():
                self.optimizer.zero_grad(set_to_none=True)
                return None
            logp, ent = self._logprobs(model, mb, entropy=True)
            weights = (mb.mask * plan.row_weight[idx][:, None]).to(dev)
            if plan.old[k] is None:
                plan.old[k] = logp.detach()  # no step yet: these are the old policy's
            loss, info = grpo.clipped_surrogate(
                logp,
                plan.old[k],
                mb.advantages.to(dev),
                weights,
                eps_low=s.eps_low,
                eps_high=s.eps_high,
                ref_logp=plan.ref[k],
                kl_coef=s.kl_coef,
            )
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            share = float(weights.sum())
            sums["loss"] += float(loss.detach())
            sums["entropy"] += float(grpo.masked_mean(ent, weights)) * share
            for key in ("clip_frac", "kl", "approx_kl"):
                if key in info:
                    sums[key] += float(info[key]) * share
        return sums

    def _apply_gradients(self) -> float:
        """Unscale, clip and step; skip the step if the gradient norm is not finite."""
        s = self.settings
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        max_norm = s.grad_clip if s.grad_clip > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        if not math.isfinite(norm):
            log.warning("train.step_skipped", reason="non-finite gradient norm", grad_norm=norm)
            self.optimizer.zero_grad(set_to_none=True)
            if self.scaler:
                self.scaler.update()  # unscale_ recorded the inf: the scale backs off
            return norm
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        return norm
