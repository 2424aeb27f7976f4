"""Prompt sharing in training (one row per prompt, a block attention mask, the prompts'
common first tokens computed once a step): the loss and every gradient equal the unshared
computation (each completion with its own whole prompt)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from sapo_node.config import LoraSection, TrainSection
from sapo_node.train import trainer as trainer_module
from sapo_node.train.policy import load_policy
from sapo_node.train.prefix import PrefixLayer
from sapo_node.train.trainer import Sample, Trainer, block_mask, pack, shared_attention
from tests.support.unshared import unshared_backward

SHARED = 12  # first tokens every prompt of ``_groups`` has in common, as a system prompt


def _groups(sizes=(4, 3, 5), seed: int = 3, shared: int = SHARED) -> list[Sample]:
    """Groups with different prompt lengths, their first ``shared`` tokens the same, and
    ragged completions (some of length 1)."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(4, 90, (shared,), generator=g).tolist()
    out = []
    for k, n in enumerate(sizes):
        prompt = start + [90 + k] + torch.randint(4, 90, (3 + 3 * k,), generator=g).tolist()
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


def _compare(policy, settings: TrainSection, shared: int = SHARED, **weights) -> None:
    samples = _groups(shared=shared)
    trainer = Trainer(policy, settings, max_new_tokens=16)
    prefix = trainer._shared_prefix(samples)
    assert len(prefix) == (shared if settings.shared_prefix else 0)
    loss = trainer.gradients(samples, **weights)
    got = _grads(policy)
    for idx, mb in trainer._micro_batches(samples, len(prefix)):  # one row per prompt
        assert mb.input_ids.shape[0] == len({tuple(samples[i].prompt_ids) for i in idx})
    want_loss = unshared_backward(policy, samples, settings, 16, **weights)
    want = _grads(policy)
    assert set(got) == set(want) and got
    assert loss == pytest.approx(want_loss, abs=1e-6)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("micro", [2, 4, 5, 64])  # smaller than, equal to, larger than a group
@pytest.mark.parametrize("norm", ["token", "sequence"])
def test_shared_prompts_give_the_unshared_gradients(tiny_policy, micro: int, norm: str) -> None:
    _compare(tiny_policy, TrainSection(micro_batch_size=micro, loss_norm=norm))


@pytest.mark.parametrize(("shared", "on"), [(0, True), (SHARED, False)])
def test_prompts_with_nothing_in_common_or_the_prefix_switched_off(
    tiny_policy, shared: int, on: bool
) -> None:
    _compare(tiny_policy, TrainSection(micro_batch_size=4, shared_prefix=on), shared=shared)


def test_one_prompt_in_one_micro_batch_has_nothing_to_share(tiny_policy) -> None:
    trainer = Trainer(tiny_policy, TrainSection(micro_batch_size=8), max_new_tokens=16)
    one = [smp for smp in _groups() if smp.prompt_ids == _groups()[0].prompt_ids]
    assert trainer._shared_prefix(one) == []
    assert len(trainer._shared_prefix(one * 3)) == len(one[0].prompt_ids) - 1  # 2 batches


def _settings_pair(**kw) -> tuple[TrainSection, TrainSection]:
    return TrainSection(**kw), TrainSection(shared_prefix=False, **kw)


def test_a_step_with_reference_kl_and_two_epochs_is_the_same_either_way(tiny_policy) -> None:
    """The reference model's log-probs and each epoch's new weights get their own prefix."""
    samples = _groups()
    on, off = _settings_pair(
        micro_batch_size=4, kl_coef=0.1, ppo_epochs=2, optimizer="adam", lr=1e-3
    )
    a, b = copy.deepcopy(tiny_policy), copy.deepcopy(tiny_policy)
    stats = Trainer(a, on, max_new_tokens=16).step(samples)
    want = Trainer(b, off, max_new_tokens=16).step(samples)
    assert stats is not None and want is not None and stats.steps == 2
    assert stats.kl == pytest.approx(want.kl, rel=1e-4, abs=1e-7) and stats.kl > 0
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4, msg=name)


def test_a_model_that_drops_the_prefix_is_refused(tiny_policy) -> None:
    """A decoder layer that drops the cache it is given (as transformers' layers do under
    gradient checkpointing unless told the cache is only read) would compute its rows
    without their prompts' start. The step says so instead of training on that."""

    def drop(module, args, kwargs):  # the prefix's cache only: its own forward keeps one
        cache = kwargs.get("cache")
        if cache is not None and isinstance(cache.layers[0], PrefixLayer):
            kwargs = {**kwargs, "cache": None}
        return args, kwargs

    layers = list(tiny_policy.model.get_decoder().layers)
    hooks = [m.register_forward_pre_hook(drop, with_kwargs=True) for m in layers]
    trainer = Trainer(tiny_policy, TrainSection(micro_batch_size=4), max_new_tokens=16)
    try:
        with pytest.raises(RuntimeError, match="shared prompt prefix was read by 0 of 2 layers"):
            trainer.gradients(_groups())
    finally:
        for h in hooks:
            h.remove()
    trainer.gradients(_groups(shared=0))  # nothing shared: nothing to drop


def _lora_policy(model_dir: Path, *, gradient_checkpointing: bool = False):
    """The tiny model with LoRA adapters whose B is moved off zero (at zero, A's gradient
    would be zero); seeded, so two calls make the same adapters."""
    torch.manual_seed(0)
    pol = load_policy(
        str(model_dir),
        device="cpu",
        dtype="float32",
        lora=LoraSection(enabled=True, r=4),
        cache_dir=model_dir,
        gradient_checkpointing=gradient_checkpointing,
    )
    with torch.no_grad():
        for n, p in pol.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    return pol


@pytest.mark.parametrize("head", ["chunked", "model's own"])
def test_shared_prompts_with_lora(tiny_model_dir: Path, head: str, monkeypatch) -> None:
    if head != "chunked":  # the adapted model's own forward, the prefix through it
        monkeypatch.setattr(trainer_module, "PLAIN_HEAD_MODELS", frozenset())
    pol = _lora_policy(tiny_model_dir)
    _compare(pol, TrainSection(micro_batch_size=3), batch_rows=20, batch_tokens=100)


def _plain_and_checkpointed(model_dir: Path):
    """The tiny model twice: as it is, and with gradient checkpointing on."""
    kw = dict(device="cpu", dtype="float32", lora=LoraSection(), cache_dir=model_dir)
    plain = load_policy(str(model_dir), **kw)
    return plain, load_policy(str(model_dir), gradient_checkpointing=True, **kw)


def _assert_same_gradients(want_policy, got_policy) -> None:
    want, got = _grads(want_policy), _grads(got_policy)
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-4, msg=name)


def test_gradient_checkpointing_shares_prompts_with_the_same_gradients(
    tiny_model_dir: Path,
) -> None:
    plain, ckpt = _plain_and_checkpointed(tiny_model_dir)
    samples = _groups()
    settings = TrainSection(micro_batch_size=4, checkpoint_above_tokens=0)  # all checkpointed
    trainer = Trainer(ckpt, settings, max_new_tokens=16)
    assert any(mb.input_ids.shape[0] < len(idx) for idx, mb in trainer._micro_batches(samples))
    Trainer(plain, settings, max_new_tokens=16).gradients(samples)
    trainer.gradients(samples)
    _assert_same_gradients(plain, ckpt)


def _count_checkpointed(layers) -> list[object]:
    """A list that gets each layer once per call it runs checkpointed."""
    calls: list[object] = []
    for m in layers:
        run = m._gradient_checkpointing_func
        m._gradient_checkpointing_func = lambda *a, _run=run, _m=m, **k: (
            calls.append(_m),
            _run(*a, **k),
        )[1]
    return calls


def test_only_micro_batches_above_the_token_threshold_are_checkpointed(
    tiny_model_dir: Path,
) -> None:
    plain, ckpt = _plain_and_checkpointed(tiny_model_dir)
    samples = _groups()
    trainer = Trainer(ckpt, TrainSection(micro_batch_size=4), 16)
    batches = trainer._micro_batches(samples, len(trainer._shared_prefix(samples)))
    sizes = [mb.input_ids.numel() for _, mb in batches]
    threshold = sorted(sizes)[len(sizes) // 2]  # some micro-batches above it, some not
    above = sum(n > threshold for n in sizes)
    assert 0 < above < len(sizes)
    flagged = [m for m in ckpt.model.modules() if getattr(m, "gradient_checkpointing", 0) is True]
    layers = list(ckpt.model.get_decoder().layers)
    assert set(layers) <= set(flagged)
    calls = _count_checkpointed(layers)
    settings = TrainSection(micro_batch_size=4, checkpoint_above_tokens=threshold)
    Trainer(plain, settings, max_new_tokens=16).gradients(samples)
    Trainer(ckpt, settings, max_new_tokens=16).gradients(samples)
    assert len(calls) == above * len(layers)  # each layer, once a large micro-batch
    assert all(m.gradient_checkpointing is True for m in flagged)  # on again after
    _assert_same_gradients(plain, ckpt)


def test_eager_attention_gets_an_additive_block_mask(tiny_model_dir: Path) -> None:
    pol = load_policy(
        str(tiny_model_dir),
        device="cpu",
        dtype="float32",
        lora=LoraSection(),
        cache_dir=tiny_model_dir,
    )
    pol.model.config._attn_implementation = "eager"
    assert shared_attention(pol.model) == "eager"
    _compare(pol, TrainSection(micro_batch_size=5))


def test_a_model_without_full_attention_gets_one_completion_a_row(tiny_policy) -> None:
    tiny_policy.model.config.sliding_window, tiny_policy.model.config.use_sliding_window = 8, True
    assert shared_attention(tiny_policy.model) is None
    trainer = Trainer(tiny_policy, TrainSection(micro_batch_size=4), max_new_tokens=16)
    for idx, mb in trainer._micro_batches(_groups()):
        assert mb.input_ids.shape[0] == len(idx) and mb.attention_mask.ndim == 2


def test_pack_puts_a_prompt_once_before_its_completions() -> None:
    samples = [
        Sample([1, 2], [3, 4, 5], 1.0),
        Sample([6], [7], -1.0),
        Sample([1, 2], [8, 9], 0.5),
    ]
    mb = pack(samples, pad_id=0)
    # row 0: prompt [1, 2], then [3, 4] (inputs of 3 4 5) and [8] (of 8 9); row 1: [6]
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 8], [0, 6, 0, 0, 0]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 2], [0, 0, 0, 0, 0]]
    assert mb.row.tolist() == [0, 1, 0]
    assert mb.next_ids.tolist() == [[4, 5, 9], [0, 0, 0]]
    assert mb.index.tolist() == [[0, 1], [0, 0], [2, 0]]
    assert mb.targets.tolist() == [[3, 4, 5], [7, 0, 0], [8, 9, 0]]
    seen = mb.attention_mask[0, 0].int().tolist()
    assert seen[4] == [1, 1, 0, 0, 1]  # the second completion sees the prompt, not the first
    assert seen[3] == [1, 1, 1, 1, 0]
    assert mb.attention_mask[1, 0].int().tolist()[0] == [1, 0, 0, 0, 0]  # padding: itself
    unshared = pack(samples, pad_id=0, attention=None)
    assert unshared.input_ids.shape[0] == 3 and unshared.attention_mask.ndim == 2


def test_block_mask_for_eager_attention_is_additive() -> None:
    seen = block_mask(torch.tensor([[0, 1, 2]]), "sdpa")
    additive = block_mask(torch.tensor([[0, 1, 2]]), "eager")
    assert additive.dtype == torch.float32
    assert torch.equal(additive == 0, seen)


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


def test_gradient_checkpointing_with_lora_gives_the_adapters_their_gradients(
    tiny_model_dir: Path,
) -> None:
    plain = _lora_policy(tiny_model_dir)
    ckpt = _lora_policy(tiny_model_dir, gradient_checkpointing=True)
    samples, settings = _groups(), TrainSection(micro_batch_size=4)
    layers = list(ckpt.model.get_base_model().get_decoder().layers)
    calls = _count_checkpointed(layers)
    Trainer(plain, settings, max_new_tokens=16).gradients(samples)
    trainer = Trainer(ckpt, settings, max_new_tokens=16)
    trainer.gradients(samples)
    # with LoRA, by default, every micro-batch is checkpointed, however small (the
    # shared prefix's one short row never is)
    assert len(calls) == len(trainer._micro_batches(samples)) * len(layers)
    assert _grads(plain)
    _assert_same_gradients(plain, ckpt)


def test_long_rows_are_taken_a_few_positions_at_a_time(tiny_policy, monkeypatch) -> None:
    monkeypatch.setattr(trainer_module, "POSITIONS_PER_CALL", 3)
    _compare(tiny_policy, TrainSection(micro_batch_size=5, loss_norm="sequence"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_chunked_head_switch_gives_the_same_gradients(tiny_model_dir: Path, dtype) -> None:
    """train.chunked_head off: the model's own forward and logits; the same gradients (in
    float32 to rounding; in bfloat16 the head's gradient is summed in bfloat16 chunk by
    chunk, so within 2% of the largest)."""
    pol = load_policy(
        str(tiny_model_dir), device="cpu", dtype=dtype, lora=LoraSection(), cache_dir=tiny_model_dir
    )
    samples, grads = _groups(), {}
    for chunked in (True, False):
        settings = TrainSection(micro_batch_size=5, chunked_head=chunked)
        calls: list[int] = []  # the model's own forward runs only on the plain path
        hook = pol.model.register_forward_pre_hook(lambda mod, args, c=calls: c.append(1))
        Trainer(pol, settings, max_new_tokens=16).gradients(samples)
        hook.remove()
        assert bool(calls) is not chunked
        grads[chunked] = _grads(pol)
        pol.model.zero_grad(set_to_none=True)
    scale = max(float(g.abs().max()) for g in grads[False].values())
    for name, want in grads[False].items():
        if dtype == "float32":
            torch.testing.assert_close(grads[True][name], want, atol=1e-6, rtol=1e-4, msg=name)
        else:
            assert float((grads[True][name] - want).abs().max()) <= 2e-2 * scale, name


def test_logits_from_the_model_or_a_chunk_at_a_time_give_the_same_gradients(
    tiny_policy, monkeypatch
) -> None:
    # The tiny model (llama) takes the chunked head; a model type not known to end at its
    # head takes the model's own logits. Both equal the unshared computation.
    assert tiny_policy.model.config.model_type in trainer_module.PLAIN_HEAD_MODELS
    monkeypatch.setattr(trainer_module, "PLAIN_HEAD_MODELS", frozenset())
    _compare(tiny_policy, TrainSection(micro_batch_size=5))
