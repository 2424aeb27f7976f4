"""The prompt tokens every prompt of a training step starts with (the system prompt and the
worked example), computed once for the step instead of in every row: how many there are
(``common_prefix``), their keys and values put before each row's (``PrefixLayer``), and
their gradient sent back once (``Prefix``). The trainer uses them when
``train.shared_prefix`` is on (``Trainer._prefix``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from transformers.cache_utils import Cache, DynamicLayer


def common_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """How many first tokens every prompt has in common, short of each prompt's last
    (whose logit predicts its completions' first tokens, so it stays in its row).

    >>> common_prefix([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]])
    2
    >>> common_prefix([[1, 2, 3], [1, 2, 3]])
    2
    """
    if not prompts:
        return 0
    shortest = min(len(p) for p in prompts) - 1
    first = prompts[0]
    n = 0
    while n < shortest and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


class PrefixLayer(DynamicLayer):
    """One layer's keys and values of the shared prompt prefix, put before those of each
    micro-batch row. Read only: ``update`` returns the prefix and the row's keys and
    values together and stores nothing, so a layer recomputed in backward (gradient
    checkpointing) reads the same, and one prefix serves every micro-batch."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, reads: list[int]) -> None:
        super().__init__()
        self.keys, self.values = keys, values
        self.device = keys.device
        self.is_initialized = True
        self._reads = reads

    def update(self, key_states, value_states, *args, **kwargs):
        self._reads[0] += 1
        rows = (key_states.shape[0], -1, -1, -1)
        return (
            torch.cat([self.keys.expand(rows), key_states], dim=-2),
            torch.cat([self.values.expand(rows), value_states], dim=-2),
        )

    def get_seq_length(self) -> int:
        return self.keys.shape[-2]


class Prefix:
    """The prompt tokens that every prompt of a step starts with (the system prompt and
    worked example), computed once for all of its micro-batches (``Trainer._prefix``).

    With autograd on, each micro-batch reads detached copies (``leaves``) whose gradients
    add up over the micro-batches; ``backward`` then sends their sum once through the
    prefix's forward pass. The gradient is the one of computing the prefix in every row,
    summed, and the prefix's activations are computed and kept once."""

    def __init__(self, keys_values: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.computed = keys_values
        grad = torch.is_grad_enabled() and keys_values[0][0].requires_grad
        self.leaves = [
            tuple(t.detach().requires_grad_(True) for t in kv) if grad else kv for kv in keys_values
        ]
        self.length = keys_values[0][0].shape[-2]
        self.reads = [0]

    @contextlib.contextmanager
    def read(self, model: torch.nn.Module) -> Iterator[Cache]:
        """A cache for one forward pass of ``model`` over rows packed without the prefix;
        after it, a check that every layer read it. Decoder layers keep the cache they are
        given under gradient checkpointing while in here: they drop it otherwise, since a
        layer that writes to its cache would write twice when recomputed in backward, and
        ``PrefixLayer`` only reads. A model that still dropped it would have computed the
        rows without their prompts' start: that is an error, never a step."""
        layers = [m for m in model.modules() if hasattr(type(m), "_can_checkpoint_with_cache")]
        before = [m.__dict__.get("_can_checkpoint_with_cache") for m in layers]
        for m in layers:
            m._can_checkpoint_with_cache = True
        start = self.reads[0]
        failure: BaseException | None = None
        try:
            yield Cache(layers=[PrefixLayer(k, v, self.reads) for k, v in self.leaves])
        except Exception as exc:  # the dropped prefix's masks do not fit: say why
            failure = exc
        finally:
            for m, b in zip(layers, before, strict=True):
                if b is None:
                    del m._can_checkpoint_with_cache
                else:
                    m._can_checkpoint_with_cache = b
        read = self.reads[0] - start
        if read != len(self.leaves):
            raise RuntimeError(
                f"the shared prompt prefix was read by {read} of {len(self.leaves)} layers; "
                "set train.shared_prefix = false for this model"
            ) from failure
        if failure is not None:
            raise failure

    def backward(self) -> None:
        """The gradients the micro-batches left on the leaves, through the prefix."""
        pairs = [
            (t, leaf.grad)
            for kv, leaves in zip(self.computed, self.leaves, strict=True)
            for t, leaf in zip(kv, leaves, strict=True)
            if leaf.grad is not None
        ]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
