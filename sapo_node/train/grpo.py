r"""GRPO loss maths: pure functions of tensors (no state, no model, no I/O).

GRPO (Shao et al. 2024, DeepSeekMath), as used by SAPO, samples a group of ``L`` completions
per prompt, scores each with a reward ``r_i`` and uses the group-relative advantage

    A_i = (r_i - mean(r)) / (std(r) + eps)            ("std", GRPO)
    A_i =  r_i - mean(r)                              ("none", Dr. GRPO, Liu et al. 2025)

where ``std`` is the *sample* standard deviation (Bessel-corrected, ``L - 1`` in the
denominator, as ``torch.std`` and TRL's GRPOTrainer compute it). A group whose rewards are
all equal (or has ``L == 1``) carries no signal and gets advantages of exactly 0.

Every completion token ``t`` of sequence ``i`` shares ``A_i``. With the importance ratio
``rho = exp(logp - old_logp)`` against the policy that sampled the rollouts, the per-token
loss is the PPO clipped surrogate with asymmetric bounds (DAPO "clip-higher", Yu et al. 2025)

    l_t = -min(rho * A_i, clip(rho, 1 - eps_low, 1 + eps_high) * A_i) + beta * k3_t
    k3_t = exp(ref_logp - logp) - (ref_logp - logp) - 1       (>= 0; Schulman's k3 estimator)

with defaults ``eps_low = 0.2``, ``eps_high = 0.28`` and KL weight ``beta = 0`` (as in SAPO;
no reference model is needed then).

The batch loss is ``sum_{i,t} w_{i,t} * l_{i,t}``; the weights pick the normalisation
(``n_i`` = completion tokens of row ``i``; ``B`` = rows and ``N`` = completion tokens of the
round's WHOLE batch, see below):

    "token"     w = 1 / N                  every token counts equally (DAPO)
    "sequence"  w = 1 / (n_i * B)          mean over tokens, then over sequences (GRPO)
    "constant"  w = 1 / (max_tokens * B)   length-unbiased constant (Dr. GRPO)

The batch is the round's: all I + J groups, including those without signal. Such groups
have advantages of exactly 0, so they add nothing to the loss, and the trainer skips them,
but they still count in ``B`` and ``N`` (``batch_rows``/``batch_tokens`` of ``loss_weights``),
as TRL normalises over the full batch including zero-advantage rows. A token's weight then
does not depend on how many groups of its round had signal: a swarm node (whose external
groups carry signal) and a lone node take steps of the same scale. Left as None, the totals
are those of the rows passed (the batch is the rows with signal).

Weights are computed once over the whole training batch and sliced per micro-batch, so
summing the micro-batch losses (and gradients) gives exactly the full-batch loss (gradient).

The trained log-probs are those of the distribution that was sampled: the logits are divided
by the temperature, then truncated by top-k, then by top-p (Hugging Face's order and rules,
``TopKLogitsWarper``/``TopPLogitsWarper`` with ``min_tokens_to_keep=1``). The sampled token
itself is never truncated away here (a token at the truncation boundary, where the sampler's
arithmetic can differ in the last bit, would get log-prob -inf and a NaN loss).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "LOG_RATIO_CLAMP",
    "clipped_surrogate",
    "group_advantages",
    "group_has_signal",
    "k3_kl",
    "loss_weights",
    "masked_mean",
    "token_entropy",
    "token_logprobs",
    "truncated_logits",
]

#: ``logp - old_logp`` is clamped to +-this before ``exp`` so that a stale or padded token can
#: never overflow the ratio to inf (and turn a zero gradient into NaN). exp(20) ~ 4.9e8.
LOG_RATIO_CLAMP = 20.0


def group_has_signal(rewards: Tensor) -> Tensor:
    """rewards [G, L] -> [G] bool: True where the rewards of a group are not all equal."""
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [G, L], got shape {tuple(rewards.shape)}")
    return (rewards != rewards[:, :1]).any(dim=1)


def group_advantages(
    rewards: Tensor, *, scale: Literal["std", "none"] = "std", eps: float = 1e-6
) -> Tensor:
    """rewards [G, L] -> advantages [G, L], group-normalised (see the module docstring).

    ``scale="std"`` divides by the sample std + ``eps``; ``"none"`` only centres (Dr. GRPO).
    Groups without signal (all rewards equal, or ``L == 1``) get exactly 0.
    """
    if scale not in ("std", "none"):
        raise ValueError(f"unknown scale {scale!r}")
    has_signal = group_has_signal(rewards)
    r = rewards if rewards.is_floating_point() else rewards.to(torch.get_default_dtype())
    if r.shape[1] < 2:
        return torch.zeros_like(r)
    centred = r - r.mean(dim=1, keepdim=True)
    if scale == "std":
        std = r.std(dim=1, keepdim=True, correction=1)
        denom = torch.where(has_signal[:, None], std + eps, torch.ones_like(std))
        centred = centred / denom
    return torch.where(has_signal[:, None], centred, torch.zeros_like(centred))


def truncated_logits(
    logits: Tensor,
    temperature: float = 1.0,
    *,
    top_k: int = 0,
    top_p: float = 1.0,
    keep: Tensor | None = None,
) -> Tensor:
    """logits [..., V] -> the sampler's logits [..., V]: ``/ temperature``, then top-k, then
    top-p, removed entries set to -inf (Hugging Face's warpers, ``min_tokens_to_keep=1``).

    ``keep`` (int [...], optional): an index per position that is never removed (the sampled
    token). The truncation mask is computed without gradient; the kept entries' gradient is
    that of ``logits / temperature``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if top_k < 0 or not 0.0 < top_p <= 1.0:
        raise ValueError(f"need top_k >= 0 and 0 < top_p <= 1, got {top_k} and {top_p}")
    x = logits / temperature if temperature != 1.0 else logits
    vocab = x.shape[-1]
    if (top_k == 0 or top_k >= vocab) and top_p >= 1.0:
        return x
    with torch.no_grad():
        remove = torch.zeros(x.shape, dtype=torch.bool, device=x.device)
        if 0 < top_k < vocab:
            kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
            remove |= x < kth
        if top_p < 1.0:
            masked = x.masked_fill(remove, float("-inf"))
            sorted_x, order = torch.sort(masked, dim=-1, descending=False)
            cum = sorted_x.softmax(dim=-1).cumsum(dim=-1)
            drop_sorted = cum <= (1 - top_p)
            drop_sorted[..., -1:] = False
            remove |= drop_sorted.scatter(-1, order, drop_sorted)
        if keep is not None:
            remove.scatter_(-1, keep.long().unsqueeze(-1), False)
    return x.masked_fill(remove, float("-inf"))


def token_ranks(logits: Tensor, targets: Tensor) -> Tensor:
    """logits [B, T, V], targets [B, T] -> rank [B, T] (int64): how many tokens have a
    higher logit than the target (0: the most likely). Temperature, top-k and top-p keep
    this order. One row at a time, as in ``token_logprobs``.

    >>> token_ranks(torch.tensor([[[0.1, 2.0, 1.0], [3.0, 2.0, 1.0]]]), torch.tensor([[2, 0]]))
    tensor([[1, 0]])
    """
    if logits.ndim != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"need logits [B, T, V] and targets [B, T], got {tuple(logits.shape)} "
            f"and {tuple(targets.shape)}"
        )
    rows = [
        (x > x.gather(-1, t.unsqueeze(-1))).sum(-1) for x, t in zip(logits, targets, strict=True)
    ]
    return torch.stack(rows) if rows else targets.new_zeros(targets.shape, dtype=torch.int64)


def token_logprobs(
    logits: Tensor,
    targets: Tensor,
    temperature: float = 1.0,
    *,
    top_k: int = 0,
    top_p: float = 1.0,
) -> Tensor:
    """logits [B, T, V], targets [B, T] (int, in [0, V)) -> log p(target) [B, T].

    ``p`` is the sampled distribution: ``truncated_logits`` (temperature, top-k, top-p).
    Computed one row at a time, so at most one [T, V] temporary exists at once (no second
    [B, T, V] log-softmax). Half-precision logits are upcast per row; the result is float32
    for them, else their dtype. Without truncation (the default sampling) nothing
    [T, V]-sized is kept for backward but the logits themselves (``_TargetLogProb``
    recomputes the softmax there); with truncation a scaled/upcast row copy is kept.
    """
    if logits.ndim != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"need logits [B, T, V] and targets [B, T], got {tuple(logits.shape)} "
            f"and {tuple(targets.shape)}"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    half = logits.dtype in (torch.float16, torch.bfloat16)
    if logits.shape[0] == 0:
        return logits.new_zeros(targets.shape, dtype=torch.float32 if half else logits.dtype)
    rows = []
    truncated = 0 < top_k < logits.shape[-1] or top_p < 1.0
    for row_logits, row_targets in zip(logits, targets, strict=True):
        if not truncated:
            rows.append(_TargetLogProb.apply(row_logits, row_targets.long(), temperature))
            continue
        x = row_logits.float() if half else row_logits
        x = truncated_logits(x, temperature, top_k=top_k, top_p=top_p, keep=row_targets)
        picked = x.gather(-1, row_targets.long().unsqueeze(-1)).squeeze(-1)
        rows.append(picked - torch.logsumexp(x, dim=-1))
    return torch.stack(rows)


def _upcast(x: Tensor) -> Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class _TargetLogProb(torch.autograd.Function):
    """x [n, V], targets [n], temperature -> log softmax(x / T)[target] [n], computed in
    float32 for half-precision ``x`` (else in its dtype). Saves only ``x`` (the caller's
    tensor, no copy) and the log-normaliser for backward, which recomputes the softmax:
    d/dx = (onehot(target) - p) / T.
    """

    @staticmethod
    def forward(ctx, x: Tensor, targets: Tensor, temperature: float) -> Tensor:
        xf = _upcast(x) / temperature if temperature != 1.0 else _upcast(x)
        lse = torch.logsumexp(xf, dim=-1)
        picked = xf.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        ctx.save_for_backward(x, targets, lse)
        ctx.temperature = temperature
        return picked - lse

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        x, targets, lse = ctx.saved_tensors
        t = ctx.temperature
        xf = _upcast(x) / t if t != 1.0 else _upcast(x)
        grad_x = (xf - lse.unsqueeze(-1)).exp_().mul_(-grad.unsqueeze(-1))  # new tensor
        grad_x.scatter_add_(-1, targets.unsqueeze(-1), grad.unsqueeze(-1))
        if t != 1.0:
            grad_x.div_(t)
        return grad_x.to(x.dtype), None, None


@torch.no_grad()
def token_entropy(
    logits: Tensor, temperature: float = 1.0, *, top_k: int = 0, top_p: float = 1.0
) -> Tensor:
    """logits [B, T, V] -> entropy [B, T] (nats, float32) of the sampled distribution.

    No gradient and one [T, V] temporary at a time: nothing is kept for backward.
    """
    if logits.ndim != 3:
        raise ValueError(f"need logits [B, T, V], got {tuple(logits.shape)}")
    rows = []
    for row in logits:
        x = truncated_logits(row.float(), temperature, top_k=top_k, top_p=top_p)
        logp = x - torch.logsumexp(x, dim=-1, keepdim=True)
        p = logp.exp()
        rows.append(-torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1))
    if not rows:
        return logits.new_zeros(logits.shape[:2], dtype=torch.float32)
    return torch.stack(rows)


def loss_weights(
    mask: Tensor,
    mode: Literal["token", "sequence", "constant"],
    *,
    max_tokens: int | None = None,
    batch_rows: int | None = None,
    batch_tokens: int | None = None,
) -> Tensor:
    """mask [B, T] (1 on completion tokens, 0 on prompt/padding) -> weights [B, T].

    The batch loss is ``sum(weights * per_token_loss)``. Call once on the WHOLE training batch,
    then slice rows per micro-batch. ``batch_rows``/``batch_tokens`` are the rows and
    completion tokens of the round's whole batch, including groups without signal that are
    not passed (see the module docstring); None: those of ``mask``. ``constant`` uses
    ``max_tokens`` (default ``T``) as the length budget. Masked tokens and rows without
    tokens get weight 0 (never NaN).
    """
    if mask.ndim != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    m = (mask != 0).to(mask.dtype if mask.is_floating_point() else torch.get_default_dtype())
    lengths = m.sum(dim=1, keepdim=True)  # [B, 1]
    n_rows = m.shape[0] if batch_rows is None else batch_rows
    n_tokens = float(lengths.sum()) if batch_tokens is None else float(batch_tokens)
    if n_rows < m.shape[0]:
        raise ValueError(f"batch_rows={n_rows} is less than the {m.shape[0]} rows passed")
    if n_tokens < float(lengths.sum()):
        raise ValueError(f"batch_tokens={batch_tokens} is less than the tokens passed")
    if mode == "token":
        return m / max(n_tokens, 1.0)
    if mode == "sequence":
        return m / (lengths.clamp(min=1.0) * max(n_rows, 1))
    if mode == "constant":
        budget = m.shape[1] if max_tokens is None else max_tokens
        if budget <= 0:
            raise ValueError(f"max_tokens must be > 0, got {budget}")
        if m.shape[0] and int(lengths.max().item()) > budget:
            raise ValueError(f"a row has more than max_tokens={budget} completion tokens")
        return m / (budget * max(n_rows, 1))
    raise ValueError(f"unknown mode {mode!r}")


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi || ref) from samples of pi: [B, T] -> [B, T], >= 0."""
    d = ref_logp - logp
    return torch.expm1(d) - d


def masked_mean(x: Tensor, weights: Tensor) -> Tensor:
    """Weighted mean ``sum(w * x) / sum(w)`` of same-shape tensors; 0 when ``sum(w) == 0``."""
    total = weights.sum()
    return (weights * x).sum() / torch.where(total > 0, total, torch.ones_like(total))


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    weights: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GRPO/DAPO clipped surrogate loss (see the module docstring).

    logp, old_logp, ref_logp, weights: [B, T]; advantages: [B] (broadcast over tokens).
    Returns ``(loss, stats)``: ``loss = sum(weights * per_token_loss)`` (scalar) and detached
    scalar stats, each weighted by ``weights``: ``clip_frac`` (share of tokens whose gradient
    the clip removes), ``ratio_mean``, ``approx_kl`` (k3 of KL(old || new)) and, when
    ``ref_logp`` is given, ``kl`` (k3 of KL(new || ref)). ``ref_logp`` only enters the loss
    when ``kl_coef != 0``. Tokens with weight 0 contribute neither loss nor gradient.
    """
    if kl_coef != 0.0 and ref_logp is None:
        raise ValueError("kl_coef != 0 needs ref_logp")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be [B], got {tuple(advantages.shape)}")
    active = weights != 0
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    # Mask before exp: garbage (even inf/NaN) on weight-0 tokens cannot leak into loss or grads.
    log_ratio = torch.where(active, logp - old_logp, zero)
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    adv = advantages.to(logp.dtype)[:, None]
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    kl = None
    if ref_logp is not None:
        d = torch.where(active, ref_logp - logp, zero)
        kl = torch.expm1(d) - d  # k3_kl, masked like the ratio
        if kl_coef != 0.0:
            per_token = per_token + kl_coef * kl
    loss = (weights * per_token).sum()

    with torch.no_grad():
        w = weights.detach().to(logp.dtype)
        r = ratio.detach()
        is_clipped = ((r > 1.0 + eps_high) & (adv > 0)) | ((r < 1.0 - eps_low) & (adv < 0))
        stats = {
            "clip_frac": masked_mean(is_clipped.to(w.dtype), w),
            "ratio_mean": masked_mean(r, w),
            "approx_kl": masked_mean(torch.expm1(log_ratio) - log_ratio, w),
        }
        if kl is not None:
            stats["kl"] = masked_mean(kl.detach(), w)
    return loss, stats
