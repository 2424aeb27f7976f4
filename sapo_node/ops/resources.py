"""What a node of a config needs: its peak memory and the disk it will fill, estimated
from the model's figures (read from its files, without loading it) and the config.
``doctor`` compares them with what this machine has.

Where the trainer or the config defines a rule, the estimate asks it rather than copy it:
which models get their head applied a chunk of positions at a time, and the chunk's size
(``trainer.PLAIN_HEAD_MODELS``, ``trainer.POSITIONS_PER_CALL``); the micro-batch size up
to which gradient checkpointing is skipped (``TrainSection.unchecked_tokens``); whether a
model's attention lets a prompt's completions share a row (``decode.full_attention``).
Two rules below are still restated and kept in step by hand: g, the rows of a micro-batch
(``trainer.Trainer._micro_batches`` and ``trainer.pack``), and b, the compute dtype's
size (``policy.select_dtype``, which asks the hardware).

Memory (``memory_need``), in bytes, for P model parameters (counted in the model's
safetensors headers), A LoRA adapter parameters, a layers of hidden size H, MLP size I,
h attention heads, key/value width K (kv heads x head dim), vocabulary V, and the
config's S = min(max_batch_sequences, (I + J) x L) sequences generated at once, m =
micro_batch_size, N = max_new_tokens, p = 128 prompt tokens (the default config's
prompts are 104 tokens of the embedded tokenizer), g = ceil(m / L) distinct prompts per
micro-batch (+1 when m is not a multiple of L; g = m for models without full attention in
every layer, whose completions take a row each), b = 2 bytes where the node computes in
bfloat16 (GPUs, CPUs with bfloat16 instructions) and 4 where it computes in float32:

- weights: 4P, float32 (+ 2P of bfloat16 copies under autocast); LoRA: bP for the
  frozen base + 4A;
- optimiser: Adam's two moments, 4P in bfloat16 (``train.optimizer_state``, the default;
  LoRA 4A) or 8P in float32 (LoRA 8A), + 4P for the frozen reference copy when
  ``train.kl_coef`` > 0 (a LoRA node's reference is its base: nothing more);
- the peak pass, the larger of
  - training: gradients 4P (LoRA 4A), plus the larger of AdamW's foreach temporaries,
    4P (LoRA 4A), and one micro-batch's activations, its worst case (every completion
    runs to N tokens), over its T = g p + m N tokens (one row per prompt, its
    completions after it): T (10 H + 4 I) a b (per token and layer: the norms' inputs
    and outputs, q, k, v, attention output, the MLP's gate, up, activation and product;
    the CPU's and CUDA's attention kernels keep no scores); with gradient checkpointing
    T (a H + 10 H + 4 I) b (each layer's input, and one layer recomputed); + 4 L' V x 4
    (logits, their log-softmax and both gradients, float32, of L' positions at once:
    every completion token, m (N + 1), or where the trainer applies the head 64
    positions at a time (llama, mistral, qwen2, qwen3: ``trainer.PLAIN_HEAD_MODELS``)
    64 g + m); + 150 MiB + 0.45 x 4P (LoRA 0.45 x 4A): backward's transient buffers and
    the allocator's slack, fitted to the measurements below;
  - generation: the KV cache preallocated for the whole generation, S (p + N) a 2K b;
- the processes: 400 MiB for the node (Python, torch, transformers, the tokenizer), 150
  MiB for the scoring worker, 150 MiB for the network process when the node is online;
  on a GPU, 512 MiB of CUDA context there, and
  host memory for the processes and the model as loaded before it moves (4P; LoRA bP).

The formula is fitted to measurements of the embedded model, kept in
``tests/unit/test_doctor.py`` (``-m slow`` measures them again), and real node rounds,
whose completions mostly end before 64 tokens, peak lower than its worst case: both in
docs/benchmarks.md, *Memory of a node over many rounds*.

Disk (``disk_need``): a checkpoint holds the trainable weights and the optimiser's two
moments, 8P bytes (full; 12P with float32 moments) or 8A (LoRA); a node keeps
``node.keep_checkpoints`` and writes the next before pruning, so it needs (keep + 1)
checkpoints, less those already there, plus the embedded model's float32 cache (4P)
until it exists, plus the pool's ``pool.max_mb``.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapo_node.config import Config

MiB = 2**20
GiB = 2**30

PROMPT_TOKENS = 128
NODE_PROCESS = 400 * MiB
SCORER_PROCESS = 150 * MiB
NET_PROCESS = 150 * MiB
ACT_PER_HIDDEN = 10  # activations kept for backward, per token and layer, in units of H
ACT_PER_MLP = 4  # ... and of I (gate, up, their activation and product)
LOGIT_COPIES = 4  # completion logits, their log-softmax, and both gradients, float32
# Backward's transient buffers and the allocator's slack: a fixed part and a share of the
# trained parameters' float32 size (fitted to the measurements of the module docstring).
TRAIN_FIXED = 150 * MiB
TRAIN_PER_TRAINED = 0.45
CUDA_CONTEXT = 512 * MiB


# --- the model ------------------------------------------------------------------------


class ModelInfoError(RuntimeError):
    """The model's size cannot be known; the message says why."""


@dataclass(frozen=True)
class ModelInfo:
    """What the memory and disk estimates need to know about a model."""

    params: int
    hidden: int
    layers: int
    intermediate: int
    kv_dim: int
    vocab: int
    where: str  # where the figures come from
    heads: int = 1  # attention heads
    model_type: str = ""  # config.json's model_type
    full_attention: bool = True  # in every layer: a row holds a prompt and its completions
    weights_present: bool = True
    cached: bool = True  # the embedded model: its de-quantised cache exists


# SmolLM2-135M-Instruct, as the embedded model's config.json says (for before its cache).
EMBEDDED_INFO = ModelInfo(
    params=134_515_008,
    hidden=576,
    layers=30,
    intermediate=1536,
    kv_dim=192,
    vocab=49152,
    where="embedded SmolLM2-135M-Instruct",
    heads=9,
    model_type="llama",
    cached=False,
)


def safetensors_params(paths: Iterable[Path]) -> int:
    """The number of parameters in safetensors files, from their headers alone."""
    total = 0
    for path in paths:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for key, value in header.items():
            if key != "__metadata__":
                total += math.prod(value["shape"])
    return total


def params_from_config(c: dict[str, Any]) -> int:
    """Parameters of a decoder-only transformer from its config.json (when there are no
    safetensors to count): embeddings, attention, gated MLP and norms per layer."""
    h, n, i, v = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
    kv = _kv_dim(c)
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * i + 2 * h
    heads = 1 if c.get("tie_word_embeddings", False) else 2
    return v * h * heads + n * per_layer + h


def _kv_dim(c: dict[str, Any]) -> int:
    heads = c.get("num_attention_heads") or 1
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    return (c.get("num_key_value_heads") or heads) * head_dim


def model_info_from_dir(path: Path, where: str | None = None) -> ModelInfo:
    """A model directory's figures: config.json, parameters counted in its safetensors."""
    from sapo_node.train.decode import full_attention

    try:
        c = json.loads((path / "config.json").read_text(encoding="utf-8"))
        c = c.get("text_config", c) if "hidden_size" not in c else c
        files = sorted(path.glob("*.safetensors"))
        present = bool(files) or any(path.glob("*.bin"))
        params = safetensors_params(files) if files else params_from_config(c)
        return ModelInfo(
            params=params,
            hidden=int(c["hidden_size"]),
            layers=int(c["num_hidden_layers"]),
            intermediate=int(c.get("intermediate_size") or 4 * c["hidden_size"]),
            kv_dim=_kv_dim(c),
            vocab=int(c["vocab_size"]),
            where=where or str(path),
            heads=int(c.get("num_attention_heads") or 1),
            model_type=str(c.get("model_type") or ""),
            full_attention=full_attention(
                c.get("layer_types"), c.get("sliding_window"), c.get("use_sliding_window", True)
            ),
            weights_present=present,
        )
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        raise ModelInfoError(f"cannot read the model in {path}: {exc}") from None


def model_info(name: str, cache_dir: Path) -> ModelInfo:
    """Figures of the model a node of this config loads, without loading it."""
    from sapo_node.train.policy import EMBEDDED, EMBEDDED_CACHE, ModelLoadError, embedded_gguf_path

    if name == EMBEDDED:
        cache = cache_dir / EMBEDDED_CACHE
        if (cache / "model.safetensors").is_file():
            return model_info_from_dir(cache, f"embedded SmolLM2-135M-Instruct ({cache})")
        try:
            embedded_gguf_path()
        except ModelLoadError as exc:
            raise ModelInfoError(str(exc)) from None
        return EMBEDDED_INFO
    path = Path(name).expanduser()
    if path.exists() or name.startswith((".", "/", "~")):
        if not (path / "config.json").is_file():
            raise ModelInfoError(f"{path} has no config.json: not a model directory")
        return model_info_from_dir(path)
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on it
        raise ModelInfoError("huggingface_hub is not installed") from None
    found = try_to_load_from_cache(name, "config.json")
    if not isinstance(found, str):
        raise ModelInfoError(
            f"{name} is not in the local Hugging Face cache; the node downloads it at "
            "start (needs the hub)"
        )
    return model_info_from_dir(Path(found).parent, f"{name} (Hugging Face cache)")


# --- memory ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryNeed:
    """Peak bytes a node of a config needs, and on which kind of device."""

    device: str  # "cpu", "cuda" or "mps"
    parts: dict[str, int] = field(default_factory=dict)  # on the device
    host: int = 0  # host RAM when the device is a GPU (processes, loading)

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def lora_params(info: ModelInfo, r: int, targets: Iterable[str]) -> int:
    """Adapter parameters: r (in + out) per targeted projection, per layer."""
    h, i, kv = info.hidden, info.intermediate, info.kv_dim
    shapes = {
        "q_proj": (h, h),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (h, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }
    per_layer = sum(r * sum(shapes.get(t, (h, h))) for t in targets)
    return info.layers * per_layer


def _logit_positions(info: ModelInfo, m: int, n: int, rows: int) -> int:
    """Positions whose logits a training pass holds at once: every completion token, or,
    where the trainer applies the head a chunk at a time (``trainer.PLAIN_HEAD_MODELS``),
    one chunk of each row plus each completion's first token."""
    from sapo_node.train.trainer import PLAIN_HEAD_MODELS, POSITIONS_PER_CALL

    if info.model_type in PLAIN_HEAD_MODELS:
        return rows * POSITIONS_PER_CALL + m
    return m * (n + 1)


def memory_need(
    info: ModelInfo,
    cfg: Config,
    device: str,
    prompt_tokens: int = PROMPT_TOKENS,
    *,
    cpu_bf16: bool = False,
) -> MemoryNeed:
    """The peak memory of a node of ``cfg`` on ``device`` (the formula: module docstring);
    ``cpu_bf16``: this CPU computes in bfloat16 (``policy.cpu_has_bf16``)."""
    gpu = device == "cuda"
    dtype = cfg.model.dtype
    if device == "cpu":
        half = dtype == "bfloat16" or (dtype == "auto" and cpu_bf16)
    else:
        half = dtype != "float32"
    b = 2 if half else 4
    p = info.params
    t, g = cfg.train, cfg.generation
    lora = cfg.model.lora
    a = lora_params(info, lora.r, lora.target_modules) if lora.enabled else 0
    trained = a if lora.enabled else p
    weights = b * p + 4 * a if lora.enabled else 4 * p
    if not lora.enabled and b == 2:
        weights += 2 * p  # autocast's bfloat16 copies of the float32 weights
    moments = 4 if t.optimizer_state == "bfloat16" else 8
    optimizer = moments * trained + (4 * p if t.kl_coef > 0 and not lora.enabled else 0)
    n, m, per_group = g.max_new_tokens, t.micro_batch_size, g.completions_per_task
    prompts = math.ceil(m / per_group) + (1 if m % per_group else 0)
    if not info.full_attention:  # one completion a row, each with its prompt
        prompts = m
    per_token = ACT_PER_HIDDEN * info.hidden + ACT_PER_MLP * info.intermediate
    tokens = prompts * prompt_tokens + m * n  # one row per prompt (or completion), then them
    if cfg.model.gradient_checkpointing:  # each layer's input, and one layer recomputed
        acts = tokens * (info.layers * info.hidden + per_token) * b
        # ... but a micro-batch of at most train.checkpoint_above_tokens is not checkpointed
        small = min(tokens, t.unchecked_tokens(lora.enabled))
        acts = max(acts, small * info.layers * per_token * b)
    else:
        acts = tokens * info.layers * per_token * b
    acts += LOGIT_COPIES * _logit_positions(info, m, n, prompts) * info.vocab * 4
    acts += TRAIN_FIXED + int(TRAIN_PER_TRAINED * 4 * trained)
    train = 4 * trained + max(acts, 4 * trained)  # gradients, then activations or AdamW's
    if not t.enabled:  # a generating member: no optimiser, no training pass
        optimizer = train = 0
    seqs = min(g.max_batch_sequences, (t.local_groups + t.external_groups) * g.completions_per_task)
    generate = seqs * (prompt_tokens + n) * info.layers * 2 * info.kv_dim * b
    processes = NODE_PROCESS + SCORER_PROCESS + (NET_PROCESS if cfg.net.enabled else 0)
    parts = {"weights": weights, "optimizer": optimizer, "peak pass": max(train, generate)}
    if gpu:  # the model is loaded into host memory first, then moved
        parts["CUDA context"] = CUDA_CONTEXT
        host = processes + (b * p if lora.enabled else 4 * p)
        return MemoryNeed("cuda", parts, host)
    parts["processes"] = processes
    return MemoryNeed(device, parts)


# --- disk -----------------------------------------------------------------------------


def checkpoint_bytes(info: ModelInfo, cfg: Config) -> int:
    """One checkpoint: trainable weights (float32) and the optimiser's two moments."""
    lora = cfg.model.lora
    trained = lora_params(info, lora.r, lora.target_modules) if lora.enabled else info.params
    return (8 if cfg.train.optimizer_state == "bfloat16" else 12) * trained


def disk_need(info: ModelInfo, cfg: Config, data_dir: Path, model_name: str) -> int:
    """Bytes the data directory will still need (module docstring)."""
    from sapo_node.train.policy import EMBEDDED

    ckpt = checkpoint_bytes(info, cfg) if cfg.train.enabled else 0
    root = data_dir / "checkpoints"
    existing = 0
    if root.is_dir():
        for p in root.glob("round-*/*"):
            if p.is_file():
                existing += p.stat().st_size
    need = max(0, (cfg.node.keep_checkpoints + 1) * ckpt - existing)
    if model_name == EMBEDDED and not info.cached:
        need += 4 * info.params
    return need + cfg.pool.max_mb * MiB
