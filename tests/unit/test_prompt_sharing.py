"""Prompt sharing in training: loss and every gradient equal the unshared computation."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from sapo_node.config import LoraSection, TrainSection
from sapo_node.policy import load_policy
from sapo_node.trainer import Sample, SharedPacked, Trainer
from tests.support.unshared import unshared_backward


def _groups(sizes=(4, 3, 5), seed: int = 3) -> list[Sample]:
    """Groups with different prompt lengths and ragged completions (some of length 1)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k, n in enumerate(sizes):
        prompt = torch.randint(4, 90, (4 + 3 * k,), generator=g).tolist()
        for j in range(n):
            length = 1 if j == 0 else int(torch.randint(2, 9, (1,), generator=g))
            comp = torch.randint(4, 90, (length,), generator=g).tolist()
            out.append(Sample(prompt, comp, advantage=float(torch.randn(1, generator=g))))
    # interleave the groups: sharing must not rely on the caller's order
    return out[::2] + out[1::2]


def _grads(policy) -> dict[str, torch.Tensor]:
    return {
        n: p.grad.detach().clone()
        for n, p in policy.model.named_parameters()
        if p.requires_grad and p.grad is not None
    }


def _compare(policy, settings: TrainSection, **weights) -> None:
    samples = _groups()
    trainer = Trainer(policy, settings, max_new_tokens=16)
    shared = trainer.gradients(samples, **weights)
    got = _grads(policy)
    assert all(isinstance(mb, SharedPacked) for _, mb in trainer._micro_batches(samples))
    want_loss = unshared_backward(policy, samples, settings, 16, **weights)
    want = _grads(policy)
    assert set(got) == set(want) and got
    assert shared == pytest.approx(want_loss, abs=1e-6)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("micro", [2, 4, 5, 64])  # smaller than, equal to, larger than a group
@pytest.mark.parametrize("norm", ["token", "sequence"])
def test_shared_prompts_give_the_unshared_gradients(tiny_policy, micro: int, norm: str) -> None:
    _compare(tiny_policy, TrainSection(micro_batch_size=micro, loss_norm=norm))


def test_shared_prompts_with_lora(tiny_model_dir: Path) -> None:
    pol = load_policy(
        str(tiny_model_dir),
        device="cpu",
        dtype="auto",
        lora=LoraSection(enabled=True, r=4),
        cache_dir=tiny_model_dir,
    )
    # LoRA's B starts at zero, which would make A's gradient zero: move B first.
    with torch.no_grad():
        for n, p in pol.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    _compare(pol, TrainSection(micro_batch_size=3), batch_rows=20, batch_tokens=100)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_dir: Path) -> None:
    kw = dict(device="cpu", dtype="auto", lora=LoraSection(), cache_dir=tiny_model_dir)
    plain = load_policy(str(tiny_model_dir), **kw)
    ckpt = load_policy(str(tiny_model_dir), gradient_checkpointing=True, **kw)
    samples, settings = _groups(), TrainSection(micro_batch_size=4)
    Trainer(plain, settings, max_new_tokens=16).gradients(samples)
    Trainer(ckpt, settings, max_new_tokens=16).gradients(samples)
    want, got = _grads(plain), _grads(ckpt)
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-4, msg=name)


def test_shared_step_equals_unshared_step(tiny_policy) -> None:
    """A whole optimiser step (Adam) from the shared gradients matches the unshared one."""
    samples = _groups()
    settings = TrainSection(micro_batch_size=4, optimizer="adam", lr=1e-3)
    a, b = copy.deepcopy(tiny_policy), copy.deepcopy(tiny_policy)
    Trainer(a, settings, max_new_tokens=16).step(samples)
    ref = Trainer(b, settings, max_new_tokens=16)
    unshared_backward(b, samples, settings, 16)
    torch.nn.utils.clip_grad_norm_(ref.params, settings.grad_clip)
    ref.optimizer.step()
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4, msg=name)
