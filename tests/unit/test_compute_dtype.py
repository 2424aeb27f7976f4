"""Computing in bfloat16 with float32 master weights: which dtype ``auto`` picks, the
half-size weight copy that generation runs on, and a training step under autocast."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sapo_node.config import GenerationSection, LoraSection, TrainSection
from sapo_node.train import policy as policy_module
from sapo_node.train.optim import CompactAdam
from sapo_node.train.policy import cpu_has_bf16, load_policy, select_dtype
from sapo_node.train.trainer import Sample, Trainer
from tests.support.tiny import build_tiny_model

CPUINFO = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f {}\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (CPUINFO.format("avx512_bf16 avx512_vnni"), True),
        (CPUINFO.format("amx_tile amx_bf16"), True),
        (CPUINFO.format("avx512_vnni"), False),
        ("processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n", True),
        ("processor\t: 0\nFeatures\t: fp asimd\n", False),
        ("", False),
    ],
)
def test_cpu_bf16_is_read_from_the_cpu_flags(tmp_path: Path, text: str, expected: bool) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(text)
    assert cpu_has_bf16(info) is expected


def test_auto_computes_in_bf16_only_on_cpus_that_have_it(monkeypatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setattr(policy_module, "cpu_has_bf16", lambda: True)
    assert select_dtype("auto", cpu) == torch.bfloat16
    assert select_dtype("float32", cpu) == torch.float32
    monkeypatch.setattr(policy_module, "cpu_has_bf16", lambda: False)
    assert select_dtype("auto", cpu) == torch.float32
    assert select_dtype("bfloat16", cpu) == torch.bfloat16


def _policy(tiny_model_dir: Path, dtype: str, lora: bool = False):
    torch.manual_seed(0)
    return load_policy(
        str(tiny_model_dir),
        device="cpu",
        dtype=dtype,
        lora=LoraSection(enabled=lora),
        cache_dir=tiny_model_dir,
    )


def _prompts(policy) -> list[list[int]]:
    return [policy.encode_chat([{"role": "user", "content": q}]) for q in ("2 + 3 = ?", "7 * 6?")]


@pytest.mark.parametrize("lora", [False, True])
def test_generation_runs_on_half_weights_and_leaves_the_masters_as_they_were(
    tiny_model_dir: Path, lora: bool
) -> None:
    policy = _policy(tiny_model_dir, "bfloat16", lora)
    params = dict(policy.model.named_parameters())
    before = {name: (p.dtype, p.data_ptr(), p.detach().clone()) for name, p in params.items()}
    seen: set[torch.dtype] = set()
    hook = policy.model.get_output_embeddings().register_forward_hook(
        lambda mod, args, out: seen.add(mod.weight.dtype)
    )
    out = policy.generate(_prompts(policy), GenerationSection(max_new_tokens=6), n=3)
    hook.remove()
    assert seen == {torch.bfloat16}
    assert [len(g) for g in out.ids] == [3, 3]
    trainable = {name for name, p in params.items() if p.requires_grad}
    assert trainable and all(before[name][0] == torch.float32 for name in trainable)
    for name, p in params.items():
        dtype, ptr, value = before[name]
        assert (p.dtype, p.data_ptr()) == (dtype, ptr), name
        assert torch.equal(p.detach(), value), name
        assert not p.is_inference(), name


def test_the_masters_come_back_when_generation_fails(tiny_model_dir: Path) -> None:
    policy = _policy(tiny_model_dir, "bfloat16")
    linears = [m for m in policy.model.modules() if type(m) is torch.nn.Linear]
    with pytest.raises(RuntimeError, match="stop"), policy.compute_weights():
        params = list(policy.model.parameters())
        # On the CPU the linear layers compute with packed copies of their weights: the
        # masters stay, but for a weight another module uses (the tied embedding).
        packed = {id(p) for p in params if p.dtype == torch.float32}
        assert packed <= {id(m.weight) for m in linears if "forward" in vars(m)}
        assert bool(packed) == policy_module.packs_linear_weights(torch.bfloat16)
        copies = [p for p in params if id(p) not in packed]
        assert {p.dtype for p in copies} == {torch.bfloat16}
        # one buffer for all the copies, each view 64-byte aligned
        assert len({p.untyped_storage().data_ptr() for p in copies}) == 1
        assert all(p.data_ptr() % 64 == 0 for p in copies)
        raise RuntimeError("stop")
    assert {p.dtype for p in policy.model.parameters()} == {torch.float32}
    assert not any("forward" in vars(m) for m in linears)  # the layers' own forward again


@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_weights_compute_what_plain_copies_do(
    tiny_model_dir: Path, tmp_path: Path, bias: bool
) -> None:
    if not policy_module.packs_linear_weights(torch.bfloat16):
        pytest.skip("this CPU's oneDNN does not pack bfloat16 weights (no AVX512-BW/VL/DQ)")
    if bias:  # float32 biases beside packed bfloat16 weights (Qwen2's q, k, v projections)
        tiny_model_dir = build_tiny_model(tmp_path / "biased", bias=True)
    half = _policy(tiny_model_dir, "bfloat16")
    linears = [m for m in half.model.modules() if type(m) is torch.nn.Linear]
    assert any(m.bias is not None for m in linears) is bias
    ids = torch.tensor(_prompts(half)[:1])
    logits = {}
    for packing in (True, False):  # generation.packed_weights
        with torch.inference_mode(), half.compute_weights(packed=packing), half.autocast():
            packed = [m for m in half.model.modules() if "forward" in vars(m)]
            assert bool(packed) == packing
            logits[packing] = half.model(input_ids=ids).logits.float()
    torch.testing.assert_close(logits[True], logits[False], rtol=1.6e-2, atol=1e-2)
    # greedy tokens of Policy.generate with the switch on and off: the same
    greedy = GenerationSection(max_new_tokens=8, top_k=1)
    on = half.generate(_prompts(half), greedy, n=2).ids
    seen = []
    hook = half.model.get_output_embeddings().register_forward_pre_hook(
        lambda mod, args: seen.append("forward" in vars(mod))
    )
    off = half.generate(_prompts(half), greedy.model_copy(update={"packed_weights": False}), n=2)
    hook.remove()
    assert seen and not any(seen)  # nothing packed with the switch off
    assert off.ids == on


def test_half_precision_sampling_law_is_close_to_float32(tiny_model_dir: Path) -> None:
    """The next-token law computed on the bfloat16 copy differs from float32's by
    bfloat16 rounding only (the behaviour policy stays the trained policy)."""
    full, half = _policy(tiny_model_dir, "float32"), _policy(tiny_model_dir, "bfloat16")
    ids = torch.tensor([_prompts(full)[0]])
    with torch.inference_mode():
        p32 = full.model(input_ids=ids).logits.float().softmax(-1)
        with half.compute_weights(), half.autocast():
            p16 = half.model(input_ids=ids).logits.float().softmax(-1)
    assert float((p32 - p16).abs().sum(-1).max()) < 0.05  # total variation x 2


@pytest.mark.parametrize("longest", [8, 50])  # 50: a row's completions span several head chunks
def test_a_bf16_training_step_keeps_float32_masters_and_follows_the_float32_gradient(
    tiny_model_dir: Path, longest: int
) -> None:
    settings = TrainSection(micro_batch_size=4)
    grads = {}
    for dtype in ("float32", "bfloat16"):
        policy = _policy(tiny_model_dir, dtype)
        prompts = _prompts(policy)
        g = torch.Generator().manual_seed(1)
        lengths = torch.randint(3 * longest // 8, longest + 1, (8,), generator=g).tolist()
        samples = [
            Sample(p, torch.randint(5, 60, (lengths[2 * i + j],), generator=g).tolist(), a)
            for i, p in enumerate(prompts)
            for j, a in enumerate((1.0, -1.0, 0.5, -0.5))
        ]
        trainer = Trainer(policy, settings, max_new_tokens=longest)
        assert isinstance(trainer.optimizer, CompactAdam)  # the default: bfloat16 moments
        loss = trainer.gradients(samples)
        assert torch.isfinite(torch.tensor(loss))
        grads[dtype] = torch.cat([p.grad.flatten() for p in trainer.params])
        head = policy.model.get_output_embeddings().weight
        assert trainer.params[0] is head  # the tiny model ties it to the embedding
        assert {p.grad.dtype for p in trainer.params} == {torch.float32}
        stats = trainer.step(samples)
        assert stats is not None and stats.steps == 1
        assert {p.dtype for p in trainer.params} == {torch.float32}
    for part in (slice(None), slice(0, head.numel())):  # all, and the tied embedding/head
        cos = torch.nn.functional.cosine_similarity(
            grads["float32"][part], grads["bfloat16"][part], dim=0
        )
        assert float(cos) > 0.99
