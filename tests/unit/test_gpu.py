"""The CUDA path: the same code as on the CPU, computing in bfloat16 (float16 where the
GPU has no bfloat16) with float32 master weights. Skipped without a CUDA device; run with
``pytest -m gpu`` on a machine that has one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sapo_node.config import GenerationSection, LoraSection, TrainSection
from sapo_node.train.policy import load_policy
from sapo_node.train.trainer import Sample, Trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("lora", [False, True])
def test_generation_and_a_training_step_on_cuda(tiny_model_dir: Path, lora: bool) -> None:
    torch.manual_seed(0)
    policy = load_policy(
        str(tiny_model_dir),
        device="auto",
        dtype="auto",
        lora=LoraSection(enabled=lora),
        cache_dir=tiny_model_dir,
        gradient_checkpointing=True,
    )
    assert policy.device.type == "cuda"
    assert policy.dtype == (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)
    prompts = [policy.encode_chat([{"role": "user", "content": q}]) for q in ("1 + 2?", "3 * 4?")]
    out = policy.generate(prompts, GenerationSection(max_new_tokens=8), n=4)
    assert [len(g) for g in out.ids] == [4, 4]
    trainer = Trainer(policy, TrainSection(), max_new_tokens=8)
    samples = [
        Sample(p, c[:8] or [policy.end_id], a)
        for p, group in zip(prompts, out.ids, strict=True)
        for c, a in zip(group, (1.0, -1.0, 0.5, -0.5), strict=True)
    ]
    before = [p.detach().clone() for p in trainer.params]
    stats = trainer.step(samples)
    assert stats is not None and stats.steps == 1 and stats.skipped_steps == 0
    assert {p.dtype for p in trainer.params} == {torch.float32}
    assert all(p.is_cuda for p in trainer.params)
    assert any(not torch.equal(b, p.detach()) for b, p in zip(before, trainer.params, strict=True))
