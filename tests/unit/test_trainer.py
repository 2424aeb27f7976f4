from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from sapo_node.config import LoraSection, TrainSection
from sapo_node.train import grpo
from sapo_node.train.policy import load_policy
from sapo_node.train.trainer import Sample, Trainer, pack
from tests.support.unshared import pack as pack_unshared


@pytest.fixture()
def policy(tiny_policy):
    return tiny_policy


def _samples(n: int = 6) -> list[Sample]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        p = torch.randint(4, 90, (3 + i % 3,), generator=g).tolist()
        c = torch.randint(4, 90, (2 + (i * 5) % 7,), generator=g).tolist()
        out.append(Sample(p, c, advantage=(-1.0) ** i * (0.5 + i / 10)))
    return out


def test_log_probs_are_those_of_the_sampling_temperature(policy) -> None:
    samples = _samples(3)
    ref, mb = pack_unshared(samples, 0), pack(samples, policy.tokenizer.pad_token_id)
    hot = Trainer(policy, TrainSection(), max_new_tokens=16, temperature=2.0)
    plain = Trainer(policy, TrainSection(), max_new_tokens=16)
    with torch.no_grad():
        logits = policy.model(
            input_ids=ref.input_ids,
            attention_mask=ref.attention_mask,
            position_ids=ref.position_ids,
        ).logits
        c = mb.targets.shape[1]
        want = torch.log_softmax(logits[:, -c - 1 : -1].float() / 2.0, -1)
        want = want.gather(-1, mb.targets[..., None])[..., 0]
        got, base = hot._logprobs(policy.model, mb), plain._logprobs(policy.model, mb)
    torch.testing.assert_close(got * mb.mask, want * mb.mask, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(got * mb.mask, base * mb.mask)


def test_pack_layout() -> None:
    packed = pack([Sample([1, 2, 3], [4, 5], 1.0), Sample([6], [7, 8, 9], -1.0)], pad_id=0)
    assert packed.input_ids.tolist() == [[1, 2, 3, 4, 0], [0, 0, 6, 7, 8]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 0], [0, 0, 0, 1, 2]]
    assert packed.targets.tolist() == [[4, 5, 0], [7, 8, 9]]
    assert packed.mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert packed.next_ids.tolist() == [[5, 0], [8, 9]]


def test_packed_logprobs_equal_unpadded_forward(policy) -> None:
    samples = _samples()
    trainer = Trainer(policy, TrainSection(micro_batch_size=4), max_new_tokens=16)
    mb = pack(samples, policy.tokenizer.pad_token_id)
    with torch.no_grad():
        got = trainer._logprobs(policy.model, mb)
        for i, s in enumerate(samples):
            ids = torch.tensor([s.prompt_ids + s.completion_ids])
            logits = policy.model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1]
            want = torch.log_softmax(logits.float(), -1).gather(
                -1, torch.tensor(s.completion_ids)[:, None]
            )[:, 0]
            torch.testing.assert_close(got[i, : len(s.completion_ids)], want, atol=1e-4, rtol=1e-4)


def _grads(policy, samples, **train) -> dict[str, torch.Tensor]:
    Trainer(policy, TrainSection(**train), max_new_tokens=16).gradients(samples)
    return {n: t.grad.detach().clone() for n, t in policy.model.named_parameters()}


@pytest.mark.parametrize("norm", ["token", "sequence", "constant"])
def test_micro_batching_does_not_change_the_gradient(policy, norm: str) -> None:
    samples = _samples()
    one = _grads(policy, samples, micro_batch_size=64, loss_norm=norm)
    many = _grads(policy, samples, micro_batch_size=2, loss_norm=norm)
    for name in one:
        torch.testing.assert_close(one[name], many[name], atol=1e-7, rtol=1e-4)


def test_update_moves_probability_toward_positive_advantage(policy) -> None:
    good = Sample([10, 11, 12], [40, 41], 1.0)
    bad = Sample([10, 11, 12], [50, 51], -1.0)
    trainer = Trainer(policy, TrainSection(lr=1e-3), max_new_tokens=16)

    def logp(s: Sample) -> float:
        with torch.no_grad():
            return float(trainer._logprobs(policy.model, pack([s], 0)).sum())

    before = logp(good), logp(bad)
    trainer.step([good, bad])
    assert logp(good) > before[0]
    assert logp(good) - logp(bad) > before[0] - before[1] + 0.01


def test_several_ppo_epochs_make_the_clip_act(policy) -> None:
    trainer = Trainer(policy, TrainSection(lr=5e-2, ppo_epochs=4), max_new_tokens=16)
    stats = trainer.step(_samples())
    assert stats.steps == 4
    assert stats.clip_frac > 0  # old log-probs are real: later steps' ratios leave the band


def _grad_norm(policy, samples: list[Sample]) -> float:
    """The total gradient norm of one epoch, computed on a copy without any step."""
    twin = copy.deepcopy(policy)
    Trainer(twin, TrainSection(), max_new_tokens=16).gradients(samples)
    grads = [p.grad.flatten() for p in twin.trainable_parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.cat(grads)))


@pytest.mark.parametrize(("clip_at", "clipped"), [(0.5, 1), (2.0, 0), (None, 0)])
def test_a_step_reports_its_gradient_norm_before_clipping_and_whether_it_was_clipped(
    policy, clip_at: float | None, clipped: int
) -> None:
    """clip_at: the clip as a multiple of the step's gradient norm (None: no clip)."""
    samples = _samples()
    norm = _grad_norm(policy, samples)
    grad_clip = 0.0 if clip_at is None else clip_at * norm
    trainer = Trainer(policy, TrainSection(lr=1e-2, grad_clip=grad_clip), max_new_tokens=16)
    stats = trainer.step(samples)
    assert stats.steps == 1
    assert stats.grad_norm == stats.grad_norm_max == pytest.approx(norm, rel=1e-4)
    assert stats.clipped_steps == clipped


def test_several_epochs_report_their_largest_norm_and_every_clipped_step(policy) -> None:
    trainer = Trainer(policy, TrainSection(lr=5e-2, ppo_epochs=3, grad_clip=1e-6), 16)
    stats = trainer.step(_samples())
    assert stats.steps == stats.clipped_steps == 3
    assert stats.grad_norm_max >= stats.grad_norm > 0


def test_empty_and_interrupted_steps_change_nothing(policy) -> None:
    before = {n: t.detach().clone() for n, t in policy.model.named_parameters()}
    trainer = Trainer(policy, TrainSection(lr=1e-2), max_new_tokens=16)
    assert trainer.step([]).steps == 0
    assert trainer.step(_samples(), should_stop=lambda: True) is None
    assert not trainer.changed
    for n, t in policy.model.named_parameters():
        assert torch.equal(before[n], t)


def test_a_stop_after_the_first_epochs_step_finishes_the_epochs(policy) -> None:
    """Issue 47: with ppo_epochs 2, a stop that lands once the first step is taken no
    longer returns None (which said "no step taken" while the weights had moved): the
    second epoch runs too, and the round ends as one without a stop would."""
    stopped, plain = copy.deepcopy(policy), copy.deepcopy(policy)
    settings = TrainSection(lr=1e-2, ppo_epochs=2)
    stop = [False]
    trainer = Trainer(stopped, settings, max_new_tokens=16)
    real = trainer._apply_gradients

    def step_then_stop() -> float:
        norm = real()
        stop[0] = True  # a signal right after the first optimiser step
        return norm

    trainer._apply_gradients = step_then_stop
    torch.manual_seed(3)
    stats = trainer.step(_samples(), should_stop=lambda: stop[0])
    assert stats is not None and stats.steps == 2 and trainer.changed
    torch.manual_seed(3)
    Trainer(plain, settings, max_new_tokens=16).step(_samples())
    for (n, t), (_, u) in zip(
        stopped.model.named_parameters(), plain.model.named_parameters(), strict=True
    ):
        assert torch.equal(t, u), n


def test_kl_to_reference_is_zero_before_any_step(policy) -> None:
    trainer = Trainer(policy, TrainSection(lr=1e-3, kl_coef=0.1), max_new_tokens=16)
    stats = trainer.step(_samples())
    assert stats.kl == pytest.approx(0.0, abs=1e-6)
    stats = trainer.step(_samples())
    assert stats.kl > 0


def test_lora_trains_only_adapters(tiny_model_dir: Path) -> None:
    pol = load_policy(
        str(tiny_model_dir),
        device="cpu",
        dtype="float32",
        lora=LoraSection(enabled=True, r=4),
        cache_dir=tiny_model_dir,
    )
    assert pol.is_lora
    names = set(pol.trainable_state())
    assert names and all("lora_" in n for n in names)
    stats = Trainer(pol, TrainSection(lr=1e-2), max_new_tokens=16).step(_samples())
    assert stats.steps == 1 and stats.grad_norm > 0


def test_zero_signal_groups_give_no_samples_but_count_in_the_batch() -> None:
    from sapo_node.groups import Group, training_set

    def group(rewards: list[float]) -> Group:
        return Group(None, [1], [[2, 4, 5], [3]], ["a", "b"], [True, True], rewards)

    batch = training_set([group([1.0, 1.0]), group([1.0, 0.0])], "std")
    samples = batch.samples
    assert len(samples) == 2
    assert (batch.batch_rows, batch.batch_tokens) == (4, 8)  # the flat group counts too
    adv = torch.tensor([s.advantage for s in samples])
    torch.testing.assert_close(adv, grpo.group_advantages(torch.tensor([[1.0, 0.0]]))[0])


@pytest.mark.parametrize("norm", ["token", "sequence", "constant"])
def test_a_merged_sample_gives_the_gradient_of_its_copies(policy, norm: str) -> None:
    """``Sample.copies``: identical samples trained once, weighted, give their gradient
    and count in the stats as the copies would; training_set merges only the identical
    completions of one group (same tokens, advantage and taught flags)."""
    from dataclasses import replace

    from sapo_node.groups import Group, training_set

    base = _samples()
    taught = replace(base[1], taught=(True, False) + (True,) * (len(base[1].completion_ids) - 2))
    merged = [replace(base[0], copies=3), replace(taught, copies=2), *base[2:]]
    flat = [base[0]] * 3 + [taught] * 2 + base[2:]
    got, want = _grads(policy, merged, loss_norm=norm), _grads(policy, flat, loss_norm=norm)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-7, rtol=1e-4)
    trainer = Trainer(policy, TrainSection(loss_norm=norm), max_new_tokens=16)
    a, b = copy.deepcopy(trainer).step(merged), copy.deepcopy(trainer).step(flat)
    assert (
        (a.sequences, a.tokens)
        == (b.sequences, b.tokens)
        == (
            len(flat),
            sum(len(smp.completion_ids) for smp in flat),
        )
    )
    assert a.loss == pytest.approx(b.loss, rel=1e-4, abs=1e-7)

    ids = [[2, 4], [2, 4], [3], [2, 4], [2, 5]]
    group = Group(None, [1], ids, ["a"] * 5, [True] * 5, [1.0, 1.0, 0.0, 1.0, 0.0])
    batch = training_set([group], "std")
    assert [(smp.completion_ids, smp.copies) for smp in batch.samples] == [
        ([2, 4], 3),
        ([3], 1),
        ([2, 5], 1),
    ]
    assert (batch.batch_rows, batch.batch_tokens) == (5, 9)


def _flat_group(n: int = 3) -> list[Sample]:
    """A group without signal: every advantage 0 (the node drops it before the trainer)."""
    return [Sample([7, 8, 9, 10], [20 + i, 21, 22, 23][: 2 + i], 0.0) for i in range(n)]


@pytest.mark.parametrize("norm", ["token", "sequence", "constant"])
def test_groups_without_signal_do_not_rescale_the_step(policy, norm: str) -> None:
    """Issue 9, defect 1: the round's whole batch normalises the loss, signal or not."""
    signal, flat = _samples(), _flat_group()
    rows = len(signal) + len(flat)
    tokens = sum(len(s.completion_ids) for s in signal + flat)
    with_flat = _grads(policy, signal + flat, loss_norm=norm)
    trainer = Trainer(policy, TrainSection(loss_norm=norm), max_new_tokens=16)
    trainer.gradients(signal, batch_rows=rows, batch_tokens=tokens)
    dropped = {n: t.grad.detach().clone() for n, t in policy.model.named_parameters()}
    alone = _grads(policy, signal, loss_norm=norm)  # a round whose groups all had signal
    for name in with_flat:
        torch.testing.assert_close(dropped[name], with_flat[name], atol=1e-7, rtol=1e-4)
    name = "model.embed_tokens.weight"
    assert not torch.allclose(alone[name], with_flat[name], atol=1e-7, rtol=1e-3)


def test_log_probs_follow_top_k_and_top_p(policy) -> None:
    samples = _samples(3)
    ref, mb = pack_unshared(samples, 0), pack(samples, policy.tokenizer.pad_token_id)
    trainer = Trainer(policy, TrainSection(), max_new_tokens=16, temperature=0.7, top_p=0.8)
    trainer.top_k = 20
    with torch.no_grad():
        logits = policy.model(
            input_ids=ref.input_ids,
            attention_mask=ref.attention_mask,
            position_ids=ref.position_ids,
        ).logits
        c = mb.targets.shape[1]
        x = grpo.truncated_logits(
            logits[:, -c - 1 : -1].float(), 0.7, top_k=20, top_p=0.8, keep=mb.targets
        )
        want = torch.log_softmax(x, -1).gather(-1, mb.targets[..., None])[..., 0]
        got = trainer._logprobs(policy.model, mb)
    torch.testing.assert_close(got * mb.mask, want * mb.mask, atol=1e-4, rtol=1e-4)
    assert torch.isfinite(got).all()


def _direct_logp_entropy(policy, samples, temperature):
    """Unshared forward of each sample alone: log-probs and entropies of its completion."""
    logps, ents = [], []
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.prompt_ids + s.completion_ids])
            logits = policy.model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1]
            logp = torch.log_softmax(logits.float() / temperature, -1)
            logps.append(logp.gather(-1, torch.tensor(s.completion_ids)[:, None])[:, 0])
            ents.append(-(logp.exp() * logp).sum(-1))
    return logps, ents


def test_entropy_is_the_mean_token_entropy_at_the_sampling_temperature(policy) -> None:
    samples = _samples()
    trained = copy.deepcopy(policy)
    stats = Trainer(trained, TrainSection(), max_new_tokens=16, temperature=1.5).step(samples)
    _, ents = _direct_logp_entropy(policy, samples, 1.5)  # the policy before the step
    assert stats.entropy == pytest.approx(float(torch.cat(ents).mean()), rel=1e-4)
    assert stats.approx_kl == 0.0  # one step: the ratio is exactly 1


def test_second_epoch_ratio_is_against_the_real_old_policy(policy) -> None:
    """Issue 10, part 4: no separate old pass, yet epoch 2's ratio is new / old."""
    samples = _samples()
    settings = dict(optimizer="adam", lr=1e-2)
    two = copy.deepcopy(policy)
    one = copy.deepcopy(policy)
    stats = Trainer(two, TrainSection(ppo_epochs=2, **settings), max_new_tokens=16).step(samples)
    Trainer(one, TrainSection(ppo_epochs=1, **settings), max_new_tokens=16).step(samples)
    old, _ = _direct_logp_entropy(policy, samples, 1.0)
    new, _ = _direct_logp_entropy(one, samples, 1.0)  # the policy epoch 2 runs
    d = torch.cat(new) - torch.cat(old)
    assert d.abs().max() > 1e-3  # the ratio moved away from 1
    assert stats.steps == 2
    assert stats.approx_kl == pytest.approx(float((torch.expm1(d) - d).mean()), rel=1e-3)
    assert stats.approx_kl > 0


def _weights(policy) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in policy.model.named_parameters()}


def test_a_nan_loss_skips_the_step(policy, caplog) -> None:
    before = _weights(policy)
    bad = [*_samples(), Sample([5, 6], [7, 8], float("nan"))]
    trainer = Trainer(policy, TrainSection(lr=1e-2), max_new_tokens=16)
    stats = trainer.step(bad)
    assert stats.steps == 0 and stats.skipped_steps == 1
    assert not torch.isfinite(torch.tensor(stats.grad_norm))
    assert stats.grad_norm_max == 0.0 and stats.clipped_steps == 0  # over steps taken
    for n, t in policy.model.named_parameters():
        assert torch.equal(before[n], t), n
    assert trainer.step(_samples()).steps == 1  # the next round trains again


def test_an_infinite_gradient_skips_the_step(policy) -> None:
    before = _weights(policy)
    param = policy.model.get_input_embeddings().weight
    hook = param.register_hook(lambda g: g * float("inf"))
    try:
        stats = Trainer(policy, TrainSection(lr=1e-2, ppo_epochs=2), max_new_tokens=16).step(
            _samples()
        )
    finally:
        hook.remove()
    assert stats.steps == 0 and stats.skipped_steps == 2
    for n, t in policy.model.named_parameters():
        assert torch.equal(before[n], t), n


def test_float16_uses_a_grad_scaler(policy) -> None:
    half = copy.deepcopy(policy)
    half.dtype = torch.float16  # CPU autocast runs float16; master weights stay float32
    trainer = Trainer(half, TrainSection(lr=1e-3), max_new_tokens=16)
    assert trainer.scaler is not None
    before = _weights(half)
    stats = trainer.step(_samples())
    assert stats.steps + stats.skipped_steps == 1
    for n, t in half.model.named_parameters():
        assert torch.isfinite(t).all(), n
    if stats.steps:
        assert any(not torch.equal(before[n], t) for n, t in half.model.named_parameters())


@pytest.mark.parametrize("optimizer", ["adamw", "adam"])
def test_the_fused_optimizer_makes_the_default_update(policy, optimizer: str) -> None:
    """With float32 moments the trainer's Adam(W) is torch's fused kernel on the CPU: the
    same parameters after two steps as the default per-parameter loop, from the same
    gradients. (The default, bfloat16 moments: tests/unit/test_optim.py.)"""
    settings = TrainSection(
        optimizer=optimizer, lr=1e-2, weight_decay=0.1, optimizer_state="float32"
    )
    trainer = Trainer(policy, settings, max_new_tokens=16)
    assert trainer.optimizer.defaults["fused"] is True
    twins = [p.detach().clone().requires_grad_(True) for p in trainer.params]
    cls = torch.optim.AdamW if optimizer == "adamw" else torch.optim.Adam
    plain = cls(twins, lr=1e-2, betas=settings.betas, weight_decay=0.1, foreach=False)
    plan = trainer._plan(_samples(), None, None)
    for _ in range(2):  # the same gradients into both: clip, then each optimiser's step
        trainer._accumulate(plan, lambda: False)
        for p, q in zip(trainer.params, twins, strict=True):
            q.grad = p.grad.clone()
        trainer._apply_gradients()
        torch.nn.utils.clip_grad_norm_(twins, settings.grad_clip)
        plain.step()
        trainer.optimizer.zero_grad(set_to_none=True)
    for p, q in zip(trainer.params, twins, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_untaught_tokens_get_no_loss_and_the_rest_keep_their_weight(policy) -> None:
    """``Sample.taught``: a completion whose tokens are all left out changes the gradient
    exactly as an advantage of 0 would (it still counts in the batch's normalisation);
    the mask is the flags, and flags of the wrong length are refused."""
    base = _samples()
    silenced = base[:-1] + [
        Sample(
            base[-1].prompt_ids,
            base[-1].completion_ids,
            base[-1].advantage,
            (False,) * len(base[-1].completion_ids),
        )
    ]
    zeroed = base[:-1] + [Sample(base[-1].prompt_ids, base[-1].completion_ids, 0.0)]
    got, want = _grads(policy, silenced), _grads(policy, zeroed)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-7, rtol=1e-4)
    packed = pack([Sample([1, 2], [4, 5, 6], 1.0, (False, True, True))], pad_id=0)
    assert packed.mask.tolist() == [[0, 1, 1]]
    with pytest.raises(ValueError, match="taught has 2 flags for 3 tokens"):
        pack([Sample([1, 2], [4, 5, 6], 1.0, (True, True))], pad_id=0)


@pytest.mark.parametrize("norm", ["token", "sequence", "constant"])
def test_a_weighted_sample_counts_its_weight_times(policy, norm: str) -> None:
    """``Sample.weight`` (a sampled peer completion standing for others of its reward):
    weight 3 gives the gradient of 3 copies; any weight scales its share of the loss
    linearly, in a batch of a given size; the stats count what was trained."""
    from dataclasses import replace

    base = _samples()
    got = _grads(policy, [replace(base[0], weight=3.0), *base[1:]], loss_norm=norm)
    want = _grads(policy, [replace(base[0], copies=3), *base[1:]], loss_norm=norm)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-7, rtol=1e-4)

    def alone(weight: float) -> dict[str, torch.Tensor]:
        trainer = Trainer(policy, TrainSection(loss_norm=norm), max_new_tokens=16)
        trainer.gradients([replace(base[0], weight=weight)], batch_rows=8, batch_tokens=40)
        return {n: t.grad.detach().clone() for n, t in policy.model.named_parameters()}

    one, scaled = alone(1.0), alone(2.5)
    for name in one:
        torch.testing.assert_close(scaled[name], 2.5 * one[name], atol=1e-7, rtol=1e-4)
    stats = Trainer(policy, TrainSection(loss_norm=norm), max_new_tokens=16).step(
        [replace(base[0], weight=2.5), *base[1:]]
    )
    assert stats.sequences == len(base)
