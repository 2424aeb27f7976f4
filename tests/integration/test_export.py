"""``sapo-node export``: a real node's checkpoint (tiny model) loads with transformers'
and peft's from_pretrained and gives the node's own logits."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from sapo_node.build import build_node
from sapo_node.cli import main
from sapo_node.config import load_config
from sapo_node.node import Node
from sapo_node.ops.export import ExportError, check_out_dir, find_checkpoint
from tests.support.nodes import sevens_overrides


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``sapo-node ARGV`` in this process: exit code (0 on return), stdout, stderr."""
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def _trained_node(model_dir: Path, data_dir: Path, *, lora: bool) -> Node:
    """A node run for 2 rounds the way ``sapo-node start`` runs it (checkpoint each),
    computing in float32 as the export does, so that their logits can be equal."""
    overrides = sevens_overrides(
        model_dir,
        data_dir,
        node={"rounds": 2, "checkpoint_every": 1},
        model={"dtype": "float32", "lora": {"enabled": lora, "r": 4, "alpha": 8.0}},
        train={"lr": 3e-2, "local_groups": 2, "external_groups": 0},
    )
    node = build_node(load_config(overrides=overrides, environ={}))
    try:
        node.run()
    finally:
        node.close()
    return node


@pytest.fixture(scope="module")
def full_node(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Node:
    return _trained_node(tiny_model_dir, tmp_path_factory.mktemp("full"), lora=False)


@pytest.fixture(scope="module")
def lora_node(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Node:
    node = _trained_node(tiny_model_dir, tmp_path_factory.mktemp("lora"), lora=True)
    # the node's config, as far as export reads it: the adapter's shape
    (node.data_dir / "node.toml").write_text("[model.lora]\nr = 4\nalpha = 8.0\n")
    return node


def _lora_args(node: Node) -> list[str]:
    return ["--data-dir", str(node.data_dir), "--config", str(node.data_dir / "node.toml")]


def _inputs(node: Node, tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """A real prompt and a completion, encoded by the exported tokenizer; they must be
    the node's own token ids."""
    messages = [{"role": "system", "content": "Reply."}, {"role": "user", "content": "Sevens?"}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    assert ids == node.policy.encode_chat(messages)
    ids += tokenizer("7a7 77", add_special_tokens=False)["input_ids"]
    return torch.tensor([ids]), torch.ones((1, len(ids)), dtype=torch.long)


def _node_logits(node: Node, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    node.policy.model.eval()
    with torch.no_grad():
        return node.policy.logits(ids, mask)


def _base_logits(model_dir: Path, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        return (
            AutoModelForCausalLM.from_pretrained(model_dir).eval()(ids, attention_mask=mask).logits
        )


def test_full_model_export_loads_and_gives_the_node_logits(
    full_node: Node, tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "model"
    code, stdout, err = run_cli(
        ["export", "--data-dir", str(full_node.data_dir), "--out", str(out)], capsys
    )
    assert code == 0, err
    assert "round 2" in stdout and "AutoModelForCausalLM.from_pretrained" in stdout
    assert not (out / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == full_node.policy.tokenizer.chat_template
    assert full_node.policy.end_id in model.generation_config.eos_token_id
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    ids, mask = _inputs(full_node, tokenizer)
    with torch.no_grad():
        got = model(ids, attention_mask=mask).logits
    want = _node_logits(full_node, ids, mask)
    assert torch.equal(got, want)
    assert not torch.allclose(got, _base_logits(tiny_model_dir, ids, mask), atol=1e-4)
    meta = json.loads((out / "sapo_node_export.json").read_text())
    assert meta["kind"] == "model" and meta["round"] == 2 and meta["lora"] is False
    umask = os.umask(0)
    os.umask(umask)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask


def test_lora_export_is_an_adapter_for_peft_with_its_base_named(
    lora_node: Node, tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "adapter"
    code, stdout, err = run_cli(["export", *_lora_args(lora_node), "--out", str(out)], capsys)
    assert code == 0, err
    base_dir = str(tiny_model_dir.resolve())
    assert f"base model: {base_dir}" in stdout and "PeftModel.from_pretrained" in stdout
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == base_dir
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8.0
    assert base_dir in (out / "README.md").read_text()
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == lora_node.policy.tokenizer.chat_template
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), out).eval()
    ids, mask = _inputs(lora_node, tokenizer)
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).logits
    want = _node_logits(lora_node, ids, mask)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert not torch.allclose(got, _base_logits(tiny_model_dir, ids, mask), atol=1e-4)


def test_lora_export_with_merge_is_a_full_model(lora_node: Node, tmp_path: Path, capsys) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "merged"
    code, stdout, err = run_cli(
        ["export", *_lora_args(lora_node), "--out", str(out), "--merge"], capsys
    )
    assert code == 0, err
    assert "merged" in stdout
    assert not (out / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert not hasattr(model, "peft_config")
    ids, mask = _inputs(lora_node, AutoTokenizer.from_pretrained(out))
    with torch.no_grad():
        got = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(got, _node_logits(lora_node, ids, mask), rtol=0, atol=1e-5)


def test_a_lora_export_needs_the_node_lora_settings(lora_node: Node, tmp_path: Path, capsys):
    code, _, err = run_cli(
        ["export", "--data-dir", str(lora_node.data_dir), "--out", str(tmp_path / "a")], capsys
    )
    assert code == 1 and "has shape (4, 64), model has (16, 64)" in err
    assert "give the node's config" in err and err.count("\n") == 1
    assert not (tmp_path / "a").exists()


def test_a_chosen_checkpoint_by_round_or_path(full_node: Node, tmp_path: Path, capsys) -> None:
    one = full_node.data_dir / "checkpoints" / "round-000001"
    for choice in ("1", str(one)):
        out = tmp_path / f"r-{len(choice)}"
        code, stdout, err = run_cli(
            ["export", "--data-dir", str(full_node.data_dir), "--out", str(out),
             "--checkpoint", choice],
            capsys,
        )  # fmt: skip
        assert code == 0, err
        assert "round 1 " in stdout
        assert json.loads((out / "sapo_node_export.json").read_text())["round"] == 1
    code, _, err = run_cli(
        ["export", "--data-dir", str(full_node.data_dir), "--out", str(tmp_path / "x"),
         "--checkpoint", "7"],
        capsys,
    )  # fmt: skip
    assert code == 1 and "no checkpoint of round 7" in err and "1, 2" in err


def test_a_data_dir_without_a_checkpoint_is_one_clear_line(tmp_path: Path, capsys) -> None:
    for data_dir in (tmp_path / "empty", tmp_path / "missing"):
        (tmp_path / "empty").mkdir(exist_ok=True)
        code, out, err = run_cli(
            ["export", "--data-dir", str(data_dir), "--out", str(tmp_path / "out")], capsys
        )
        assert code == 1 and out == ""
        assert err.startswith("sapo-node: error: no checkpoint in ") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_non_empty_out_is_kept_unless_forced(full_node: Node, tmp_path: Path, capsys) -> None:
    out = tmp_path / "busy"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    argv = ["export", "--data-dir", str(full_node.data_dir), "--out", str(out)]
    code, _, err = run_cli(argv, capsys)
    assert code == 1 and "not empty" in err and "--force" in err and err.count("\n") == 1
    assert (out / "mine.txt").read_text() == "keep me"
    code, _, err = run_cli([*argv, "--force"], capsys)
    assert code == 0, err
    assert not (out / "mine.txt").exists() and (out / "model.safetensors").is_file()
    assert not list(tmp_path.glob(".busy.export-tmp-*"))
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run_cli(
        ["export", "--data-dir", str(full_node.data_dir), "--out", str(empty)], capsys
    )
    assert code == 0, err


def test_out_never_holds_the_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "node"
    (data / "checkpoints").mkdir(parents=True)
    for bad in (data, tmp_path, data / "checkpoints" / "x", data / "models"):
        with pytest.raises(ExportError, match="choose another"):
            check_out_dir(bad, data, force=True)
    check_out_dir(data / "exported", data, force=False)
    for bad in (Path.cwd(), Path.cwd().parent, Path.home()):
        with pytest.raises(ExportError, match="choose another"):
            check_out_dir(bad, data, force=True)


def test_find_checkpoint_refuses_a_directory_that_is_not_one(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="not a checkpoint directory"):
        find_checkpoint(tmp_path, str(tmp_path))


@pytest.mark.parametrize("kind", ["model", "adapter", "merged"])
def test_a_model_cached_from_gguf_exports_as_a_plain_one(
    tiny_model_dir: Path, tmp_path: Path, kind: str, capsys
) -> None:
    """The embedded model's cache says it came from a GGUF file, so transformers attaches
    a GGUF quantizer that refuses save_pretrained; the export drops it (weights are
    dense). A checkpoint saved the way Node.save does, of a perturbed policy."""
    import shutil

    from transformers import AutoModelForCausalLM

    from sapo_node.checkpoint import CheckpointStore
    from sapo_node.config import LoraSection
    from sapo_node.train.policy import load_policy

    model_dir = tmp_path / "from-gguf"
    shutil.copytree(tiny_model_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "gguf",
        "dequantize": False,
        "gguf_file": "Tiny.Q4_1.gguf",
    }
    (model_dir / "config.json").write_text(json.dumps(config))
    lora = kind != "model"
    section = LoraSection(enabled=lora, r=4, alpha=8.0)
    policy = load_policy(
        str(model_dir), device="cpu", dtype="float32", lora=section, cache_dir=tmp_path
    )
    assert type(getattr(policy.model, "hf_quantizer", None)).__name__ == "GgufHfQuantizer" or lora
    torch.manual_seed(1)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    data = tmp_path / "node"
    optimizer = torch.optim.AdamW(policy.trainable_parameters()).state_dict()
    fingerprint = {"model": str(model_dir), "lora": lora}
    CheckpointStore(data).save(
        3, policy.trainable_state(), optimizer, {"round": 3, "fingerprint": fingerprint}
    )
    (data / "node.toml").write_text("[model.lora]\nr = 4\nalpha = 8.0\n")
    out = tmp_path / "out"
    argv = ["export", "--data-dir", str(data), "--config", str(data / "node.toml")]
    code, _, err = run_cli(
        [*argv, "--out", str(out), *(["--merge"] if kind == "merged" else [])], capsys
    )
    assert code == 0, err
    ids = torch.tensor([[2, 10, 11, 12, 3, 40]])
    mask = torch.ones_like(ids)
    if kind == "adapter":
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(str(model_dir))
        model = PeftModel.from_pretrained(base, out)
    else:
        assert "quantization_config" not in json.loads((out / "config.json").read_text())
        model = AutoModelForCausalLM.from_pretrained(out)
        assert getattr(model, "hf_quantizer", None) is None
    policy.model.eval()
    with torch.no_grad():
        got = model.eval()(input_ids=ids, attention_mask=mask).logits
        want = policy.logits(ids, mask)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_a_generating_member_has_nothing_to_export(tmp_path: Path, capsys) -> None:
    from sapo_node.checkpoint import CheckpointStore

    fp = {"model": "embedded", "lora": False}
    CheckpointStore(tmp_path).save(4, {}, {}, {"round": 4, "fingerprint": fp})
    code, _, err = run_cli(
        ["export", "--data-dir", str(tmp_path), "--out", str(tmp_path / "o")], capsys
    )
    assert code == 1 and "generating member" in err and err.count("\n") == 1
