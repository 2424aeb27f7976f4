"""Where a node keeps the rollout groups its peers shared, and how it draws J of them.

A group enters the pool only after the node has regenerated its task and scored every
completion with its own verifier (``Node.receive``); the pool keeps those rewards and
never a sender's. Sampling policies:

- ``paper``: drop groups whose completions all scored the same (no GRPO signal),
  then draw uniformly, as in the paper's controlled experiment;
- ``uniform``: draw from every group, as the open demo did.

This in-memory pool is bounded in groups and forgets the oldest first; the swarm adds
persistence, per-author quotas and expiry behind the same ``Pool`` interface.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from sapo_node.tasks import TaskRef

# Most completions a shared group may carry (the largest L a node can be configured with).
MAX_COMPLETIONS = 64


@dataclass(frozen=True)
class SharedGroup:
    """One task and its completions, as text, the way a peer shares it."""

    ref: TaskRef
    question: str
    completions: tuple[str, ...]
    author: str
    model: str = ""
    round: int = 0


@dataclass(frozen=True)
class PooledGroup:
    """A shared group with the rewards this node's own verifier gave it."""

    group: SharedGroup
    rewards: tuple[float, ...]

    @property
    def has_signal(self) -> bool:
        return len(set(self.rewards)) > 1


class Pool(Protocol):
    """What the round loop needs from a pool."""

    def add(self, item: PooledGroup) -> None: ...

    def sample(self, count: int, rng: random.Random) -> list[PooledGroup]: ...

    def __len__(self) -> int: ...


class MemoryPool:
    """A bounded in-memory pool; sampling takes groups out (each is trained on once)."""

    def __init__(self, max_groups: int = 4096, sampling: str = "paper") -> None:
        if sampling not in ("paper", "uniform"):
            raise ValueError(f"unknown sampling policy {sampling!r}")
        self.sampling = sampling
        self._items: deque[PooledGroup] = deque(maxlen=max_groups)

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: PooledGroup) -> None:
        self._items.append(item)

    def sample(self, count: int, rng: random.Random) -> list[PooledGroup]:
        if count <= 0:
            return []
        candidates = [
            i for i, it in enumerate(self._items) if self.sampling == "uniform" or it.has_signal
        ]
        chosen = sorted(rng.sample(candidates, min(count, len(candidates))), reverse=True)
        out = [self._items[i] for i in chosen]
        for i in chosen:
            del self._items[i]
        return out
