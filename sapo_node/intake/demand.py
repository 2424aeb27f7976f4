"""A round's mix of own and shared groups: how many to take from the swarm (J), and which
families this node needs most. Pure functions and one small state that a checkpoint keeps.

SAPO fixes I (own groups) and J (peers' groups) by hand, and the best ratio depended on
the swarm: the paper's 4/4 nearly doubled a lone node's reward, its 2/6 learned then
forgot. Here J is chosen each round between 0 and ``TrainSection.j_bound()`` (3 at the
default I + J = 4), I + J staying ``local_groups + external_groups``, from one thing this
node observes for free about its own recent rounds (``train.external_by``; ``fixed``
keeps J at ``external_groups``):

- ``signal``: the share of its own groups that had signal (rewards that differ; a group
  whose completions all scored alike gives GRPO nothing). A node whose own groups mostly
  have signal learns from itself and takes few; one whose own groups are mostly all-wrong
  (or, later, all-right) takes more from the swarm, whose groups the pool keeps only with
  signal under ``paper``, ``balanced`` and ``teaching``.
- ``format``: the share of its own completions with an answer between the tags. Every
  gain measured from peers' groups came early, while the nodes learned the answer format,
  and faded after (docs/experiment.md): a node takes from the swarm while it still misses
  the format and trains on its own groups once it has it.

A node alone, or with nothing pooled, takes nothing and makes I + J groups of its own: the
same round as J = 0.

Measured, pre-registered: with ``answer_only`` on, adaptive J by signal did no better than
nodes alone, and leaned worse (docs/results/teaching-cpu/): its premise, that the swarm
teaches most when own groups lack signal, fails when a peer's group teaches only its
answer. By format, with ``teach_first_choices`` and 2 completions of each peer's group,
it beat both nodes alone and a fixed 2/2 (docs/results/families-confirm-cpu/): the
default.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

SMOOTHING = 0.2  # weight of the newest round in each moving average
MIN_NEED = 0.05  # a family this node always solves still gets some weight


def choose_external(
    configured: int,
    most: int | None,
    own_rate: float | None,
    pooled: int,
    what: str = "own groups with signal",
) -> tuple[int, str]:
    """J for this round, and why: the more of ``most`` the lower ``own_rate``.

    ``configured``: ``train.external_groups``; ``most``: ``TrainSection.j_bound()`` (None:
    J is fixed); ``own_rate``: the moving share of own groups with signal, or of own
    completions in the answer format (``train.external_by``; None before the first round),
    named by ``what`` in the reason; ``pooled``: groups waiting in the pool.

    >>> choose_external(2, None, 0.9, 10)
    (2, 'fixed')
    >>> choose_external(2, 4, 0.25, 0)
    (0, 'nothing pooled')
    >>> choose_external(2, 4, None, 10)
    (2, 'no own round yet: J as configured')
    >>> choose_external(2, 4, 0.25, 10)
    (3, 'own groups with signal 0.25: J 3 of at most 4')
    >>> choose_external(2, 4, 1.0, 10)
    (0, 'own groups with signal 1.00: J 0 of at most 4')
    >>> choose_external(2, 4, 0.6, 10, "own completions in the answer format")
    (2, 'own completions in the answer format 0.60: J 2 of at most 4')
    """
    if most is None:
        return configured, "fixed"
    if pooled == 0:
        return 0, "nothing pooled"
    if own_rate is None:
        return min(configured, most), "no own round yet: J as configured"
    j = max(0, min(most, round(most * (1.0 - own_rate))))
    return j, f"{what} {own_rate:.2f}: J {j} of at most {most}"


def moving(previous: float | None, value: float, weight: float = SMOOTHING) -> float:
    """An exponential moving average; the first value starts it.

    >>> moving(None, 0.5)
    0.5
    >>> round(moving(0.5, 1.0, 0.2), 3)
    0.6
    """
    return value if previous is None else (1.0 - weight) * previous + weight * value


@dataclass
class Mix:
    """What this node has seen of its own groups: the moving share with signal, the
    moving share of completions in the answer format, and the moving mean reward per
    family. Kept in the checkpoint's state."""

    signal_rate: float | None = None
    format_rate: float | None = None
    family_reward: dict[str, float] = field(default_factory=dict)

    def observe(
        self, groups: Iterable[tuple[str, Sequence[float]]], format_rate: float | None = None
    ) -> None:
        """One round's own groups, as (family, rewards), and the share of their
        completions with an answer between the tags."""
        groups = list(groups)
        if not groups:
            return
        with_signal = sum(len(set(rewards)) > 1 for _, rewards in groups)
        self.signal_rate = moving(self.signal_rate, with_signal / len(groups))
        if format_rate is not None:
            self.format_rate = moving(self.format_rate, format_rate)
        by_family: dict[str, list[float]] = {}
        for family, rewards in groups:
            by_family.setdefault(family, []).extend(rewards)
        for family, rewards in by_family.items():
            mean = sum(rewards) / len(rewards)
            self.family_reward[family] = moving(self.family_reward.get(family), mean)

    def need(self) -> dict[str, float]:
        """Per family: 1 minus the moving mean reward, at least ``MIN_NEED``. A family
        not in it has not been tried here: ``Pool.sample`` gives it 1.

        >>> m = Mix()
        >>> m.observe([("sums", [1.0, 1.0]), ("primes", [0.0, 1.0])])
        >>> m.need()
        {'sums': 0.05, 'primes': 0.5}
        """
        return {f: max(MIN_NEED, 1.0 - r) for f, r in self.family_reward.items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "signal_rate": self.signal_rate,
            "format_rate": self.format_rate,
            "family_reward": dict(self.family_reward),
        }

    def own_rate(self, by: str) -> tuple[float | None, str]:
        """The moving rate that chooses J (``train.external_by``), and its name."""
        if by == "format":
            return self.format_rate, "own completions in the answer format"
        return self.signal_rate, "own groups with signal"

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rate, fmt = state.get("signal_rate"), state.get("format_rate")
        self.signal_rate = None if rate is None else float(rate)
        self.format_rate = None if fmt is None else float(fmt)
        self.family_reward = {str(k): float(v) for k, v in state.get("family_reward", {}).items()}
