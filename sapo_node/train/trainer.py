"""The GRPO update over one round's training set: batching, micro-batches, optimiser.

Each prompt is computed once per micro-batch, not once per completion. A micro-batch is a
run of at most ``micro_batch_size`` completions, taken group by group (a group = the
completions of one prompt), and packed one row per prompt (``pack``): the prompt, then
each completion's tokens but its last, one after another. A block attention mask lets a
token see the earlier tokens of its prompt and of its own completion only, and positions
restart after the prompt for every completion, so each completion is computed exactly as
if it followed its prompt alone. The logit at the prompt's last position predicts every
completion's first token. One forward and one backward run over prompts and completions
together: the loss and every gradient equal those of the unshared computation (each
completion with its own copy of the prompt) up to float rounding, with micro-batching,
LoRA and gradient checkpointing (``tests/unit/test_prompt_sharing.py``). Prompts are
longer than completions, so most of the training tokens were the L copies of each prompt:
this removes them, and the completions of a row are not padded to the longest. A group
split over two micro-batches runs its prompt in each of them.

The first tokens that every prompt of a step has in common (chat template, system prompt,
worked example: most of each prompt with the default tasks) are computed once
per step (``train.shared_prefix``): one short forward pass gives their keys and values in
every layer, each row starts after them, its positions counting on from theirs, and every
layer reads them before the row's own keys and values (``prefix.Prefix``, the block mask's
leading columns). Their gradient is gathered over the micro-batches and sent back through
that one pass, so the loss and every gradient are again those of the unshared computation
(tests/unit/test_prompt_sharing.py). Passes without a gradient (``completion_ranks``,
``completion_logprobs``) keep whole prompts: there the prefix's own pass and the longer
key rows cost more than the prompt tokens saved (docs/benchmarks.md).

For models whose forward ends at the head (``PLAIN_HEAD_MODELS``) the logits are made
from the decoder's hidden states 64 positions at a time and recomputed in backward, so a
micro-batch's whole [rows, positions, vocabulary] logits never exist
(``train.chunked_head``). Models whose
attention is not full attention in every layer with the "sdpa" or "eager" implementation
(a sliding window, a flash kernel without custom masks) get one completion a row and
their own causal mask.

With gradient checkpointing on, a micro-batch of at most ``checkpoint_above_tokens``
tokens (unset: 768 for full fine-tuning, 0 with LoRA) runs without it: its activations are
small and its step faster (docs/benchmarks.md, CPU paths).

Old-policy log-probs are real: with ``ppo_epochs > 1`` the first epoch's log-probs
(detached) are the old policy's, since no step has been taken yet, and are kept for the
later epochs, whose ratios move away from 1, so the clip acts. No separate pass.

Loss weights are computed once over the whole batch, so micro-batching changes memory,
never the gradient. They are normalised over the round's whole batch (``batch_rows``,
``batch_tokens``), not over the rows with signal passed here: see ``grpo``'s docstring.

A step whose gradient norm is not finite is skipped (gradients zeroed, counted in
``TrainStats.skipped_steps``, logged), so no NaN reaches the weights. In float16 the loss is
scaled by a ``torch.amp.GradScaler`` and the gradients unscaled before clipping.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import structlog
import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from sapo_node.config import TrainSection
from sapo_node.samples import Sample
from sapo_node.train import decode, grpo
from sapo_node.train.optim import CompactAdam
from sapo_node.train.policy import Policy
from sapo_node.train.prefix import Prefix, common_prefix

log = structlog.get_logger(__name__)


@dataclass
class Packed:
    """A micro-batch: one row per prompt, its completions after it (module docstring).

    Row r is its prompt, left-padded to ``P`` columns, then the input tokens of each of
    its completions (all but the last), one after another, right-padded to ``T`` columns.
    The logit at column ``P - 1`` predicts every completion's first token; the logit at a
    completion's input token predicts the token after it.
    """

    input_ids: torch.Tensor  # [R, P + T]
    attention_mask: torch.Tensor  # [R, P + T] (one completion a row) or [R, 1, P + T, P + T]
    position_ids: torch.Tensor  # [R, P + T]
    row: torch.Tensor  # [B] each sample's row
    index: torch.Tensor  # [B, C - 1] where in the flattened [R, T] its tokens 2..C are predicted
    next_ids: torch.Tensor  # [R, T] the token each completion input token predicts
    targets: torch.Tensor  # [B, C] completion tokens, right-padded
    mask: torch.Tensor  # [B, C] 1 on completion tokens that are taught (``Sample.taught``)
    advantages: torch.Tensor  # [B]


def block_mask(segments: torch.Tensor, attention: str, prefix: int = 0) -> torch.Tensor:
    """segments [R, W] (-1 padding, 0 prompt, k > 0 the k-th completion) -> [R, 1, W,
    prefix + W]: a token sees the ``prefix`` shared prompt tokens before the row (keys and
    values from ``Prefix``), the earlier tokens of its prompt and those of its own
    completion. ``attention`` is the model's implementation: a boolean mask for "sdpa"
    (True: attend), an additive one (0 or the float32 minimum) for "eager". A padding
    token sees itself only, so no softmax row is empty."""
    w = segments.shape[1]
    q, k = segments[:, :, None], segments[:, None, :]
    causal = torch.ones(w, w, dtype=torch.bool).tril()
    seen = causal & (k >= 0) & ((k == 0) | (k == q)) & (q >= 0)
    seen |= torch.eye(w, dtype=torch.bool)
    if prefix:
        seen = torch.cat([(q >= 0).expand(-1, -1, prefix), seen], dim=2)
    return decode.attention_mask(seen[:, None], attention)


def pack(
    samples: Sequence[Sample], pad_id: int, *, attention: str | None = "sdpa", prefix: int = 0
) -> Packed:
    """Pad samples into one row per distinct prompt (see ``Packed``). ``attention``: the
    model's attention implementation ("sdpa" or "eager"); None, or any other, puts one
    completion in each row (no block mask needed: the model's own causal mask applies).
    ``prefix``: how many first tokens, the same in every prompt, are left out of the rows
    and computed once before them (``Prefix``); the rows' positions count from it."""
    shared = attention in ("sdpa", "eager")
    if prefix and not (shared and all(len(s.prompt_ids) > prefix for s in samples)):
        raise ValueError("a shared prefix needs a block mask and a token of each prompt after it")
    rows: list[tuple[list[int], list[int]]] = []  # (prompt, sample indices)
    where: dict[tuple[int, ...], int] = {}
    for i, s in enumerate(samples):
        key = tuple(s.prompt_ids)
        if shared and key in where:
            rows[where[key]][1].append(i)
        else:
            where[key] = len(rows)
            rows.append((s.prompt_ids, [i]))
    p_width = max(len(p) for p, _ in rows) - prefix
    spans = [sum(len(samples[i].completion_ids) - 1 for i in idx) for _, idx in rows]
    t_width = max(spans)
    c_width = max(len(s.completion_ids) for s in samples)
    r, b, w = len(rows), len(samples), p_width + t_width
    ids = torch.full((r, w), pad_id, dtype=torch.long)
    seg = torch.full((r, w), -1, dtype=torch.long)
    pos = torch.zeros((r, w), dtype=torch.long)
    next_ids = torch.full((r, t_width), pad_id, dtype=torch.long)
    row = torch.zeros(b, dtype=torch.long)
    index = torch.zeros((b, max(c_width - 1, 0)), dtype=torch.long)
    targets = torch.full((b, c_width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, c_width), dtype=torch.float32)
    for j, (prompt, idx) in enumerate(rows):
        p = len(prompt)  # its positions: prefix .. p - 1 in the row, 0 .. prefix - 1 before
        ids[j, p_width - p + prefix : p_width] = torch.tensor(prompt[prefix:])
        seg[j, p_width - p + prefix : p_width] = 0
        pos[j, p_width - p + prefix : p_width] = torch.arange(prefix, p)
        col = 0  # columns after the prompt used so far
        for k, i in enumerate(idx, start=1):
            comp = samples[i].completion_ids
            n = len(comp) - 1
            row[i] = j
            targets[i, : n + 1] = torch.tensor(comp)
            taught = samples[i].taught
            if taught is None:
                mask[i, : n + 1] = 1.0
            elif len(taught) == n + 1:
                mask[i, : n + 1] = torch.tensor(taught, dtype=torch.float32)
            else:
                raise ValueError(f"taught has {len(taught)} flags for {n + 1} tokens")
            if n > 0:
                ids[j, p_width + col : p_width + col + n] = torch.tensor(comp[:-1])
                seg[j, p_width + col : p_width + col + n] = k
                pos[j, p_width + col : p_width + col + n] = torch.arange(p, p + n)
                next_ids[j, col : col + n] = torch.tensor(comp[1:])
                index[i, :n] = j * t_width + col + torch.arange(n)
            col += n
    return Packed(
        input_ids=ids,
        attention_mask=block_mask(seg, attention, prefix) if shared else (seg >= 0).long(),
        position_ids=pos,
        row=row,
        index=index,
        next_ids=next_ids,
        targets=targets,
        mask=mask,
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
    )


@dataclass
class TrainStats:
    """What one update did; loss and the per-token means are those of the last step.

    ``clip_frac``, ``approx_kl`` (k3 of KL(old || new)), ``kl`` (to the reference) and
    ``entropy`` (nats, of the sampled distribution) are means over completion tokens,
    weighted like the loss. ``skipped_steps``: steps not taken for a non-finite gradient.

    Gradient norms are the total norm over the trainable parameters before clipping, as
    ``clip_grad_norm_`` returns it (after unscaling, in float16). ``grad_norm``: the last
    step's (not finite if it was skipped); ``grad_norm_max``: the largest over the steps
    taken; ``clipped_steps``: steps taken whose norm exceeded ``train.grad_clip``, i.e.
    whose gradient the clip scaled down (never with ``grad_clip = 0``).
    """

    sequences: int = 0
    tokens: int = 0
    steps: int = 0
    skipped_steps: int = 0
    loss: float = 0.0
    clip_frac: float = 0.0
    kl: float = 0.0
    approx_kl: float = 0.0
    entropy: float = 0.0
    grad_norm: float = 0.0
    grad_norm_max: float = 0.0
    clipped_steps: int = 0


@dataclass
class _Plan:
    """One update's micro-batches, weights and fixed log-probs (old: set by epoch 1)."""

    batches: list[tuple[list[int], Packed]]
    prefix: list[int]  # the prompts' shared first tokens, computed once per epoch (Prefix)
    row_weight: torch.Tensor  # [N] loss weight of each sample's tokens
    total_weight: float
    tokens: int
    ref: list[torch.Tensor | None]
    old: list[torch.Tensor | None]


FUSED_OPTIMIZER_DEVICES = ("cpu", "cuda")  # where torch has fused Adam(W) kernels
# Positions of a row passed to one call of a per-token function: a row holds a whole
# group's completions, and the entropy's [positions, vocabulary] temporaries (four of
# them) over a whole row would grow with the group's size times a vocabulary of tens of
# thousands of tokens.
POSITIONS_PER_CALL = 64
# Model types whose causal-LM forward is ``lm_head(decoder(...).last_hidden_state)`` with
# nothing after the head (no soft-capping, no scaling). For them the trainer runs the
# decoder and applies the head a chunk of positions at a time: the [rows, positions,
# vocabulary] logits of a micro-batch (in float32, the largest tensor of a step with a
# small model's large vocabulary) and their gradient never exist at once. Others: the
# model's own forward and its logits.
PLAIN_HEAD_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def shared_attention(model: torch.nn.Module) -> str | None:
    """The model's attention implementation if a block mask can put a prompt's
    completions in one row: "sdpa" or "eager" with full attention in every layer (a
    sliding window is the model's own mask). None otherwise: one completion a row."""
    if not decode.supported(model):  # which also requires one of decode.MASKED_ATTENTION
        return None
    return model.config._attn_implementation


def _per_token(
    mb: Packed,
    states: torch.Tensor,
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """``fn(states [n, t, ...], targets [n, t]) -> [n, t, ...]`` applied to every completion
    token: [B, C, ...], padding past each completion's length. ``states`` [R, 1 + T, ...] are the
    logits, or the hidden states the head turns into logits, of each row's last prompt
    position and its completion input tokens. The first tokens come from their row's last
    prompt position, the others from where ``mb.index`` puts them."""
    dev = states.device
    t = mb.next_ids.shape[1]
    # One split, not slices: its backward writes every part's gradient into one tensor
    # (each slice's backward would allocate a zero tensor of the whole input's size).
    head, *parts = states.split(
        [1] + [min(POSITIONS_PER_CALL, t - a) for a in range(0, t, POSITIONS_PER_CALL)], dim=1
    )
    first = fn(head[:, 0][mb.row.to(dev)].unsqueeze(1), mb.targets[:, :1].to(dev))
    if t == 0:
        return first
    next_ids = mb.next_ids.to(dev).split(POSITIONS_PER_CALL, dim=1)
    rest = torch.cat([fn(x, y) for x, y in zip(parts, next_ids, strict=True)], dim=1)
    return torch.cat([first, rest.flatten(0, 1)[mb.index.to(dev)]], dim=1)


def _with_head(
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    head: Callable[[torch.Tensor], torch.Tensor] | None,
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``fn`` on logits -> the same on hidden states: the head applied first. With autograd
    on, the chunk's logits are not kept for backward but recomputed there (checkpoint)."""
    if head is None:
        return fn

    def run(x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return fn(head(x), targets)

    if not torch.is_grad_enabled():
        return run
    return lambda x, targets: torch.utils.checkpoint.checkpoint(
        run, x, targets, use_reentrant=False
    )


def _float32_linear(
    weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor
) -> torch.Tensor:
    """``x @ weight.T + bias`` in float32, outside any autocast."""
    with torch.autocast(device_type=x.device.type, enabled=False):
        return F.linear(x.float(), weight.float(), None if bias is None else bias.float())


@contextlib.contextmanager
def _float32_output(layer: torch.nn.Linear) -> Iterator[None]:
    """While it lasts, ``layer``'s output is computed again from its input in float32 and
    replaces the one autocast made (the model's own forward calls its head)."""
    handle = layer.register_forward_hook(
        lambda module, args, _out: _float32_linear(module.weight, module.bias, args[0])
    )
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def _checkpointing_off(model: torch.nn.Module) -> Iterator[None]:
    """Gradient checkpointing off in every module that has it on, back on after. The
    decision is taken in forward: a backward after the block is unchanged."""
    modules = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    for m in modules:
        m.gradient_checkpointing = False
    try:
        yield
    finally:
        for m in modules:
            m.gradient_checkpointing = True


def _never() -> bool:
    return False


class Trainer:
    """Owns the optimiser; turns a training set into ``ppo_epochs`` optimiser steps."""

    def __init__(
        self,
        policy: Policy,
        settings: TrainSection,
        max_new_tokens: int,
        temperature: float = 1.0,
        *,
        top_p: float = 1.0,
        top_k: int = 0,
    ) -> None:
        self.policy = policy
        self.settings = settings
        self.max_new_tokens = max_new_tokens
        # Log-probs of the distribution that was sampled (grpo.truncated_logits).
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        params = policy.trainable_parameters()
        if settings.optimizer_state == "bfloat16":
            self.optimizer: torch.optim.Optimizer = CompactAdam(
                params,
                lr=settings.lr,
                betas=settings.betas,
                weight_decay=settings.weight_decay,
                decoupled=settings.optimizer == "adamw",
            )
        else:
            opt_cls = torch.optim.AdamW if settings.optimizer == "adamw" else torch.optim.Adam
            # One fused kernel per parameter on CPU and CUDA: the same update as the default
            # loop, faster and without its per-parameter temporaries.
            fused = True if policy.device.type in FUSED_OPTIMIZER_DEVICES else None
            self.optimizer = opt_cls(
                params,
                lr=settings.lr,
                betas=settings.betas,
                weight_decay=settings.weight_decay,
                fused=fused,
            )
        self.params = params
        self.scaler = (
            torch.amp.GradScaler(policy.device.type) if policy.dtype == torch.float16 else None
        )
        self.changed = False  # whether the last ``step`` began changing the weights

    def _shared_prefix(self, samples: Sequence[Sample]) -> list[int]:
        """The first tokens every prompt of ``samples`` has in common (``common_prefix``)
        when computing them once saves work: more than one prompt row in all, block masks
        (``shared_attention``) and ``train.shared_prefix`` on. Else empty."""
        if not (self.settings.shared_prefix and shared_attention(self.policy.model)):
            return []
        prompts = {tuple(smp.prompt_ids) for smp in samples}
        if len(prompts) < 2 and len(samples) <= self.settings.micro_batch_size:
            return []  # one row: nothing computed twice
        return list(samples[0].prompt_ids[: common_prefix(list(prompts))])

    def _prefix(self, model: torch.nn.Module, ids: Sequence[int]) -> Prefix | None:
        """The keys and values of ``ids`` (the shared prefix) in every layer, with the
        graph to the weights when autograd is on. Gradient checkpointing stays off for
        this one short row: the decoder drops its cache under checkpointing."""
        if not ids:
            return None
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        dev = self.policy.device
        with _checkpointing_off(model), self.policy.autocast():
            out = base.get_decoder()(
                input_ids=torch.tensor([list(ids)], device=dev),
                position_ids=torch.arange(len(ids), device=dev)[None],
                use_cache=True,
            )
        cache = out.cache if hasattr(out, "cache") else out.past_key_values
        return Prefix([(layer.keys, layer.values) for layer in cache.layers])

    def _micro_batches(
        self, samples: Sequence[Sample], prefix: int = 0
    ) -> list[tuple[list[int], Packed]]:
        """Micro-batches with their sample indices: group by group, similar lengths
        together; ``prefix``: leading prompt tokens left to ``Prefix`` (see ``pack``)."""
        size = self.settings.micro_batch_size
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, s in enumerate(samples):
            groups.setdefault(tuple(s.prompt_ids), []).append(i)
        ordered = sorted(groups.values(), key=lambda idx: len(samples[idx[0]].prompt_ids))
        order = [
            i for idx in ordered for i in sorted(idx, key=lambda i: len(samples[i].completion_ids))
        ]
        chunks = [order[i : i + size] for i in range(0, len(order), size)]
        pad, attention = self.policy.tokenizer.pad_token_id, shared_attention(self.policy.model)
        return [
            (idx, pack([samples[i] for i in idx], pad, attention=attention, prefix=prefix))
            for idx in chunks
        ]

    def _logprobs(
        self,
        model: torch.nn.Module,
        mb: Packed,
        prefix: Prefix | None = None,
        *,
        entropy: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Log-probs [B, C] of the completion tokens; with ``entropy``, also their entropy."""
        warp = {"top_k": self.top_k, "top_p": self.top_p}
        states, head = self._states(model, mb, prefix)

        def logp(x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            out = grpo.token_logprobs(x, targets, self.temperature, **warp)
            if not entropy:
                return out
            ent = grpo.token_entropy(x.detach(), self.temperature, **warp)
            return torch.stack([out.float(), ent], dim=-1)

        both = _per_token(mb, states, _with_head(logp, head))
        return (both[..., 0], both[..., 1].detach()) if entropy else both

    def _states(
        self,
        model: torch.nn.Module,
        mb: Packed,
        prefix: Prefix | None = None,
        *,
        float32_head: bool = False,
    ) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor] | None]:
        """One forward pass over prompts and completions: [R, 1 + T, ...] at each row's last
        prompt position and its completion input tokens (see ``Packed``), and the head that
        turns them into logits. For ``PLAIN_HEAD_MODELS``, the decoder's last hidden
        states and the model's output layer; else the model's logits and None. ``prefix``:
        the shared prompt prefix the rows were packed without, read from its cache.
        ``float32_head``: the head (an ``nn.Linear``) computes float32 logits, whatever the
        compute dtype (``completion_ranks``)."""
        dev = self.policy.device
        keep = mb.next_ids.shape[1] + 1
        inputs = {
            "input_ids": mb.input_ids.to(dev),
            "attention_mask": mb.attention_mask.to(dev),
            "position_ids": mb.position_ids.to(dev),
            "use_cache": False,
        }
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        reading = contextlib.nullcontext() if prefix is None else prefix.read(model)
        chunked = getattr(base.config, "model_type", None) in PLAIN_HEAD_MODELS
        project = base.get_output_embeddings()
        float32_head = float32_head and type(project) is torch.nn.Linear
        if not (chunked and self.settings.chunked_head):  # the plain path
            exact = _float32_output(project) if float32_head else contextlib.nullcontext()
            with self.policy.autocast(), reading as cache, exact:
                return model(**inputs, cache=cache, logits_to_keep=keep).logits, None
        if float32_head:
            project = functools.partial(_float32_linear, project.weight.float(), project.bias)
        elif type(project) is torch.nn.Linear and project.weight.dtype != self.policy.dtype:
            # Autocast would copy the float32 head (the tied embedding: 28M weights for the
            # embedded model) to the compute dtype again for each chunk and each chunk's
            # recomputation, and cast each chunk's gradient back: copied once here, its
            # gradient is summed in that dtype and cast back once.
            weight = project.weight.to(self.policy.dtype)
            project = functools.partial(F.linear, weight=weight, bias=project.bias)

        def head(x: torch.Tensor) -> torch.Tensor:
            with self.policy.autocast():
                return project(x)  # _float32_linear leaves autocast itself

        with self.policy.autocast(), reading as cache:
            hidden = base.get_decoder()(**inputs, cache=cache).last_hidden_state
        return hidden[:, -keep:], head

    @torch.no_grad()
    def completion_logprobs(self, samples: Sequence[Sample]) -> list[list[float]]:
        """Each sample's completion-token log-probs under the current policy, in the
        distribution the node samples from (temperature, top-k, top-p); trains nothing."""
        out: list[list[float]] = [[] for _ in samples]
        for idx, mb in self._micro_batches(samples):
            logp = self._logprobs(self.policy.model, mb)
            for row, i in enumerate(idx):
                out[i] = logp[row, : len(samples[i].completion_ids)].float().tolist()
        return out

    @torch.no_grad()
    def completion_ranks(self, samples: Sequence[Sample]) -> list[list[int]]:
        """Each sample's completion tokens' ranks under the current policy, given the
        completion's own text before them: how many vocabulary tokens it finds likelier
        than the one written (0: its first choice). Temperature, top-k and top-p keep this
        order, so the rank needs no sampling settings; trains nothing. The head computes
        in float32: logits within the compute dtype's rounding step of each other (an
        eighth at 20 in bfloat16) would come out equal there, and a token just below the
        first choice would share its rank 0."""
        out: list[list[int]] = [[] for _ in samples]
        for idx, mb in self._micro_batches(samples):
            states, head = self._states(self.policy.model, mb, float32_head=True)
            ranks = _per_token(mb, states, _with_head(grpo.token_ranks, head))
            for row, i in enumerate(idx):
                out[i] = ranks[row, : len(samples[i].completion_ids)].tolist()
        return out

    def step(
        self,
        samples: Sequence[Sample],
        should_stop: Callable[[], bool] = lambda: False,
        *,
        batch_rows: int | None = None,
        batch_tokens: int | None = None,
    ) -> TrainStats | None:
        """Update the policy on ``samples``; a no-op for an empty list.

        ``batch_rows``/``batch_tokens``: completions and completion tokens of the round's
        whole batch (all I + J groups, with or without signal; ``samples`` are usually only
        those with signal); None: those of ``samples``. See ``grpo.loss_weights``.
        Returns None, with no step taken, if ``should_stop()`` turns true before the first
        step; once a step is taken the remaining epochs (``ppo_epochs``) run to the end, so
        a stop never leaves the weights part-way through a round. ``changed`` says, after
        an exception too, whether this call began changing the weights or the optimiser.
        """
        self.changed = False
        if not samples:
            return TrainStats()
        plan = self._plan(samples, batch_rows, batch_tokens)
        stats = TrainStats(sequences=sum(smp.copies for smp in samples), tokens=plan.tokens)
        model = self.policy.model
        try:
            for epoch in range(self.settings.ppo_epochs):
                sums = self._accumulate(plan, should_stop if epoch == 0 else _never)
                if sums is None:
                    return None
                self.changed = True
                norm = self._apply_gradients()
                stats.grad_norm = norm
                if math.isfinite(norm):
                    stats.steps += 1
                    stats.grad_norm_max = max(stats.grad_norm_max, norm)
                    clip = self.settings.grad_clip
                    stats.clipped_steps += int(0 < clip < norm)
                else:
                    stats.skipped_steps += 1
                stats.loss = sums.pop("loss")
                for key, value in sums.items():
                    setattr(stats, key, value / plan.total_weight)
        finally:
            self.optimizer.zero_grad(set_to_none=True)
            model.eval()
        return stats

    def gradients(
        self,
        samples: Sequence[Sample],
        *,
        batch_rows: int | None = None,
        batch_tokens: int | None = None,
    ) -> float:
        """One epoch's forward and backward, no step: the loss; gradients stay in ``.grad``."""
        self.optimizer.zero_grad(set_to_none=True)
        sums = self._accumulate(self._plan(samples, batch_rows, batch_tokens), lambda: False)
        self.policy.model.eval()
        assert sums is not None
        return sums["loss"]

    def _plan(
        self, samples: Sequence[Sample], batch_rows: int | None, batch_tokens: int | None
    ) -> _Plan:
        """Micro-batches, per-row loss weights and the reference log-probs of one update."""
        s = self.settings
        shared = self._shared_prefix(samples)
        batches = self._micro_batches(samples, len(shared))
        lengths = torch.tensor([len(smp.completion_ids) for smp in samples])
        copies = torch.tensor([smp.copies for smp in samples], dtype=torch.float32)
        scale = copies * torch.tensor([smp.weight for smp in samples], dtype=torch.float32)
        full_mask = (torch.arange(int(lengths.max()))[None, :] < lengths[:, None]).float()
        row_weight = grpo.loss_weights(
            full_mask,
            s.loss_norm,
            max_tokens=self.max_new_tokens,
            batch_rows=round(float(scale.sum())) if batch_rows is None else batch_rows,
            batch_tokens=round(float((lengths * scale).sum()))
            if batch_tokens is None
            else batch_tokens,
        )
        # Weights are constant along a sequence; a merged sample weighs as its copies,
        # a sampled one as the completions it stands for.
        row_weight = row_weight.max(dim=1).values * scale
        ref: list[torch.Tensor | None] = [None] * len(batches)
        if s.kl_coef > 0:
            with torch.no_grad(), self.policy.reference() as ref_model:
                ref_prefix = self._prefix(ref_model, shared)
                ref = [self._logprobs(ref_model, mb, ref_prefix) for _, mb in batches]
        return _Plan(
            batches=batches,
            prefix=shared,
            row_weight=row_weight,
            total_weight=max(float((row_weight * lengths).sum()), 1e-12),
            tokens=int((lengths * copies).sum()),
            ref=ref,
            old=[None] * len(batches),
        )

    def _accumulate(self, plan: _Plan, should_stop: Callable[[], bool]) -> dict[str, float] | None:
        """Forward and backward over every micro-batch; None (grads zeroed) on a stop.

        The first call records the old-policy log-probs in ``plan.old`` (detached).
        """
        s = self.settings
        dev = self.policy.device
        model = self.policy.model
        model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = dict.fromkeys(("loss", "clip_frac", "kl", "approx_kl", "entropy"), 0.0)
        prefix = self._prefix(model, plan.prefix)  # this epoch's weights
        for k, (idx, mb) in enumerate(plan.batches):
            if should_stop():
                self.optimizer.zero_grad(set_to_none=True)
                return None
            with self._checkpointing(mb):
                logp, ent = self._logprobs(model, mb, prefix, entropy=True)
            weights = (mb.mask * plan.row_weight[idx][:, None]).to(dev)
            if plan.old[k] is None:
                plan.old[k] = logp.detach()  # no step yet: these are the old policy's
            loss, info = grpo.clipped_surrogate(
                logp,
                plan.old[k],
                mb.advantages.to(dev),
                weights,
                eps_low=s.eps_low,
                eps_high=s.eps_high,
                ref_logp=plan.ref[k],
                kl_coef=s.kl_coef,
            )
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            share = float(weights.sum())
            sums["loss"] += float(loss.detach())
            sums["entropy"] += float(grpo.masked_mean(ent, weights)) * share
            for key in ("clip_frac", "kl", "approx_kl"):
                if key in info:
                    sums[key] += float(info[key]) * share
        if prefix is not None:
            prefix.backward()
        return sums

    def _checkpointing(self, mb: Packed) -> contextlib.AbstractContextManager:
        """Gradient checkpointing as the model was loaded, but off for a micro-batch of at
        most ``checkpoint_above_tokens`` tokens (unset: 768, or 0 with LoRA): its
        activations are small, and recomputing its layers in backward would make its step
        slower (docs/benchmarks.md, CPU paths)."""
        if mb.input_ids.numel() > self.settings.unchecked_tokens(self.policy.is_lora):
            return contextlib.nullcontext()
        return _checkpointing_off(self.policy.model)

    def _apply_gradients(self) -> float:
        """Unscale, clip and step; skip the step if the gradient norm is not finite."""
        s = self.settings
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        max_norm = s.grad_clip if s.grad_clip > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        if not math.isfinite(norm):
            log.warning("train.step_skipped", reason="non-finite gradient norm", grad_norm=norm)
            self.optimizer.zero_grad(set_to_none=True)
            if self.scaler:
                self.scaler.update()  # unscale_ recorded the inf: the scale backs off
            return norm
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        return norm
