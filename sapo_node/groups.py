"""A round's groups and what of them trains: a task with its completions and this node's
rewards (:class:`Group`), and the GRPO samples of those with signal (:func:`training_set`,
advantages from grpo.py), normalised over the whole round's batch (:class:`TrainingSet`).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from sapo_node.intake.pool import PooledGroup
from sapo_node.samples import Sample
from sapo_node.tasks import Task
from sapo_node.train import grpo


@dataclass
class Group:
    """One task with its completions (as this node trains them) and this node's rewards.

    ``finished[i]``: completion ``i`` ended with the model's end of turn, not at a limit.
    ``pooled``: for a peer's group, the pool's entry it came from (when it was made and
    when it arrived).
    """

    task: Task
    prompt_ids: list[int]
    completion_ids: list[list[int]]
    texts: list[str]
    finished: list[bool]
    rewards: list[float] = field(default_factory=list)
    origin: str = "local"
    pooled: PooledGroup | None = None
    taught: list[tuple[bool, ...]] | None = None  # per completion (samples.Sample.taught)

    @property
    def has_signal(self) -> bool:
        """Whether the rewards differ, i.e. GRPO gets a gradient from this group."""
        return len(set(self.rewards)) > 1

    def outcome(self, correct_threshold: float) -> str:
        """What the group gives GRPO: "signal" if its rewards differ (``has_signal``); else
        "all_right" if they all count as correct (reward >= ``tasks.correct_threshold``: 1
        with binary rewards), else "all_wrong" (with binary rewards, all 0). Every group
        has exactly one of the three."""
        if self.has_signal:
            return "signal"
        right = bool(self.rewards) and self.rewards[0] >= correct_threshold
        return "all_right" if right else "all_wrong"


@dataclass(frozen=True)
class TrainingSet:
    """A round's GRPO samples and the size of the whole batch they come from.

    Groups without signal have zero advantage and are not passed to the trainer (they
    would cost a forward and backward pass for no gradient), but the loss is normalised
    over the whole round's batch, all I + J groups, as GRPO implementations do: a step's
    scale must not depend on how many groups happened to carry signal.
    """

    samples: list[Sample]
    batch_rows: int
    batch_tokens: int


def taught_flags(g: Group) -> list[tuple[bool, ...]]:
    """Which tokens of each completion of ``g`` train (``Group.taught``; None: all)."""
    return g.taught or [(True,) * len(ids) for ids in g.completion_ids]


def stratified(rewards: Sequence[float], k: int, rng: random.Random) -> dict[int, float]:
    """At most ``k`` of a group's completions, by index, each with the number of
    completions it stands for: every distinct reward keeps ``a >= 1`` of its ``n``
    completions, drawn at random and weighted ``n / a``; the rest of ``k`` goes to the
    rewards by how many completions have them. Completions of one reward share one
    advantage, so the weighted sample's gradient is the whole group's in expectation,
    before clipping: a clipped step (train.grad_clip) is not the clip of that expectation,
    and one completion weighted up to n - 1 can set the gradient's norm.
    Fewer than ``k`` completions: all, weight 1. More rewards than ``k`` (partial rewards):
    ``k`` completions at random, each weighted ``len(rewards) / k``."""
    n = len(rewards)
    if n <= k:
        return dict.fromkeys(range(n), 1.0)
    levels: dict[float, list[int]] = {}
    for i, r in enumerate(rewards):
        levels.setdefault(r, []).append(i)
    if len(levels) > k:
        return dict.fromkeys(sorted(rng.sample(range(n), k)), n / k)
    members = [levels[r] for r in sorted(levels)]
    take = [1] * len(members)
    # The rest by largest remainder of each reward's share of k, capped at its size.
    while sum(take) < k:
        room = [j for j, m in enumerate(members) if take[j] < len(m)]
        j = max(room, key=lambda j: (k * len(members[j]) / n - take[j], -j))
        take[j] += 1
    return {i: len(m) / a for m, a in zip(members, take, strict=True) for i in rng.sample(m, a)}


def training_set(
    groups: Sequence[Group],
    scale: str,
    *,
    external_completions: int = 0,
    rng: random.Random | None = None,
) -> TrainingSet:
    """GRPO samples of every group with signal, with group-normalised advantages. A group's
    identical completions (same tokens, advantage and taught flags) become one sample with
    ``copies``: the same gradient for one forward and backward (small models at a short
    budget often write the same right answer several times in a group).

    ``external_completions`` > 0: of a peer's group (origin not "local"), only a
    :func:`stratified` sample of that many completions trains (``rng`` draws it), each
    with the ``weight`` of the completions it stands for; advantages come from the whole
    group's rewards."""
    samples = []
    for g in groups:
        if not g.has_signal:
            continue
        rewards = torch.tensor([g.rewards], dtype=torch.float32)
        adv = grpo.group_advantages(rewards, scale=scale)[0].tolist()
        taught = g.taught or [None] * len(g.completion_ids)
        weights = dict.fromkeys(range(len(g.completion_ids)), 1.0)
        if external_completions and g.origin != "local":
            weights = stratified(g.rewards, external_completions, rng or random.Random(0))
        copies = Counter(
            (tuple(g.completion_ids[i]), adv[i], taught[i], w) for i, w in weights.items()
        )
        samples += [
            Sample(g.prompt_ids, list(ids), a, flags, copies=c, weight=w)
            for (ids, a, flags, w), c in copies.items()
            if flags is None or any(flags)  # one that teaches nothing costs a pass for naught
        ]
    return TrainingSet(
        samples,
        batch_rows=sum(len(g.completion_ids) for g in groups),
        batch_tokens=sum(len(ids) for g in groups for ids in g.completion_ids),
    )
