"""Unit tests for sapo_node.train.grpo (pure GRPO loss maths)."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sapo_node.train import grpo
from sapo_node.train.grpo import (
    clipped_surrogate,
    group_advantages,
    group_has_signal,
    k3_kl,
    loss_weights,
    masked_mean,
    token_logprobs,
)

F64 = torch.float64
SETTINGS = settings(deadline=None, max_examples=40)
seeds = st.integers(0, 2**31 - 1)

# Rewards on a 1/8 grid: exact in binary, so shifts/scales stay exact and std is never tiny.
reward_values = st.integers(-16, 16).map(lambda k: k / 8)


@st.composite
def reward_groups(draw, min_len: int = 2) -> torch.Tensor:
    g = draw(st.integers(1, 5))
    n = draw(st.integers(min_len, 8))
    vals = draw(st.lists(reward_values, min_size=g * n, max_size=g * n))
    return torch.tensor(vals, dtype=F64).reshape(g, n)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _random_mask(seed: int, b: int, t: int) -> torch.Tensor:
    """[B, T] mask shaped like prompt | completion | padding, some rows possibly empty."""
    g = _gen(seed)
    mask = torch.zeros(b, t, dtype=F64)
    for i in range(b):
        start = int(torch.randint(0, t, (1,), generator=g))
        length = int(torch.randint(0, t - start + 1, (1,), generator=g))
        mask[i, start : start + length] = 1.0
    return mask


# ----------------------------------------------------------------------------- advantages


@SETTINGS
@given(reward_groups(), st.sampled_from(["std", "none"]))
def test_advantages_sum_to_zero_per_group(rewards: torch.Tensor, scale: str) -> None:
    adv = group_advantages(rewards, scale=scale)
    assert adv.shape == rewards.shape
    assert torch.isfinite(adv).all()
    torch.testing.assert_close(adv.sum(dim=1), torch.zeros(rewards.shape[0], dtype=F64))


@SETTINGS
@given(reward_groups(), st.sampled_from(["std", "none"]), st.data())
def test_advantages_invariant_to_group_shift(rewards: torch.Tensor, scale: str, data) -> None:
    shift = torch.tensor(
        data.draw(st.lists(reward_values, min_size=len(rewards), max_size=len(rewards))),
        dtype=F64,
    )
    a = group_advantages(rewards, scale=scale)
    b = group_advantages(rewards + shift[:, None] * 4, scale=scale)
    torch.testing.assert_close(a, b)


@SETTINGS
@given(reward_groups(), st.floats(1e-2, 1e3))
def test_advantages_invariant_to_positive_scaling(rewards: torch.Tensor, c: float) -> None:
    a = group_advantages(rewards, scale="std", eps=0.0)
    b = group_advantages(rewards * c, scale="std", eps=0.0)
    torch.testing.assert_close(a, b)


@SETTINGS
@given(reward_values, st.integers(1, 8), st.sampled_from(["std", "none"]), st.floats(0, 1e-3))
def test_advantages_exactly_zero_when_all_equal(
    value: float, n: int, scale: str, eps: float
) -> None:
    # 0.1 is not exact in binary: its mean need not equal the value bit-for-bit.
    for v in (value, 0.1, 1 / 3):
        rewards = torch.full((3, n), v, dtype=F64)
        adv = group_advantages(rewards, scale=scale, eps=eps)
        assert torch.equal(adv, torch.zeros_like(adv))
        assert not group_has_signal(rewards).any()


def test_advantages_mixed_groups_and_int_rewards() -> None:
    rewards = torch.tensor([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0]])
    adv = group_advantages(rewards)
    assert adv.dtype == torch.get_default_dtype()
    assert group_has_signal(rewards).tolist() == [True, False, False]
    assert torch.equal(adv[1:], torch.zeros(2, 4))
    # sample std of [1, 0, 0, 1] is sqrt(1/3)
    centred = torch.tensor([0.5, -0.5, -0.5, 0.5])
    torch.testing.assert_close(adv[0], centred / (math.sqrt(1 / 3) + 1e-6))
    torch.testing.assert_close(group_advantages(rewards, scale="none")[0], centred)


@SETTINGS
@given(reward_groups(min_len=1), st.sampled_from(["std", "none"]), st.floats(0, 1e-2))
def test_advantages_match_naive_loop(rewards: torch.Tensor, scale: str, eps: float) -> None:
    expected = []
    for row in rewards.tolist():
        if len(set(row)) <= 1:
            expected.append([0.0] * len(row))
            continue
        mu = statistics.fmean(row)
        denom = statistics.stdev(row) + eps if scale == "std" else 1.0
        expected.append([(r - mu) / denom for r in row])
    got = group_advantages(rewards, scale=scale, eps=eps)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=F64))


def test_advantages_bad_input() -> None:
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(4))
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(2, 2), scale="mad")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- log-probs


@SETTINGS
@given(
    seeds,
    st.integers(1, 4),
    st.integers(1, 6),
    st.integers(2, 17),
    st.sampled_from([1.0, 0.7, 1.3, 0.05]),
)
def test_token_logprobs_matches_log_softmax(seed: int, b: int, t: int, v: int, temp: float):
    g = _gen(seed)
    logits = (torch.randn(b, t, v, generator=g, dtype=F64) * 5).requires_grad_()
    targets = torch.randint(0, v, (b, t), generator=g)
    got = token_logprobs(logits, targets, temperature=temp)
    ref = torch.log_softmax(logits / temp, dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(got, ref)
    (gg,) = torch.autograd.grad(got.sum(), logits)
    (gr,) = torch.autograd.grad(ref.sum(), logits)
    torch.testing.assert_close(gg, gr)


def test_token_logprobs_half_precision_upcasts() -> None:
    g = _gen(0)
    logits = torch.randn(2, 3, 11, generator=g) * 4
    targets = torch.randint(0, 11, (2, 3), generator=g)
    got = token_logprobs(logits.bfloat16(), targets, temperature=0.9)
    assert got.dtype == torch.float32
    ref = torch.log_softmax(logits.bfloat16().float() / 0.9, -1).gather(-1, targets[..., None])
    torch.testing.assert_close(got, ref.squeeze(-1))


def test_token_logprobs_bad_input() -> None:
    with pytest.raises(ValueError):
        token_logprobs(torch.zeros(1, 2, 3), torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError):
        token_logprobs(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), 0.0)
    assert token_logprobs(torch.zeros(0, 2, 3), torch.zeros(0, 2, dtype=torch.long)).shape == (
        0,
        2,
    )


# ----------------------------------------------------------------------------- weights


@SETTINGS
@given(seeds, st.integers(1, 6), st.integers(1, 9), st.sampled_from(["token", "sequence"]))
def test_loss_weights_sum_to_one(seed: int, b: int, t: int, mode: str) -> None:
    mask = _random_mask(seed, b, t)
    mask[0, -1] = 1.0  # at least one token
    if mode == "sequence":
        mask[:, -1] = 1.0  # every row non-empty
    w = loss_weights(mask, mode)
    assert torch.isfinite(w).all()
    torch.testing.assert_close(w.sum(), torch.tensor(1.0, dtype=F64))
    assert torch.equal(w[mask == 0], torch.zeros_like(w[mask == 0]))
    if mode == "sequence":
        torch.testing.assert_close(w.sum(dim=1), torch.full((b,), 1.0 / b, dtype=F64))
    else:
        assert torch.all(w[mask == 1] == w[mask == 1][0])


@SETTINGS
@given(seeds, st.integers(1, 6), st.integers(1, 9))
def test_loss_weights_empty_rows_and_constant(seed: int, b: int, t: int) -> None:
    mask = _random_mask(seed, b, t)
    for mode in ("token", "sequence", "constant"):
        w = loss_weights(mask, mode)
        assert torch.isfinite(w).all()
        assert torch.equal(w[mask.sum(1) == 0], torch.zeros_like(w[mask.sum(1) == 0]))
        assert torch.equal(w[mask == 0], torch.zeros_like(w[mask == 0]))
    w = loss_weights(mask, "constant", max_tokens=2 * t)
    torch.testing.assert_close(w.sum(), mask.sum() / (2 * t * b))
    torch.testing.assert_close(w, mask / (2 * t * b))
    assert torch.equal(loss_weights(torch.zeros(b, t), "token"), torch.zeros(b, t))


def test_loss_weights_bool_mask_and_errors() -> None:
    mask = torch.tensor([[True, True, False], [False, True, False]])
    w = loss_weights(mask, "sequence")
    torch.testing.assert_close(w, torch.tensor([[0.25, 0.25, 0.0], [0.0, 0.5, 0.0]]))
    with pytest.raises(ValueError):
        loss_weights(mask, "constant", max_tokens=1)
    with pytest.raises(ValueError):
        loss_weights(mask, "mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        loss_weights(torch.ones(3), "token")


# ----------------------------------------------------------------------------- full pipeline


def _toy_batch(seed: int, b: int, t: int, v: int = 7, d: int = 5):
    g = _gen(seed)
    feats = torch.randn(b, t, d, generator=g, dtype=F64)
    weight = torch.randn(d, v, generator=g, dtype=F64, requires_grad=True)
    targets = torch.randint(0, v, (b, t), generator=g)
    mask = _random_mask(seed + 1, b, t)
    with torch.no_grad():
        base = token_logprobs(feats @ weight, targets)
    old = base + 0.3 * torch.randn(b, t, generator=g, dtype=F64)  # some tokens get clipped
    ref = base + 0.2 * torch.randn(b, t, generator=g, dtype=F64)
    adv = torch.randn(b, generator=g, dtype=F64)
    return feats, weight, targets, mask, old, ref, adv


def _loss(feats, weight, targets, old, ref, adv, w, rows, kl_coef):
    logp = token_logprobs(feats[rows] @ weight, targets[rows])
    loss, _ = clipped_surrogate(
        logp, old[rows], adv[rows], w[rows], ref_logp=ref[rows], kl_coef=kl_coef
    )
    return loss


@SETTINGS
@given(
    seeds,
    st.integers(2, 7),
    st.integers(2, 6),
    st.sampled_from(["token", "sequence", "constant"]),
    st.integers(2, 3),
    st.sampled_from([0.0, 0.1]),
)
def test_micro_batches_sum_to_full_batch(
    seed: int, b: int, t: int, mode: str, n_micro: int, kl_coef: float
) -> None:
    feats, weight, targets, mask, old, ref, adv = _toy_batch(seed, b, t)
    w = loss_weights(mask, mode)
    full = _loss(feats, weight, targets, old, ref, adv, w, slice(None), kl_coef)
    (g_full,) = torch.autograd.grad(full, weight)

    perm = torch.randperm(b, generator=_gen(seed + 2))
    total = torch.zeros((), dtype=F64)
    g_sum = torch.zeros_like(weight)
    for rows in perm.tensor_split(n_micro):
        if len(rows) == 0:
            continue
        loss = _loss(feats, weight, targets, old, ref, adv, w, rows, kl_coef)
        (g,) = torch.autograd.grad(loss, weight)
        total, g_sum = total + loss.detach(), g_sum + g
    torch.testing.assert_close(total, full.detach())
    torch.testing.assert_close(g_sum, g_full)


@SETTINGS
@given(seeds, st.integers(1, 5), st.integers(2, 6), st.sampled_from(["token", "sequence"]))
def test_padded_tokens_get_zero_gradient(seed: int, b: int, t: int, mode: str) -> None:
    feats, weight, targets, mask, old, ref, adv = _toy_batch(seed, b, t)
    logits = (feats @ weight).detach().requires_grad_()
    w = loss_weights(mask, mode)

    def loss_of(lg: torch.Tensor) -> torch.Tensor:
        logp = token_logprobs(lg, targets)
        return clipped_surrogate(logp, old, adv, w, ref_logp=ref, kl_coef=0.05)[0]

    loss = loss_of(logits)
    (grad,) = torch.autograd.grad(loss, logits)
    pad = mask == 0
    assert torch.equal(grad[pad], torch.zeros_like(grad[pad]))
    # Perturbing (even wildly) the logits at padded positions changes nothing.
    noisy = logits.detach().clone()
    noisy[pad] += 1e3 * torch.randn_like(noisy[pad])
    torch.testing.assert_close(loss_of(noisy), loss.detach())


def test_garbage_on_padded_tokens_does_not_leak() -> None:
    logp = torch.tensor([[-1.0, float("nan")], [-2.0, float("-inf")]], requires_grad=True)
    old = torch.tensor([[-1.2, float("-inf")], [-1.9, 5.0]])
    w = torch.tensor([[0.5, 0.0], [0.5, 0.0]])
    loss, stats = clipped_surrogate(
        logp, old, torch.tensor([1.0, -1.0]), w, ref_logp=old, kl_coef=0.1
    )
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(logp.grad).all()
    assert all(torch.isfinite(v) for v in stats.values())


# ----------------------------------------------------------------------------- clipping


def _surrogate_grad(log_ratio: float, adv: float, weight: float = 0.5, **kw):
    old = torch.tensor([[-1.0]], dtype=F64)
    logp = (old + log_ratio).requires_grad_()
    w = torch.tensor([[weight]], dtype=F64)
    loss, stats = clipped_surrogate(logp, old, torch.tensor([adv], dtype=F64), w, **kw)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad.item(), stats


@SETTINGS
@given(st.floats(0.5, 5.0), st.floats(0.1, 10.0))
def test_clipped_when_ratio_high_and_advantage_positive(log_ratio: float, adv: float) -> None:
    loss, grad, stats = _surrogate_grad(log_ratio, adv)
    assert grad == 0.0
    torch.testing.assert_close(loss, torch.tensor(-0.5 * 1.28 * adv, dtype=F64))
    assert stats["clip_frac"].item() == 1.0
    # The other sign is not clipped: the pessimistic unclipped term keeps its gradient.
    _, grad_neg, stats_neg = _surrogate_grad(log_ratio, -adv)
    assert grad_neg == pytest.approx(0.5 * adv * math.exp(log_ratio))
    assert stats_neg["clip_frac"].item() == 0.0


@SETTINGS
@given(st.floats(-5.0, -0.3), st.floats(0.1, 10.0))
def test_clipped_when_ratio_low_and_advantage_negative(log_ratio: float, adv: float) -> None:
    loss, grad, stats = _surrogate_grad(log_ratio, -adv)
    assert grad == 0.0
    torch.testing.assert_close(loss, torch.tensor(0.5 * 0.8 * adv, dtype=F64))
    assert stats["clip_frac"].item() == 1.0
    _, grad_pos, _ = _surrogate_grad(log_ratio, adv)
    assert grad_pos == pytest.approx(-0.5 * adv * math.exp(log_ratio))


@SETTINGS
@given(st.floats(math.log(0.81), math.log(1.27)), st.floats(-10.0, 10.0), st.floats(0.01, 1.0))
def test_gradient_inside_band(log_ratio: float, adv: float, weight: float) -> None:
    loss, grad, stats = _surrogate_grad(log_ratio, adv, weight)
    ratio = math.exp(log_ratio)
    assert grad == pytest.approx(-adv * ratio * weight, rel=1e-9, abs=1e-12)
    assert loss.item() == pytest.approx(-adv * ratio * weight, rel=1e-9, abs=1e-12)
    assert stats["clip_frac"].item() == 0.0
    assert stats["ratio_mean"].item() == pytest.approx(ratio)


def test_asymmetric_bounds_are_used() -> None:
    log_ratio = math.log(1.25)  # inside [0.8, 1.28], outside symmetric [0.8, 1.2]
    _, grad, _ = _surrogate_grad(log_ratio, 1.0, weight=1.0)
    assert grad == pytest.approx(-1.25)
    _, grad_sym, _ = _surrogate_grad(log_ratio, 1.0, weight=1.0, eps_high=0.2)
    assert grad_sym == 0.0
    loss, _, _ = _surrogate_grad(math.log(3.0), 1.0, weight=1.0, eps_low=0.1, eps_high=0.5)
    assert loss.item() == pytest.approx(-1.5)
    loss, _, _ = _surrogate_grad(math.log(0.1), -1.0, weight=1.0, eps_low=0.1, eps_high=0.5)
    assert loss.item() == pytest.approx(0.9)
    # lower bound is eps_low, not eps_high: 0.75 is clipped by 0.2 but not by 0.28
    _, grad_low, _ = _surrogate_grad(math.log(0.75), -1.0, weight=1.0)
    assert grad_low == 0.0
    _, grad_wide, _ = _surrogate_grad(math.log(0.75), -1.0, weight=1.0, eps_low=0.28)
    assert grad_wide == pytest.approx(0.75)


@SETTINGS
@given(seeds, st.integers(1, 5), st.integers(1, 6))
def test_ratio_one_gives_minus_weighted_advantage(seed: int, b: int, t: int) -> None:
    g = _gen(seed)
    logp = torch.randn(b, t, generator=g, dtype=F64) - 2
    adv = torch.randn(b, generator=g, dtype=F64)
    w = loss_weights(_random_mask(seed, b, t), "token")
    loss, stats = clipped_surrogate(logp.requires_grad_(), logp.detach(), adv, w)
    torch.testing.assert_close(loss.detach(), -(w * adv[:, None]).sum())
    assert stats["clip_frac"].item() == 0.0
    assert stats["approx_kl"].item() == 0.0
    assert "kl" not in stats
    assert not any(v.requires_grad for v in stats.values())


# ----------------------------------------------------------------------------- KL


@SETTINGS
@given(seeds, st.integers(1, 4), st.integers(1, 6))
def test_kl_coef_zero_ignores_ref(seed: int, b: int, t: int) -> None:
    feats, weight, targets, mask, old, ref, adv = _toy_batch(seed, b, t)
    w = loss_weights(mask, "sequence")
    logp = token_logprobs(feats @ weight, targets)
    plain, _ = clipped_surrogate(logp, old, adv, w)
    junk = torch.full_like(ref, 1e3)  # exp(ref - logp) overflows: 0 * inf must not happen
    with_ref, stats = clipped_surrogate(logp, old, adv, w, ref_logp=junk, kl_coef=0.0)
    torch.testing.assert_close(plain, with_ref)
    (g1,) = torch.autograd.grad(plain, weight, retain_graph=True)
    (g2,) = torch.autograd.grad(with_ref, weight)
    torch.testing.assert_close(g1, g2)
    assert "kl" in stats and stats["kl"].item() >= 0.0


@SETTINGS
@given(seeds, st.integers(1, 4), st.integers(1, 6), st.floats(0.01, 1.0))
def test_kl_term_is_added_with_coef(seed: int, b: int, t: int, coef: float) -> None:
    _, _, _, mask, old, ref, adv = _toy_batch(seed, b, t)
    logp = old + 0.05
    w = loss_weights(mask, "token")
    plain, _ = clipped_surrogate(logp, old, adv, w)
    with_kl, stats = clipped_surrogate(logp, old, adv, w, ref_logp=ref, kl_coef=coef)
    expected = plain + coef * (w * k3_kl(logp, ref)).sum()
    torch.testing.assert_close(with_kl, expected)
    torch.testing.assert_close(stats["kl"], masked_mean(k3_kl(logp, ref), w))


@SETTINGS
@given(seeds, st.floats(0.01, 10.0))
def test_k3_nonnegative_and_zero_when_equal(seed: int, spread: float) -> None:
    g = _gen(seed)
    logp = torch.randn(3, 8, generator=g, dtype=F64) * spread
    ref = torch.randn(3, 8, generator=g, dtype=F64) * spread
    assert (k3_kl(logp, ref) >= 0).all()
    assert torch.equal(k3_kl(logp, logp), torch.zeros_like(logp))


def test_kl_coef_without_ref_raises() -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError):
        clipped_surrogate(x, x, torch.zeros(1), x, kl_coef=0.1)
    with pytest.raises(ValueError):
        clipped_surrogate(x, x, torch.zeros(1, 2), x)


def test_stats_are_weighted() -> None:
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[2.0, 1.0, 1.0, 1.0]]))
    w = torch.tensor([[0.5, 0.25, 0.25, 0.0]])
    _, stats = clipped_surrogate(logp, old, torch.tensor([1.0]), w)
    assert stats["clip_frac"].item() == pytest.approx(0.5)
    assert stats["ratio_mean"].item() == pytest.approx(1.5)
    assert stats["approx_kl"].item() == pytest.approx(0.5 * (1.0 - math.log(2.0)))
    assert masked_mean(torch.ones(2), torch.zeros(2)).item() == 0.0


# --- whole-batch normalisation and the sampler's truncation ------------------------------


@pytest.mark.parametrize("mode", ["token", "sequence", "constant"])
def test_weights_of_a_group_do_not_depend_on_other_groups_signal(mode: str) -> None:
    """The rows passed weigh what they weigh in the whole batch they came from."""
    signal = (torch.arange(6)[None, :] < torch.tensor([[3], [6], [1]])).float()
    flat = (torch.arange(6)[None, :] < torch.tensor([[2], [5]])).float()
    whole = grpo.loss_weights(torch.cat([signal, flat]), mode, max_tokens=8)[:3]
    got = grpo.loss_weights(
        signal, mode, max_tokens=8, batch_rows=5, batch_tokens=int(signal.sum() + flat.sum())
    )
    torch.testing.assert_close(got, whole)
    assert not torch.allclose(grpo.loss_weights(signal, mode, max_tokens=8), whole)
    with pytest.raises(ValueError, match="batch_rows"):
        grpo.loss_weights(signal, mode, max_tokens=8, batch_rows=2)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, 0, 0.9), (0.7, 5, 1.0), (1.3, 10, 0.5), (1.0, 1, 0.3), (0.5, 0, 0.01), (2.0, 50, 0.95)],
)
def test_truncation_equals_hugging_face_warpers(temperature, top_k, top_p) -> None:
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    g = torch.Generator().manual_seed(int(temperature * 100) + top_k)
    scores = torch.randn(64, 40, generator=g) * 3
    want = TemperatureLogitsWarper(temperature)(None, scores.clone())
    if top_k:
        want = TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1)(None, want)
    if top_p < 1:
        want = TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1)(None, want)
    got = grpo.truncated_logits(scores, temperature, top_k=top_k, top_p=top_p)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    torch.testing.assert_close(got[~torch.isinf(got)], want[~torch.isinf(want)])
    # log-probs of sampled tokens are those of the warped distribution
    probs = torch.softmax(want, -1)
    targets = torch.multinomial(probs, 1, generator=g)[:, 0].view(8, 8)
    logp = grpo.token_logprobs(
        scores.view(8, 8, 40), targets, temperature, top_k=top_k, top_p=top_p
    )
    ref = torch.log_softmax(want, -1).gather(-1, targets.view(-1, 1)).view(8, 8)
    torch.testing.assert_close(logp, ref)
    ent = grpo.token_entropy(scores.view(8, 8, 40), temperature, top_k=top_k, top_p=top_p)
    direct = torch.distributions.Categorical(logits=want).entropy().view(8, 8)
    torch.testing.assert_close(ent, direct)


def test_a_truncated_target_keeps_a_finite_log_prob() -> None:
    logits = torch.tensor([[[5.0, 4.0, -3.0]]], requires_grad=True)
    logp = grpo.token_logprobs(logits, torch.tensor([[2]]), top_k=1)
    assert torch.isfinite(logp).all()
    logp.sum().backward()
    assert torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_untruncated_logprobs_keep_the_reference_gradient(dtype, temperature: float) -> None:
    """The default sampling's log-probs (no truncation: the softmax is recomputed in
    backward) against autograd through a plain log-softmax, values and gradients."""
    torch.manual_seed(0)
    base = torch.randn(3, 5, 50) * 3
    targets = torch.randint(0, 50, (3, 5))
    weights = torch.randn(3, 5)
    ours = base.to(dtype).requires_grad_(True)
    (grpo.token_logprobs(ours, targets, temperature) * weights).sum().backward()
    ref = base.to(dtype).float().requires_grad_(True)
    expected = torch.log_softmax(ref / temperature, -1).gather(-1, targets[..., None])[..., 0]
    (expected * weights).sum().backward()
    got = grpo.token_logprobs(ours.detach(), targets, temperature)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected.detach(), rtol=1e-5, atol=1e-5)
    assert ours.grad.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(ours.grad.float(), ref.grad, rtol=tol, atol=tol)
