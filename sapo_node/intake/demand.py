"""A round's mix of own and shared groups: how many to take from the swarm (J), and which
families this node needs most. Pure functions and one small state that a checkpoint keeps.

SAPO fixes I (own groups) and J (peers' groups) by hand, and the best ratio depended on
the swarm: the paper's 4/4 nearly doubled a lone node's reward, its 2/6 learned then
forgot. Here J is chosen each round between 0 and ``TrainSection.j_bound()`` (3 at the
default I + J = 4: one own group is always left to measure), I + J staying
``local_groups + external_groups``, from one thing this node observes for free about its
own recent rounds (``train.external_by``; ``fixed`` keeps J at ``external_groups``):

- ``signal``: the share of its own groups that had signal (rewards that differ; a group
  whose completions all scored alike gives GRPO nothing). A node whose own groups mostly
  have signal learns from itself and takes few; one whose own groups are mostly all-wrong
  (or, later, all-right) takes more from the swarm, whose groups the pool keeps only with
  signal under ``paper``, ``balanced`` and ``teaching``.
- ``format``: the share of its own finished completions with an answer between the tags
  (one cut at the token limit says nothing about the format). Every gain measured from
  peers' groups came early, while the nodes learned the answer format, and faded after
  (docs/experiment.md): a node takes from the swarm while it still misses the format and
  trains on its own groups once it has it.
- ``skill``: this node's moving mean reward at the level each family is at now (its
  curriculum's), from no skill until its own groups show some. The format rule stops
  listening once the format is learnt, for good; this one listens again whenever the
  curriculum moves a family up, where the node cannot yet do the tasks, and the draw
  prefers peers' groups at those levels (``preferred``).

J may rise by at most ``MAX_RISE`` a round, so no run of rounds (or peer shaping them) can
swing it from 0 to its bound at once; it may fall at any speed. A node alone, or with
nothing pooled, takes nothing and makes I + J groups of its own: the same round as J = 0.

Measured, pre-registered: with ``answer_only`` on, adaptive J by signal did no better than
nodes alone, and leaned worse (docs/results/teaching-cpu/): its premise, that the swarm
teaches most when own groups lack signal, fails when a peer's group teaches only its
answer; that run also let J take every slot, so a node with no own group never measured
its rate again and kept J at its bound. By format, with ``teach_first_choices`` and 2
completions of each peer's group, it beat both nodes alone and a fixed 2/2
(docs/results/families-confirm-cpu/): the default. ``skill`` is not measured yet.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SMOOTHING = 0.2  # weight of the newest round in each moving average
MIN_NEED = 0.05  # a family this node always solves still gets some weight
MAX_RISE = 1  # the most J may grow from one round to the next
HALF_TOLERANCE = 1e-9

RATE_NAMES = {
    "signal": "own groups with signal",
    "format": "own finished completions in the answer format",
    "skill": "own reward at the current levels",
}


def j_from_rate(most: int, rate: float) -> int:
    """``most`` x (1 - ``rate``) rounded half up, within 0..``most``: each J holds the
    same width of rates, bar the two ends (Python's ``round`` sends halves to the even
    neighbour, so bands would alternate between open and closed ends).

    >>> [j_from_rate(4, r) for r in (0.0, 0.125, 0.375, 0.625, 0.875, 1.0)]
    [4, 4, 3, 2, 1, 0]
    >>> round(4 * (1 - 0.375)), round(4 * (1 - 0.625))  # half to even: 2 and 2
    (2, 2)
    """
    # A half computed from a float rate may land a hair below it: that is still a half.
    return max(0, min(most, math.floor(most * (1.0 - rate) + 0.5 + HALF_TOLERANCE)))


def choose_external(
    configured: int,
    most: int | None,
    own_rate: float | None,
    pooled: int,
    what: str = RATE_NAMES["signal"],
    previous: int | None = None,
) -> tuple[int, str]:
    """J for this round, and why: the more of ``most`` the lower ``own_rate``, and at most
    ``MAX_RISE`` above ``previous`` (the J the rule chose last, None if none).

    ``configured``: ``train.external_groups``; ``most``: ``TrainSection.j_bound()`` (None:
    J is fixed); ``own_rate``: the moving rate ``train.external_by`` reads (None before
    the first round), named by ``what`` in the reason; ``pooled``: groups waiting in the
    pool.

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
    >>> choose_external(2, 4, 0.0, 10, previous=1)
    (2, 'own groups with signal 0.00: J 4 of at most 4; J 2, rising by at most 1 a round')
    """
    if most is None:
        return configured, "fixed"
    if pooled == 0:
        return 0, "nothing pooled"
    if own_rate is None:
        j, why = min(configured, most), "no own round yet: J as configured"
    else:
        j = j_from_rate(most, own_rate)
        why = f"{what} {own_rate:.2f}: J {j} of at most {most}"
    if previous is not None and j > previous + MAX_RISE:
        j = previous + MAX_RISE
        why += f"; J {j}, rising by at most {MAX_RISE} a round"
    return j, why


def moving(previous: float | None, value: float, weight: float = SMOOTHING) -> float:
    """An exponential moving average; the first value starts it.

    >>> moving(None, 0.5)
    0.5
    >>> round(moving(0.5, 1.0, 0.2), 3)
    0.6
    """
    return value if previous is None else (1.0 - weight) * previous + weight * value


def skill_at(
    skill: Mapping[tuple[str, int], float],
    levels: Mapping[str, int],
    weights: Mapping[str, float],
) -> float:
    """This node's skill now: its moving mean reward at each family's current level,
    averaged by the families' weights; a level it has no evidence of counts as no skill.

    >>> skill_at({("a", 0): 0.9, ("b", 2): 0.5}, {"a": 0, "b": 2}, {"a": 1.0, "b": 1.0})
    0.7
    >>> skill_at({("a", 0): 0.9}, {"a": 1}, {"a": 1.0})  # moved up: nothing shown there yet
    0.0
    """
    total = sum(weights.get(f, 0.0) for f in levels)
    if total <= 0:
        return 0.0
    return sum(weights.get(f, 0.0) * skill.get((f, lv), 0.0) for f, lv in levels.items()) / total


def formatted_share(flags: Iterable[tuple[bool, bool]]) -> float | None:
    """The share in the answer format among finished completions, from (finished, in the
    format) pairs; None if none finished. A completion cut at the token limit may be on its
    way to a right answer: counting it as out of format would keep J high on a family whose
    answers run long (and a peer that lengthens them could raise it).

    >>> formatted_share([(True, True), (True, False), (False, False)])
    0.5
    >>> formatted_share([(False, True)]) is None
    True
    """
    done = [fmt for finished, fmt in flags if finished]
    return sum(done) / len(done) if done else None


@dataclass
class OwnGroupStats:
    """What this node has seen of its own groups: the moving share with signal, the
    moving share of finished completions in the answer format, the moving mean reward per
    family and per (family, level) (``skill``), and the J its rule chose last. Kept in the
    checkpoint's state."""

    signal_rate: float | None = None
    format_rate: float | None = None
    family_reward: dict[str, float] = field(default_factory=dict)
    skill: dict[tuple[str, int], float] = field(default_factory=dict)
    last_j: int | None = None

    def observe(
        self,
        groups: Iterable[tuple[str, Sequence[float]]],
        format_rate: float | None = None,
        levels: Mapping[str, int] | None = None,
    ) -> None:
        """One round's own groups, as (family, rewards), the share of their finished
        completions with an answer between the tags (None: none finished), and the level
        each family was at (``levels``; the groups were set at it)."""
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
            if levels is not None and family in levels:
                # From no skill: a level is only learnt once the node's own groups show it.
                key = (family, levels[family])
                self.skill[key] = moving(self.skill.get(key, 0.0), mean)

    def chose(self, j: int, pooled: int) -> None:
        """The J a round took, with ``pooled`` groups waiting: the next round's J rises
        from it. A round with nothing pooled chose nothing."""
        if pooled:
            self.last_j = j

    def need(self) -> dict[str, float]:
        """Per family: 1 minus the moving mean reward, at least ``MIN_NEED``. A family
        not in it has not been tried here: ``Pool.sample`` gives it 1.

        >>> m = OwnGroupStats()
        >>> m.observe([("sums", [1.0, 1.0]), ("primes", [0.0, 1.0])])
        >>> m.need()
        {'sums': 0.05, 'primes': 0.5}
        """
        return {f: max(MIN_NEED, 1.0 - r) for f, r in self.family_reward.items()}

    def own_rate(
        self,
        by: str,
        levels: Mapping[str, int] | None = None,
        weights: Mapping[str, float] | None = None,
    ) -> tuple[float | None, str]:
        """The moving rate that chooses J (``train.external_by``), and its name; ``skill``
        reads the families' current ``levels`` and their ``weights``."""
        if by == "format":
            return self.format_rate, RATE_NAMES["format"]
        if by == "skill":
            return skill_at(self.skill, levels or {}, weights or {}), RATE_NAMES["skill"]
        return self.signal_rate, RATE_NAMES["signal"]

    def state_dict(self) -> dict[str, Any]:
        return {
            "signal_rate": self.signal_rate,
            "format_rate": self.format_rate,
            "family_reward": dict(self.family_reward),
            "skill": [[f, lv, v] for (f, lv), v in sorted(self.skill.items())],
            "last_j": self.last_j,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rate, fmt = state.get("signal_rate"), state.get("format_rate")
        self.signal_rate = None if rate is None else float(rate)
        self.format_rate = None if fmt is None else float(fmt)
        self.family_reward = {str(k): float(v) for k, v in state.get("family_reward", {}).items()}
        self.skill = {(str(f), int(lv)): float(v) for f, lv, v in state.get("skill", [])}
        last = state.get("last_j")
        self.last_j = None if last is None else int(last)
