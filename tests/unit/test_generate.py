"""The shared-prefill decode path (sapo_node.train.decode) against plain transformers sampling.

Exact checks where the computation is deterministic (the warped scores against
transformers' warpers; every step's logits against a full forward of the prompt and the
tokens so far, across ragged prompts, row dropping and LoRA), and frequency checks where
it is random (inverse-CDF draws; first tokens of the node's path and of model.generate
against the exact warped distribution).
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from sapo_node.config import GenerationSection, LoraSection
from sapo_node.train import decode
from sapo_node.train.decode import Sampling

SETTINGS = [
    Sampling(),
    Sampling(temperature=0.7),
    Sampling(top_k=5),
    Sampling(top_p=0.8),
    Sampling(temperature=1.3, top_k=20, top_p=0.9),
]


def _prompts(policy, questions=("Hi", "What is 2+2? Say it in words.", "7*6?")) -> list[list[int]]:
    return [policy.encode_chat([{"role": "user", "content": q}]) for q in questions]


def _hf_warp(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    scores = logits
    if s.temperature != 1.0:
        scores = TemperatureLogitsWarper(s.temperature)(None, scores)
    if s.top_k:
        scores = TopKLogitsWarper(s.top_k)(None, scores)
    if s.top_p < 1.0:
        scores = TopPLogitsWarper(s.top_p)(None, scores)
    return scores


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic, bins with expected count < 5 pooled; (statistic, degrees)."""
    total = counts.sum().item()
    expected = probs * total
    big = expected >= 5
    obs = torch.cat([counts[big].double(), counts[~big].double().sum().view(1)])
    exp = torch.cat([expected[big].double(), expected[~big].double().sum().view(1)])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum().item()
    return stat, int(keep.sum().item()) - 1


def _chi_square_ok(counts: torch.Tensor, probs: torch.Tensor) -> bool:
    stat, df = _chi_square(counts, probs)
    return stat < df + 5 * math.sqrt(2 * df) + 10  # ~5 sigma: a fixed seed, never flaky


@pytest.mark.parametrize("s", SETTINGS, ids=str)
def test_warp_equals_transformers_warpers(s: Sampling) -> None:
    torch.manual_seed(1)
    logits = torch.randn(6, 300) * 3
    logits[0, :10] = 2.0  # ties at the top-k boundary are kept, as transformers keeps them
    ours, theirs = decode.warp(logits, s), _hf_warp(logits.clone(), s)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    finite = torch.isfinite(theirs)
    assert torch.allclose(ours[finite], theirs[finite])


def test_draw_follows_the_probabilities_and_never_draws_zero_mass() -> None:
    torch.manual_seed(2)
    probs = torch.softmax(torch.randn(40) * 1.5, -1)
    probs[[0, 7, 39]] = 0.0  # first, middle and last entries without mass
    probs /= probs.sum()
    draws = decode.draw(probs.expand(20_000, -1).contiguous())
    counts = torch.bincount(draws, minlength=40)
    assert counts[[0, 7, 39]].sum() == 0
    assert _chi_square_ok(counts, probs)
    # The test can fail: a shifted distribution is rejected.
    assert not _chi_square_ok(counts, torch.roll(probs, 1))


def _first_token_law(policy, prompt: list[int], s: Sampling) -> torch.Tensor:
    with torch.no_grad():
        logits = policy.model(input_ids=torch.tensor([prompt])).logits[0, -1].float()
    return torch.softmax(_hf_warp(logits[None], s), -1)[0]


@pytest.mark.parametrize("s", SETTINGS[1:4], ids=str)
def test_first_tokens_follow_the_same_law_as_model_generate(tiny_policy, s: Sampling) -> None:
    prompt = _prompts(tiny_policy)[1]
    law = _first_token_law(tiny_policy, prompt, s)
    settings = GenerationSection(
        max_new_tokens=1, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p
    )
    vocab = law.shape[0]
    torch.manual_seed(3)
    fast = torch.zeros(vocab, dtype=torch.long)
    plain = torch.zeros(vocab, dtype=torch.long)
    for _ in range(6):
        for c in tiny_policy.generate([prompt], settings, n=64).ids[0]:
            fast[c[0]] += 1
        for c in tiny_policy.generate_plain([prompt], settings, n=64)[0]:
            plain[c[0]] += 1
    assert fast[law == 0].sum() == 0  # nothing outside top-k / top-p
    assert plain[law == 0].sum() == 0
    assert _chi_square_ok(fast, law)
    assert _chi_square_ok(plain, law)  # the reference itself agrees with the law


class _Recorder:
    """Wraps decode.sample_next: every call's logits [B, V] and the tokens drawn."""

    def __init__(self) -> None:
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
        tokens = _real_sample_next(logits, sampling)
        self.calls.append((logits.clone(), tokens.clone()))
        return tokens


_real_sample_next = decode.sample_next


def _check_steps_against_full_forward(model, prompts, n, eos_ids, max_new, monkeypatch) -> int:
    """Run decode.sample with a recorder; compare each live row's logits at each step with
    a full forward of its prompt and tokens so far. Returns how many batch shrinks it saw."""
    recorder = _Recorder()
    monkeypatch.setattr(decode, "sample_next", recorder)
    torch.manual_seed(4)
    with torch.no_grad():
        out = decode.sample(
            model,
            prompts,
            n,
            max_new_tokens=max_new,
            sampling=Sampling(temperature=1.5),
            eos_ids=eos_ids,
            device=torch.device("cpu"),
            max_batch_sequences=64,
        )
    # Rows of the batch, in the order decode uses (prompts sorted by length, stable).
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    rows = [(p, out[p][j]) for p in order for j in range(n)]
    finish = [len(c) - 1 if c[-1] in eos_ids else math.inf for _, c in rows]
    shrinks, last_compaction = 0, 0
    for step, (logits, tokens) in enumerate(recorder.calls):
        if step and logits.shape[0] < recorder.calls[step - 1][0].shape[0]:
            shrinks, last_compaction = shrinks + 1, step
        in_batch = [r for r in range(len(rows)) if finish[r] >= last_compaction]
        assert len(in_batch) == logits.shape[0]
        for b, r in enumerate(in_batch):
            prompt, completion = rows[r]
            if step >= len(completion):
                continue  # finished, not yet dropped: its logits are never used
            assert tokens[b].item() == completion[step]
            ids = torch.tensor([prompts[prompt] + completion[:step]])
            with torch.no_grad():
                full = model(input_ids=ids).logits[0, -1].float()
            assert torch.allclose(
                torch.log_softmax(logits[b], -1), torch.log_softmax(full, -1), atol=1e-4
            ), (step, r)
    return shrinks


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])  # a boolean / additive mask
def test_every_step_equals_a_full_forward_with_ragged_prompts_and_dropped_rows(
    tiny_policy, monkeypatch, implementation: str
) -> None:
    tiny_policy.model.set_attn_implementation(implementation)
    assert tiny_policy.model.config._attn_implementation == implementation
    prompts = _prompts(tiny_policy)
    assert len({len(p) for p in prompts}) == 3  # ragged
    # Several common characters count as EOS here, so rows finish early and get dropped.
    eos_ids = [*tiny_policy.eos_ids, *tiny_policy.tokenizer.convert_tokens_to_ids(list("aeiou "))]
    shrinks = _check_steps_against_full_forward(
        tiny_policy.model, prompts, 4, eos_ids, 30, monkeypatch
    )
    assert shrinks >= 1


def test_lora_model_steps_equal_a_full_forward(tiny_model_dir, monkeypatch) -> None:
    from sapo_node.train.policy import load_policy

    torch.manual_seed(0)
    policy = load_policy(
        str(tiny_model_dir),
        device="cpu",
        dtype="float32",
        lora=LoraSection(enabled=True),
        cache_dir=tiny_model_dir,
    )
    assert policy.is_lora and decode.supported(policy.model)
    with torch.no_grad():  # adapters that change the output (B starts at zero)
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    _check_steps_against_full_forward(
        policy.model, _prompts(policy)[:2], 3, policy.eos_ids, 12, monkeypatch
    )
    out = policy.generate(_prompts(policy), GenerationSection(max_new_tokens=8), n=2)
    assert [len(g) for g in out.ids] == [2, 2, 2]


def _decode_with(model, prompts, eos_ids, monkeypatch, **switches):
    recorder = _Recorder()
    monkeypatch.setattr(decode, "sample_next", recorder)
    torch.manual_seed(4)
    with torch.no_grad():
        out = decode.sample(
            model,
            prompts,
            4,
            max_new_tokens=20,
            sampling=Sampling(temperature=1.5),
            eos_ids=eos_ids,
            device=torch.device("cpu"),
            max_batch_sequences=64,
            **switches,
        )
    return out, recorder.calls


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("switch", ["preallocated_cache", "decode_mask"])
def test_each_decode_switch_off_gives_the_same_tokens_and_logits(
    tiny_policy, monkeypatch, switch: str, implementation: str
) -> None:
    """generation.preallocated_cache and generation.decode_mask off (transformers'
    DynamicCache, its own mask from a 2D one): the same tokens, and logits equal to float32
    rounding, with ragged prompts, prompts of one length (where transformers drops an
    all-visible mask) and rows dropped at EOS."""
    tiny_policy.model.set_attn_implementation(implementation)
    prompts = _prompts(tiny_policy)
    width = min(len(p) for p in prompts)
    eos_ids = [*tiny_policy.eos_ids, *tiny_policy.tokenizer.convert_tokens_to_ids(list("aeiou "))]
    for rows in (prompts, [p[len(p) - width :] for p in prompts]):
        on, on_calls = _decode_with(tiny_policy.model, rows, eos_ids, monkeypatch)
        off, off_calls = _decode_with(
            tiny_policy.model, rows, eos_ids, monkeypatch, **{switch: False}
        )
        assert on == off
        assert len(on_calls) == len(off_calls) > 1
        assert any(a.shape[0] < on_calls[0][0].shape[0] for a, _ in on_calls)  # rows dropped
        for (a, ta), (b, tb) in zip(on_calls, off_calls, strict=True):
            assert torch.equal(ta, tb)
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_the_generation_switches_reach_the_decode_loop(tiny_policy, monkeypatch) -> None:
    seen: dict = {}
    real = decode.sample

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(decode, "sample", spy)
    settings = GenerationSection(max_new_tokens=3, preallocated_cache=False, decode_mask=False)
    tiny_policy.generate(_prompts(tiny_policy)[:1], settings, n=2)
    assert seen["preallocated_cache"] is False and seen["decode_mask"] is False
    tiny_policy.generate(_prompts(tiny_policy)[:1], GenerationSection(max_new_tokens=3), n=2)
    assert seen["preallocated_cache"] is True and seen["decode_mask"] is True


def test_rows_stop_at_eos_and_respect_max_new_tokens(tiny_policy) -> None:
    torch.manual_seed(5)
    eos = tiny_policy.eos_ids[0]
    # Force EOS often: a temperature that flattens the law over ~100 tokens, many samples.
    settings = GenerationSection(max_new_tokens=25, temperature=5.0, max_batch_sequences=7)
    out = tiny_policy.generate(_prompts(tiny_policy), settings, n=16)
    lengths = [len(c) for g in out.ids for c in g]
    assert [len(g) for g in out.ids] == [16, 16, 16]
    assert max(lengths) <= 25
    finished = [c for g in out.ids for c in g if c[-1] in tiny_policy.eos_ids]
    assert finished and any(len(c) == 25 and c[-1] != eos for g in out.ids for c in g)
    for g in out.ids:
        for c in g:
            assert all(t not in tiny_policy.eos_ids for t in c[:-1])
    assert out.new_tokens == sum(lengths)
    assert out.texts[0][0] == tiny_policy.decode(out.ids[0][0])


def test_should_stop_ends_at_the_next_token(tiny_policy) -> None:
    calls = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) >= 3

    out = tiny_policy.generate(
        _prompts(tiny_policy), GenerationSection(max_new_tokens=50), n=2, should_stop=stop
    )
    assert max(len(c) for g in out.ids for c in g) <= 3
    assert [len(g) for g in out.ids] == [2, 2, 2]


def test_one_completion_and_chunks_smaller_than_a_group(tiny_policy) -> None:
    greedy = GenerationSection(top_k=1, max_new_tokens=10)
    prompts = _prompts(tiny_policy)
    one = tiny_policy.generate(prompts, greedy, n=1)
    split = tiny_policy.generate(prompts, greedy.model_copy(update={"max_batch_sequences": 3}), n=5)
    plain = tiny_policy.generate_plain(prompts, greedy, n=1)
    assert one.ids == plain
    for g, ref in zip(split.ids, plain, strict=True):
        assert g == ref * 5


def test_chunks_keep_every_row_and_the_limit() -> None:
    chunks = decode._chunks([5, 3, 9], n=4, limit=3)
    assert all(sum(k for _, k in c) <= 3 for c in chunks)
    per_prompt = {p: sum(k for c in chunks for q, k in c if q == p) for p in range(3)}
    assert per_prompt == {0: 4, 1: 4, 2: 4}
    assert [p for c in chunks for p, _ in c][0] == 1  # shortest prompt first


def test_models_without_full_attention_take_the_fallback(tiny_policy, monkeypatch) -> None:
    from types import SimpleNamespace

    from transformers import MistralConfig, Qwen2Config

    def config(cls, implementation="sdpa", **fields):
        c = cls(**fields)
        c._attn_implementation = implementation
        return SimpleNamespace(config=c)

    assert decode.supported(tiny_policy.model)
    assert not decode.supported(config(MistralConfig, sliding_window=64))
    assert decode.supported(config(Qwen2Config, use_sliding_window=False))
    assert decode.supported(config(Qwen2Config, "eager", use_sliding_window=False))
    # Implementations that do not take a 4D mask as it is (flash attention kernels)
    assert not decode.supported(config(Qwen2Config, "flash_attention_2", use_sliding_window=False))
    monkeypatch.setattr(decode, "supported", lambda model: False)
    monkeypatch.setattr(decode, "sample", None)  # the fast path must not be reached
    out = tiny_policy.generate(_prompts(tiny_policy), GenerationSection(max_new_tokens=4), n=2)
    assert [len(g) for g in out.ids] == [2, 2, 2]
