"""``sapo-node doctor``: a preflight of this machine against a node's config.

Each check is a small function of what it looks at (versions, a GPU list, byte counts, a
path, addresses) that returns one ``Check``: PASS, WARN or FAIL, what was found, and what
to do. ``run_checks`` gathers those inputs from the machine and the config; tests call the
checks directly with inputs that fail on purpose. ``sapo-node doctor`` prints one line
per check and exits 0 when nothing FAILs (warnings allowed), 1 otherwise.

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
  MiB for the scoring worker, 150 MiB for the network process when the node is online
  (measured here: 366, 131 and 122 MiB); on a GPU, 512 MiB of CUDA context there, and
  host memory for the processes and the model as loaded before it moves (4P; LoRA bP).

Against measurements of the embedded model (P = 134.5 M, 2 cores, torch 2.13 CPU, float32,
2026-12-02; ``tests/unit/test_doctor.py`` keeps them and ``-m slow`` measures them
again): three training steps of 2 prompts (104 tokens) x 8 completions of exactly N
tokens, micro-batch 8, float32 moments, the node's allocator setting, peak RSS of the
process: full fine-tuning at N = 64 3672 MiB (formula 3727), with gradient checkpointing
2842 MiB (2966), LoRA at N = 64 1695 MiB (1988) and at N = 32 1411 MiB (1639). Real node
rounds, whose completions mostly end before 64 tokens, peak lower than the formula's
worst case: with those settings 2707 MiB full (formula 3759 at p = 128), 1447 MiB LoRA
(2020); with the defaults on a CPU computing in bfloat16, 2119 MiB full (2935), 1159 MiB
LoRA (1189) (round 1 of ``sapo-node start --rounds 2 --offline --seed 1 [--lora]``).

Disk (``disk_need``): a checkpoint holds the trainable weights and the optimiser's two
moments, 8P bytes (full; 12P with float32 moments) or 8A (LoRA); a node keeps
``node.keep_checkpoints`` and writes the next before pruning, so it needs (keep + 1)
checkpoints, less those already there, plus the embedded model's float32 cache (4P)
until it exists, plus the pool's ``pool.max_mb``.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapo_node.config import Config
from sapo_node.net.ports import bind_error

MiB = 2**20
GiB = 2**30

PYTHON_MIN = (3, 11)  # pyproject's requires-python
PYTHON_TESTED_MAX = (3, 13)
TORCH_MIN = (2, 4)  # pyproject's torch>=2.4
TORCH_TESTED = "2.13"

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
TIGHT = 0.9  # a need above this share of what is free: WARN


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    status: str  # "PASS", "WARN" or "FAIL"
    name: str
    found: str
    todo: str = ""

    def line(self) -> str:
        text = f"{self.status}  {self.name:<13} {self.found}"
        return f"{text} -> {self.todo}" if self.todo else text


def _pass(name: str, found: str) -> Check:
    return Check("PASS", name, found)


def _warn(name: str, found: str, todo: str) -> Check:
    return Check("WARN", name, found, todo)


def _fail(name: str, found: str, todo: str) -> Check:
    return Check("FAIL", name, found, todo)


def _size(n: float) -> str:
    if n >= GiB:
        return f"{n / GiB:.1f} GiB"
    return f"{n / MiB:.0f} MiB"


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in re.split(r"[.+]", text)[:3]:
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts)


# --- versions ------------------------------------------------------------------------


def check_python(version: Sequence[int]) -> Check:
    """Python against requires-python (3.11+) and the versions tested (up to 3.13)."""
    v = tuple(version[:3])
    text = ".".join(map(str, v))
    tested = f"{PYTHON_MIN[0]}.{PYTHON_MIN[1]} to {PYTHON_TESTED_MAX[0]}.{PYTHON_TESTED_MAX[1]}"
    if v[:2] < PYTHON_MIN:
        return _fail(
            "python",
            f"Python {text}; sapo-node needs 3.11 or newer",
            "install Python 3.11+ and recreate the environment "
            "(make clean-venv && make test PYTHON=python3.11)",
        )
    if v[:2] > PYTHON_TESTED_MAX:
        return _warn(
            "python",
            f"Python {text} is newer than the versions tested ({tested})",
            "if a dependency will not install or import, use Python 3.11 to 3.13",
        )
    return _pass("python", f"Python {text} (supported: {tested})")


def check_torch(version: str | None) -> Check:
    """torch installed, at least 2.4 (pyproject), tested with 2.13."""
    if version is None:
        return _fail(
            "torch",
            "torch is not installed",
            "run sh scripts/install.sh (make test does), or pip install 'torch>=2.4'",
        )
    if _version_tuple(version)[:2] < TORCH_MIN:
        return _fail(
            "torch",
            f"torch {version}; sapo-node needs 2.4 or newer",
            "pip install -U 'torch>=2.4' (a CPU build: TORCH_INDEX_URL="
            "https://download.pytorch.org/whl/cpu sh scripts/install.sh)",
        )
    return _pass("torch", f"torch {version} (supported: 2.4 or newer, tested {TORCH_TESTED})")


def check_packages(requirements: Iterable[str], installed: Callable[[str], str | None]) -> Check:
    """Every requirement of the sapo-node package (``requirements``, PEP 508 strings)
    met by ``installed(name)`` (its version, or None when missing)."""
    from packaging.requirements import InvalidRequirement, Requirement

    bad = []
    count = 0
    for text in requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra (dev) or another platform
        count += 1
        have = installed(req.name)
        if have is None:
            bad.append(f"{req.name} missing (needs {req.specifier or 'any'})")
        elif req.specifier and not req.specifier.contains(have, prereleases=True):
            bad.append(f"{req.name} {have} (needs {req.specifier})")
    if bad:
        return _fail(
            "packages",
            "; ".join(bad),
            "install the project's requirements: pip install -e . (or make test)",
        )
    return _pass("packages", f"the {count} requirements of sapo-node are met")


def _installed_version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _own_requirements() -> list[str]:
    import importlib.metadata

    try:
        return list(importlib.metadata.requires("sapo-node") or [])
    except importlib.metadata.PackageNotFoundError:
        return []


# --- torch's build against the machine ---------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    """An NVIDIA GPU as nvidia-smi reports it."""

    name: str
    capability: tuple[int, int] | None = None
    memory_free: int | None = None  # bytes
    memory_total: int | None = None


@dataclass(frozen=True)
class TorchBuild:
    """What the installed torch was built for and what it sees."""

    version: str
    cuda: str | None  # torch.version.cuda: None for a CPU-only build
    arch_list: tuple[str, ...] = ()  # e.g. ("sm_80", "sm_90", "compute_90")
    cuda_available: bool = False
    mps_available: bool = False


def detect_gpus(smi: str | None = None) -> tuple[bool, list[Gpu]]:
    """(an NVIDIA GPU is present, the GPUs nvidia-smi lists). Present means nvidia-smi
    on the PATH or /dev/nvidia0; the list may be empty when nvidia-smi cannot answer."""
    smi = smi if smi is not None else shutil.which("nvidia-smi")
    present = smi is not None or Path("/dev/nvidia0").exists()
    if smi is None:
        return present, []
    gpus = []
    for fields in (
        "name,compute_cap,memory.free,memory.total",
        "name,memory.free,memory.total",  # drivers before 510 have no compute_cap
    ):
        try:
            out = subprocess.run(
                [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=20,
            )
        except (OSError, subprocess.SubprocessError):
            return present, []
        if out.returncode == 0:
            break
    else:
        return present, []
    for row in out.stdout.strip().splitlines():
        cells = [c.strip() for c in row.split(",")]
        cap = None
        if len(cells) == 4:
            m = re.fullmatch(r"(\d+)\.(\d+)", cells.pop(1))
            cap = (int(m.group(1)), int(m.group(2))) if m else None
        mem = [int(float(c)) * MiB if re.fullmatch(r"[\d.]+", c) else None for c in cells[1:3]]
        gpus.append(Gpu(cells[0], cap, *mem))
    return present, gpus


def torch_build() -> TorchBuild:
    """The installed torch's build (torch must import)."""
    import torch

    arch: tuple[str, ...] = ()
    if torch.version.cuda is not None:
        flags = getattr(torch._C, "_cuda_getArchFlags", None)
        text = flags() if flags is not None else None
        arch = tuple(text.split()) if text else tuple(torch.cuda.get_arch_list())
    mps = getattr(torch.backends, "mps", None)
    return TorchBuild(
        version=torch.__version__,
        cuda=torch.version.cuda,
        arch_list=arch,
        cuda_available=torch.cuda.is_available(),
        mps_available=mps is not None and mps.is_available(),
    )


def arch_supports(arch_list: Iterable[str], capability: tuple[int, int]) -> bool:
    """Whether kernels compiled for ``arch_list`` run on a GPU of ``capability``: a
    ``sm_XY`` binary runs on X.Y and later minor versions of the same major (``sm_90a``
    only on 9.0), ``compute_XY`` PTX is compiled at load time for any later GPU."""
    major, minor = capability
    for arch in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+?)(\d)([af]?)", arch.strip())
        if not m:
            continue
        kind, a_major, a_minor, suffix = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        if kind == "compute" and (a_major, a_minor) <= (major, minor) and not suffix:
            return True
        if kind == "sm" and a_major == major and (a_minor == minor if suffix else a_minor <= minor):
            return True
    return False


def check_torch_build(
    nvidia_present: bool, gpus: Sequence[Gpu], build: TorchBuild, device: str
) -> Check:
    """torch's build against the machine: a CPU-only torch on a machine with an NVIDIA
    GPU, a CUDA torch that cannot use the GPU or has no kernels for its capability."""
    name = "torch build"
    where = f"torch {build.version}"
    gpu_names = ", ".join(f"{g.name}{_cap(g.capability)}" for g in gpus) or "an NVIDIA GPU"
    if not nvidia_present:
        if device == "cuda":
            return _fail(
                name,
                "device cuda is configured but this machine has no NVIDIA GPU "
                "(no nvidia-smi, no /dev/nvidia0)",
                "use --device auto or cpu",
            )
        if build.mps_available:
            return _pass(name, f"{where}, Apple GPU (MPS) available")
        if device == "mps":
            return _fail(
                name,
                f"device mps is configured but {where} sees no Apple GPU (MPS)",
                "use --device auto or cpu, or a torch build with MPS (macOS on Apple silicon)",
            )
        kind = "CPU-only build" if build.cuda is None else f"CUDA {build.cuda} build"
        return _pass(name, f"{where} ({kind}); no NVIDIA GPU here, the node runs on the CPU")
    if device == "cpu":
        return _pass(name, f"{where}; {gpu_names} present, device cpu is configured")
    if build.cuda is None:
        return _fail(
            name,
            f"{where} is a CPU-only build on a machine with {gpu_names}",
            "install a CUDA build of torch: pip install --force-reinstall torch "
            "(or TORCH_SPEC=torch sh scripts/install.sh); --device cpu to run on the CPU",
        )
    caps = [g.capability for g in gpus if g.capability is not None]
    if build.arch_list:
        missing = [c for c in caps if not arch_supports(build.arch_list, c)]
        if missing:
            cap = f"{missing[0][0]}.{missing[0][1]}"
            return _fail(
                name,
                f"{where} (CUDA {build.cuda}) has kernels for {' '.join(build.arch_list)}, "
                f"not for {gpu_names} (compute capability {cap})",
                "install a torch build whose CUDA supports this GPU (PyTorch's install "
                "selector lists them), e.g. pip install --force-reinstall torch "
                "--index-url https://download.pytorch.org/whl/cu128",
            )
    if not build.cuda_available:
        return _fail(
            name,
            f"{where} (CUDA {build.cuda}) cannot use {gpu_names}: torch.cuda.is_available() "
            "is false",
            "check the NVIDIA driver (nvidia-smi must work, and be new enough for CUDA "
            f"{build.cuda}) and CUDA_VISIBLE_DEVICES",
        )
    return _pass(name, f"{where} (CUDA {build.cuda}) runs on {gpu_names}")


def _cap(capability: tuple[int, int] | None) -> str:
    return f" (sm_{capability[0]}{capability[1]})" if capability else ""


# --- the model -----------------------------------------------------------------------


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
    from sapo_node.decode import full_attention

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
    from sapo_node.policy import EMBEDDED, EMBEDDED_CACHE, ModelLoadError, embedded_gguf_path

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


def check_model(name: str, info: ModelInfo | ModelInfoError) -> Check:
    """The model can be found, and how big it is."""
    if isinstance(info, ModelInfoError):
        text = str(info)
        if "local Hugging Face cache" in text:
            return _warn("model", text, "download it once where the hub is reachable")
        return _fail(
            "model",
            text,
            "give --model embedded, a local model directory or a Hugging Face id",
        )
    if not info.weights_present:
        return _fail(
            "model",
            f"{info.where} has a config.json but no weights (*.safetensors, *.bin)",
            "give a complete model directory",
        )
    note = "" if info.cached else "; de-quantised once at first start (about 30 s)"
    return _pass("model", f"{info.where}: {info.params / 1e6:.1f} M parameters{note}")


# --- memory ----------------------------------------------------------------------------


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
    from sapo_node.trainer import PLAIN_HEAD_MODELS, POSITIONS_PER_CALL

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


def check_memory(
    need: int, available: int, where: str = "in RAM", detail: str = "", name: str = "memory"
) -> Check:
    """Whether ``need`` bytes fit in the ``available`` ones."""
    found = f"needs about {_size(need)}{detail}, {_size(available)} free {where}"
    todo = (
        "lower train.micro_batch_size, generation.max_batch_sequences or "
        "generation.max_new_tokens, train LoRA adapters (--lora), or free memory"
    )
    if need > available:
        return _fail(name, found, todo)
    if need > TIGHT * available:
        return _warn(name, found + " (little headroom)", todo)
    return _pass(name, found)


def _describe_parts(need: MemoryNeed) -> str:
    return " (" + ", ".join(f"{k} {_size(v)}" for k, v in need.parts.items()) + ")"


def available_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def gpu_free_memory(gpus: Sequence[Gpu], build: TorchBuild | None) -> int | None:
    """Free bytes on the first GPU: torch's view if it can use it, else nvidia-smi's."""
    if build is not None and build.cuda_available:
        import torch

        free, _total = torch.cuda.mem_get_info(0)
        return int(free)
    return gpus[0].memory_free if gpus else None


# --- disk ----------------------------------------------------------------------------


def checkpoint_bytes(info: ModelInfo, cfg: Config) -> int:
    """One checkpoint: trainable weights (float32) and the optimiser's two moments."""
    lora = cfg.model.lora
    trained = lora_params(info, lora.r, lora.target_modules) if lora.enabled else info.params
    return (8 if cfg.train.optimizer_state == "bfloat16" else 12) * trained


def disk_need(info: ModelInfo, cfg: Config, data_dir: Path, model_name: str) -> int:
    """Bytes the data directory will still need (module docstring)."""
    from sapo_node.policy import EMBEDDED

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


def free_disk(path: Path) -> int:
    """Free bytes on the file system of ``path``, or of its nearest existing parent."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return int(shutil.disk_usage(probe).free)


def check_disk(need: int, free: int, data_dir: Path) -> Check:
    """Free disk in the data directory for checkpoints, cache and pool."""
    probe = data_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        return _fail(
            "disk",
            f"{probe} is not writable",
            "pass a --data-dir this user can write, or fix its permissions",
        )
    found = (
        f"needs about {_size(need)} for checkpoints, cache and pool, {_size(free)} free in {probe}"
    )
    todo = (
        "free disk space, pass a --data-dir on a larger disk, lower node.keep_checkpoints, "
        "or train LoRA adapters (--lora: small checkpoints)"
    )
    if need > free:
        return _fail("disk", found, todo)
    if need > TIGHT * free:
        return _warn("disk", found + " (little headroom)", todo)
    return _pass("disk", found)


# --- port, identity, lock, checkpoint --------------------------------------------------


def check_port(listen: Sequence[str], enabled: bool = True) -> Check:
    """Each TCP port the node would listen on is free to bind (as ``start`` checks it)."""
    if not enabled:
        return _pass("port", "offline: no port to listen on")
    ports = []
    for text in listen:
        m = re.fullmatch(r"/ip([46])/([^/]+)/tcp/(\d+)(/.*)?", text)
        if not m:
            return _fail("port", f"cannot read listen address {text!r}", "give /ip4/HOST/tcp/PORT")
        host, port = m.group(2), int(m.group(3))
        if port == 0:
            ports.append(f"{host}:any")
            continue
        exc = bind_error(host, port)
        if exc is not None and exc.errno == errno.EADDRINUSE:
            return _fail(
                "port",
                f"TCP port {port} on {host} is in use (another sapo-node?)",
                f"stop the other program, or pass --listen /ip4/{host}/tcp/OTHER_PORT",
            )
        if exc is not None:
            return _fail(
                "port",
                f"cannot listen on {text}: {exc.strerror or exc}",
                "pass a --listen address of this machine",
            )
        ports.append(f"{host}:{port}")
    return _pass("port", "free to listen on " + ", ".join(ports))


def check_status_port(listen: str, enabled: bool = True) -> Check:
    """The status endpoint's HOST:PORT is free to bind."""
    from sapo_node.config import DEFAULT_STATUS_LISTEN, parse_host_port

    name = "status port"
    if not enabled:
        return _pass(name, "status endpoint off")
    try:
        host, port = parse_host_port(listen)
    except ValueError as exc:
        return _fail(name, str(exc), "give --status-listen HOST:PORT")
    if port == 0:
        return _pass(name, f"{host}: any free port")
    exc = bind_error(host, port)
    if exc is None:
        return _pass(name, f"free to serve on {listen}")
    busy = exc.errno == errno.EADDRINUSE
    if busy and listen == DEFAULT_STATUS_LISTEN:
        return _pass(name, f"{listen} taken (another sapo-node?): the node takes a free port")
    return _fail(
        name,
        f"TCP port {port} on {host} is in use (another sapo-node?)"
        if busy
        else f"cannot listen on {listen}: {exc.strerror or exc}",
        "pass --status-listen HOST:OTHER_PORT (port 0 picks a free one), or set "
        "status.enabled = false",
    )


def check_identity_key(path: Path) -> Check:
    """The identity key: private to its owner (no group or world bits) and a key."""
    if not path.exists():
        return _pass("identity key", f"none yet: {path} is created (mode 0600) at first start")
    try:
        mode = path.stat().st_mode & 0o777
    except OSError as exc:
        return _fail("identity key", f"cannot stat {path}: {exc}", "fix its permissions")
    if mode & 0o077:
        return _fail(
            "identity key",
            f"{path} is mode {mode:03o}: readable or writable by others",
            f"chmod 600 {path}",
        )
    try:
        from sapo_node.net import NetError
        from sapo_node.net.identity import load, peer_id

        key = load(path)
    except NetError as exc:
        return _fail(
            "identity key",
            str(exc),
            "restore the key, or move it away to start with a new peer ID",
        )
    except ImportError as exc:  # libp2p missing: the packages check says so
        return _warn("identity key", f"{path} is mode {mode:03o}; cannot parse it: {exc}", "")
    return _pass("identity key", f"{path} (mode {mode:03o}), peer ID {peer_id(key)}")


def check_lock(data_dir: Path) -> Check:
    """No other process holds the data directory's lock (a node running there)."""
    path = data_dir / "lock"
    if not path.exists():
        return _pass("data dir", f"{data_dir}: not in use")
    try:
        with path.open("rb") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = handle.read(32).decode("ascii", "replace").strip()
                who = f" (pid {pid})" if pid.isdigit() else ""
                return _fail(
                    "data dir",
                    f"{data_dir} is in use by another sapo-node{who}",
                    "stop that node, or pass another --data-dir",
                )
            fcntl.flock(handle, fcntl.LOCK_UN)
    except OSError as exc:
        return _fail("data dir", f"cannot open {path}: {exc}", "fix its permissions")
    return _pass("data dir", f"{data_dir}: not in use")


def check_checkpoint(data_dir: Path, fingerprint: dict[str, Any], trains: bool = True) -> Check:
    """The checkpoint a start would resume from belongs to this config (model, LoRA; a
    generating member's data dir holds no trained weights); its hashes are checked at
    start, not here."""
    from sapo_node.checkpoint import STATE, WEIGHTS, CheckpointError, CheckpointStore

    try:
        path = CheckpointStore(data_dir).latest()
    except CheckpointError as exc:
        return _fail("checkpoint", str(exc), "fix LATEST, or pass another --data-dir")
    if path is None:
        return _pass("checkpoint", "none: the node starts from round 0")
    try:
        state = json.loads((path / STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return _fail(
            "checkpoint",
            f"{path} cannot be read: {exc}",
            "remove it and point checkpoints/LATEST at an older one",
        )
    theirs = state.get("fingerprint")
    if theirs != fingerprint:
        return _fail(
            "checkpoint",
            f"{path} was made for {theirs}, this config runs {fingerprint}",
            "use the same --model and LoRA setting, or another --data-dir",
        )
    if not trains:
        try:
            trained = safetensors_params([path / WEIGHTS])
        except (OSError, ValueError, KeyError, struct.error):
            trained = 0
        if trained:
            return _fail(
                "checkpoint",
                f"{path} is a training node's checkpoint; a generating member keeps its "
                "model as it is",
                "give the generating member another --data-dir",
            )
    return _pass("checkpoint", f"resumes from round {state.get('round')} ({path.name})")


# --- all of them -----------------------------------------------------------------------


def _resolve_device(preference: str, build: TorchBuild | None) -> str:
    if preference != "auto":
        return preference
    if build is not None and build.cuda_available:
        return "cuda"
    if build is not None and build.mps_available:
        return "mps"
    return "cpu"


def run_checks(cfg: Config, *, no_train: bool = False) -> list[Check]:
    """Every check of this machine against ``cfg`` (``no_train``: a relay, no model; a
    generating member is ``cfg`` with ``train.enabled`` false)."""
    data_dir = cfg.node.resolved_data_dir()
    checks = [check_python(sys.version_info)]
    try:
        import torch

        torch_version: str | None = torch.__version__
    except ImportError:
        torch_version = None
    checks.append(check_torch(torch_version))
    requirements = _own_requirements()
    if requirements:
        checks.append(check_packages(requirements, _installed_version))
    else:
        checks.append(
            _warn(
                "packages",
                "sapo-node is not installed as a package: its requirements are not checked",
                "pip install -e . (make test does)",
            )
        )
    if not no_train:
        build = torch_build() if torch_version is not None else None
        present, gpus = detect_gpus()
        if build is not None:
            checks.append(check_torch_build(present, gpus, build, cfg.node.device))
        name = cfg.model.name
        try:
            info: ModelInfo | ModelInfoError = model_info(name, data_dir / "models")
        except ModelInfoError as exc:
            info = exc
        checks.append(check_model(name, info))
        if isinstance(info, ModelInfo):
            device = _resolve_device(cfg.node.device, build)
            from sapo_node.policy import cpu_has_bf16

            need = memory_need(info, cfg, device, cpu_bf16=device == "cpu" and cpu_has_bf16())
            if device == "cuda":
                checks.append(check_memory(need.host, available_memory(), "in RAM"))
                free = gpu_free_memory(gpus, build)
                if free is None:
                    checks.append(
                        _warn("gpu memory", f"needs about {_size(need.total)}; free unknown", "")
                    )
                else:
                    checks.append(
                        check_memory(
                            need.total, free, "on GPU 0", _describe_parts(need), "gpu memory"
                        )
                    )
            else:
                checks.append(
                    check_memory(need.total, available_memory(), "in RAM", _describe_parts(need))
                )
            disk = disk_need(info, cfg, data_dir, name)
            checks.append(check_disk(disk, free_disk(data_dir), data_dir))
        checks.append(check_checkpoint(data_dir, cfg.fingerprint(), cfg.train.enabled))
    checks.append(check_port(cfg.net.listen, cfg.net.enabled))
    checks.append(check_status_port(cfg.status.listen, cfg.status.enabled))
    checks.append(check_identity_key(data_dir / "identity.key"))
    checks.append(check_lock(data_dir))
    return checks


def exit_code(checks: Iterable[Check]) -> int:
    """0 when nothing failed (warnings allowed), else 1."""
    return 1 if any(c.status == "FAIL" for c in checks) else 0
