"""Sampling completions with each prompt computed once, and a lean decode loop.

``sample`` is what ``Policy.generate`` runs. For a chunk of prompts (at most
``max_batch_sequences`` completions, prompts of similar length together):

1. **Prefill once per prompt.** The distinct prompts run through the model as one
   left-padded batch, and each prompt's keys and values are copied into a cache
   preallocated for all of the chunk's rows: the prompt's L completions share one
   forward pass (nanochat's engine does the same by cloning its cache). Rows are
   left-aligned to the longest prompt; the attention mask hides the gap and position ids
   count from each row's own first token, so a row sees exactly what it would see alone.
2. **Decode.** One token per active row per step: ``model(..., cache=...)`` on the last
   tokens, then sampling (temperature, then top-k, then top-p, as transformers' sampling
   does). Two switches (``generation.preallocated_cache``, ``generation.decode_mask``;
   docs/benchmarks.md, "CPU paths", has what each buys): the cache is preallocated
   (`_PreallocatedLayer`), so a step writes one column instead of concatenating the whole
   past (off: transformers' ``DynamicCache``); the loop passes its own 4D attention mask,
   which transformers would drop when all is visible (prompts of one length), and SDPA
   on the CPU without a mask runs grouped-query attention slower than with one (off: a
   2D mask, transformers' own handling). Rows that emitted EOS are dropped from the
   batch, mask and cache once enough of them have finished to pay for the copy.
3. **Sampling without a sort.** With top-p = 1 and top-k = 0 a token is drawn by inverse
   CDF (a cumulative sum and a binary search per row) instead of ``torch.multinomial``,
   which draws one exponential variate per vocabulary entry; the distribution is the same.

The output contract is ``Policy.generate``'s: a completion ends with an EOS id iff it
finished. Models whose attention is not plain full attention (sliding windows, linear
attention, encoder-decoders), or that run an attention implementation other than "sdpa"
or "eager" (which take a 4D mask), are refused by ``supported`` and take the caller's
``model.generate`` fallback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicLayer

# Drop finished rows once this share of the active rows has finished (the copy of the
# cache costs about one decode step's worth of memory traffic).
COMPACT_SHARE = 0.25


@dataclass(frozen=True)
class Sampling:
    """How the next token is drawn: transformers' semantics (temperature, top-k, top-p)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0


# Attention implementations that take a 4D mask as it is: boolean (True: attend) for
# "sdpa", additive for "eager".
MASKED_ATTENTION = ("sdpa", "eager")


def supported(model) -> bool:
    """Whether the fast path applies: a decoder-only model with full attention in every
    layer, run by an implementation in ``MASKED_ATTENTION``."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    if getattr(config, "_attn_implementation", None) not in MASKED_ATTENTION:
        return False
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if getattr(text, "num_hidden_layers", None) is None:
        return False
    return full_attention(
        getattr(text, "layer_types", None),
        getattr(text, "sliding_window", None),
        getattr(text, "use_sliding_window", True),
    )


def full_attention(layer_types, sliding_window, use_sliding_window=True) -> bool:
    """Whether every layer attends to the whole sequence, from a model config's fields."""
    if layer_types and any(t != "full_attention" for t in layer_types):
        return False
    return sliding_window is None or not use_sliding_window


class _PreallocatedLayer(DynamicLayer):
    """One layer's keys and values in buffers sized for the whole generation.

    A decode step writes one column; ``keys``/``values`` are views of the filled part, so
    no step copies the past (``DynamicLayer`` concatenates it every step).
    """

    def __init__(self, buffers: tuple[torch.Tensor, torch.Tensor], length: int) -> None:
        super().__init__()
        self._k, self._v = buffers
        self.device = self._k.device
        self.length = length
        self.is_initialized = True
        self._views()

    def _views(self) -> None:
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]

    def lazy_initialization(self, key_states, value_states) -> None:  # never lazy
        raise AssertionError("a preallocated layer is built with its buffers")

    def update(self, key_states, value_states, *args, **kwargs):
        end = self.length + key_states.shape[-2]
        if end > self._k.shape[2]:
            raise RuntimeError(f"preallocated cache full ({self._k.shape[2]} positions)")
        self._k[:, :, self.length : end].copy_(key_states)
        self._v[:, :, self.length : end].copy_(value_states)
        self.length = end
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        # Only the filled positions are copied: the rest of the new buffers stays
        # untouched (not resident) until decoding writes it.
        self._k = _select_filled(self._k, indices, self.length)
        self._v = _select_filled(self._v, indices, self.length)
        self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._k = self._k.repeat_interleave(repeats, dim=0)
        self._v = self._v.repeat_interleave(repeats, dim=0)
        self._views()

    def crop(self, tokens_to_remove: int) -> None:
        self.length = max(0, self.length + min(tokens_to_remove, 0))
        self._views()


def _select_filled(buffer: torch.Tensor, rows: torch.Tensor, length: int) -> torch.Tensor:
    """A buffer [rows, heads, capacity, dim] for the given rows, its first ``length``
    positions copied, the others left unwritten."""
    out = buffer.new_empty((len(rows), *buffer.shape[1:]))
    out[:, :, :length] = buffer[:, :, :length].index_select(0, rows)
    return out


def _preallocate(
    prefilled: Cache,
    prompts: list[list[int]],
    counts: list[int],
    rows: int,
    width: int,
    capacity: int,
) -> Cache:
    """A cache of ``capacity`` positions for ``rows`` rows, each prompt's keys and values
    (left-padded to ``width`` in ``prefilled``) copied into its ``counts`` rows."""
    # Positions past the prompts stay unwritten (not resident) until a step writes them:
    # a step reads only the positions written so far.
    buffers = [
        (
            layer.keys.new_empty((rows, layer.keys.shape[1], capacity, layer.keys.shape[3])),
            layer.values.new_empty((rows, layer.values.shape[1], capacity, layer.values.shape[3])),
        )
        for layer in prefilled.layers
    ]
    start = 0
    for i, (prompt, count) in enumerate(zip(prompts, counts, strict=True)):
        offset = width - len(prompt)
        for (kb, vb), layer in zip(buffers, prefilled.layers, strict=True):
            for buffer, filled in ((kb, layer.keys), (vb, layer.values)):
                buffer[start : start + count, :, :offset] = 0  # the gap: masked, never NaN
                buffer[start : start + count, :, offset:width] = filled[i, :, offset:width]
        start += count
    return Cache(layers=[_PreallocatedLayer(b, width) for b in buffers])


def attention_mask(seen: torch.Tensor, implementation: str) -> torch.Tensor:
    """A boolean 4D mask (True: attend) in the form ``implementation`` takes
    (``MASKED_ATTENTION``): as it is for "sdpa", additive (0 or the float32 minimum) for
    "eager"."""
    if implementation == "sdpa":
        return seen
    return torch.zeros(seen.shape, device=seen.device).masked_fill(
        ~seen, torch.finfo(torch.float32).min
    )


def sample(
    model,
    prompts: Sequence[list[int]],
    n: int,
    *,
    max_new_tokens: int,
    sampling: Sampling,
    eos_ids: Sequence[int],
    device: torch.device,
    max_batch_sequences: int,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    should_stop: Callable[[], bool] | None = None,
    preallocated_cache: bool = True,
    decode_mask: bool = True,
) -> list[list[list[int]]]:
    """``n`` completions of every prompt: ``[prompt][completion] -> token ids``.

    A completion ends with an EOS id iff it finished. If ``should_stop()`` turns true,
    generation ends after the token being sampled. ``preallocated_cache`` and
    ``decode_mask`` false: transformers' ``DynamicCache`` and its own mask from a 2D one
    (the module docstring).
    """
    out: list[list[list[int]]] = [[] for _ in prompts]
    stopped = False
    for chunk in _chunks([len(p) for p in prompts], n, max_batch_sequences):
        if stopped:  # the caller discards partial results; keep the shape anyway
            for p, k in chunk:
                out[p].extend([] for _ in range(k))
            continue
        rows, stopped = _sample_chunk(
            model,
            [prompts[p] for p, _ in chunk],
            [k for _, k in chunk],
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            eos_ids=eos_ids,
            device=device,
            autocast=autocast,
            should_stop=should_stop,
            preallocated_cache=preallocated_cache,
            decode_mask=decode_mask,
        )
        i = 0
        for p, k in chunk:
            out[p].extend(rows[i : i + k])
            i += k
    return out


def _chunks(lengths: list[int], n: int, limit: int) -> list[list[tuple[int, int]]]:
    """Prompts in length order, cut into chunks of at most ``limit`` rows: [(prompt, rows)]."""
    chunks: list[list[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    room = limit
    for p in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        left = n
        while left:
            take = min(left, room)
            current.append((p, take))
            left -= take
            room -= take
            if room == 0:
                chunks.append(current)
                current, room = [], limit
    if current:
        chunks.append(current)
    return chunks


def _sample_chunk(
    model,
    prompts: list[list[int]],
    counts: list[int],
    *,
    max_new_tokens: int,
    sampling: Sampling,
    eos_ids: Sequence[int],
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager],
    should_stop: Callable[[], bool] | None,
    preallocated_cache: bool = True,
    decode_mask: bool = True,
) -> tuple[list[list[int]], bool]:
    rows = sum(counts)
    width = max(len(p) for p in prompts)
    capacity = width + max_new_tokens
    row_prompt = torch.repeat_interleave(torch.arange(len(prompts)), torch.tensor(counts))
    lengths = torch.tensor([len(prompts[i]) for i in row_prompt.tolist()])

    # 1. Prefill the distinct prompts once, as one left-padded batch, and copy each
    # prompt's keys and values into its rows of the preallocated cache (the padding's
    # columns stay zero, hidden by the mask).
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    prompt_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        ids[i, width - len(prompt) :] = torch.tensor(prompt)
        prompt_mask[i, width - len(prompt) :] = 1
    with autocast():
        res = model(
            input_ids=ids.to(device),
            attention_mask=prompt_mask.to(device),
            position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0).to(device),
            use_cache=True,
            logits_to_keep=1,
        )
    prefilled = res.cache if hasattr(res, "cache") else res.past_key_values
    if preallocated_cache:
        cache = _preallocate(prefilled, prompts, counts, rows, width, capacity)
    else:  # the plain path: the prompts' DynamicCache, one row per completion
        prefilled.batch_select_indices(row_prompt.to(device))
        cache = prefilled
    del prefilled
    visible = torch.zeros((rows, capacity), dtype=torch.bool, device=device)
    visible[:, :width] = (torch.arange(width) >= (width - lengths)[:, None]).to(device)
    implementation = model.config._attn_implementation
    position = lengths.to(device)  # the next token's position, per row
    logits = res.logits[:, -1].float().index_select(0, row_prompt.to(device))
    del res

    # 2. Decode: sample, append, drop finished rows.
    eos = torch.tensor(list(eos_ids), dtype=torch.long, device=device)
    active = torch.arange(rows)  # original row of each batch row
    done = torch.zeros(rows, dtype=torch.bool)  # per batch row
    completions: list[list[int]] = [[] for _ in range(rows)]
    stopped = False
    for step in range(max_new_tokens):
        tokens = sample_next(logits, sampling)
        finished_now = torch.isin(tokens, eos)
        for r, tok in zip(active[~done].tolist(), tokens[~done.to(device)].tolist(), strict=True):
            completions[r].append(tok)
        done |= finished_now.cpu()
        if should_stop is not None and should_stop():
            stopped = True
            break
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        if int(done.sum()) >= max(1, int(COMPACT_SHARE * len(active))):
            keep = (~done).nonzero().squeeze(1)
            keep_dev = keep.to(device)
            cache.batch_select_indices(keep_dev)
            visible, position, tokens = visible[keep_dev], position[keep_dev], tokens[keep_dev]
            active, done = active[keep], done[keep]
        end = width + step + 1
        visible[:, end - 1] = True
        with autocast():
            res = model(
                input_ids=tokens[:, None],
                attention_mask=attention_mask(visible[:, None, None, :end], implementation)
                if decode_mask
                else visible[:, :end].long(),
                position_ids=position[:, None],
                cache=cache,
                use_cache=True,
            )
        logits = res.logits[:, -1].float()
        position = position + 1
    return completions, stopped


def sample_next(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """One token per row from float32 logits [B, V]."""
    return draw(torch.softmax(warp(logits, sampling), dim=-1))


def warp(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Temperature, then top-k, then top-p, as transformers' logits warpers (-inf: removed).

    With top-p = 1 and top-k = 0 (the defaults) nothing is sorted.
    """
    scores = logits if sampling.temperature == 1.0 else logits / sampling.temperature
    if sampling.top_k:
        k = min(sampling.top_k, scores.shape[-1])
        kth = torch.topk(scores, k).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - sampling.top_p)
        remove[..., -1:] = False
        scores = scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    return scores


def draw(probs: torch.Tensor) -> torch.Tensor:
    """One index per row of probabilities [B, V], by inverse CDF (same law as multinomial)."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:].contiguous()
    u = torch.rand((probs.shape[0], 1), device=probs.device, dtype=cdf.dtype) * total
    index = torch.searchsorted(cdf, u, right=True)
    # u * total can round up to total: take the last token with mass, never one past it.
    last = torch.searchsorted(cdf, total, right=False)
    return torch.where(index < probs.shape[-1], index, last).squeeze(1)
