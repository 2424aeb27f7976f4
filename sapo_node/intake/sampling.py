"""How a round picks peers' groups from the pool: the candidates and the sampling
policies, pure functions of them behind one signature (``SamplingPolicy``):

- ``paper``: drop groups whose completions all scored the same under this node's own
  verifier (zero advantage: no gradient), then draw uniformly, as in the paper;
- ``uniform``: draw from every group, as the open demo did;
- ``balanced``: groups with signal only, spread across authors and families, and
  favouring mixed rewards. See ``sample_balanced`` for why it should do better;
- ``teaching``: groups with signal only, spread across authors, and within an author
  weighted by how much a group can teach this node: its reward variance times this
  node's own recent failure rate on the group's family (``Candidate.need``, given by
  the round: ``Pool.sample(need=)``). See ``sample_teaching``.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    """What a sampling policy sees of a pooled group."""

    key: int
    author: str
    family: str
    spread: float | None  # population std of the rewards; 0: no GRPO signal; None: unscored
    received: float
    need: float = 1.0  # this node's recent failure rate on the family (``sample_teaching``)
    config: str = ""  # the task's canonical config: which level of its family

    @property
    def has_signal(self) -> bool:
        return self.spread is not None and self.spread > 0.0


SamplingPolicy = Callable[[Sequence[Candidate], int, random.Random], list[int]]


def reward_spread(rewards: Sequence[float]) -> float:
    """Population standard deviation of a group's rewards.

    >>> reward_spread([1.0, 0.0])
    0.5
    >>> reward_spread([1.0, 1.0, 1.0])
    0.0
    """
    mean = sum(rewards) / len(rewards)
    return math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))


def sample_uniform(cands: Sequence[Candidate], count: int, rng: random.Random) -> list[int]:
    """Any ``count`` groups, uniformly (the open demo)."""
    return [c.key for c in rng.sample(list(cands), min(count, len(cands)))]


def sample_paper(cands: Sequence[Candidate], count: int, rng: random.Random) -> list[int]:
    """Uniformly among groups whose rewards differ (the paper's controlled experiment)."""
    return sample_uniform([c for c in cands if c.has_signal], count, rng)


def sample_balanced(cands: Sequence[Candidate], count: int, rng: random.Random) -> list[int]:
    """Groups with signal, one author at a time, new families first, mixed rewards favoured.

    Why it should beat ``paper``:
    - Diversity is SAPO's lever: the paper's gain comes from experiences the node would
      not have produced itself. Uniform sampling gives a peer a share of the J slots
      proportional to what it published, so one fast or prolific peer (or one flooding
      within its quota) crowds out the rest. Here each pick goes to the author picked
      least so far, then to the family picked least so far.
    - A binary-reward group of L completions has advantage variance proportional to
      p(1 - p): a 4-of-8 group moves the policy more than a 1-of-8 one. Within the
      chosen author and family, groups are drawn with weight equal to their reward
      spread, so mixed groups are favoured without starving the others.
    Measured (``scripts/bench_pool.py``, docs/benchmarks.md): with one author publishing
    90% of the groups, a draw of 4 covers 4.0 authors against paper's 1.39; the spread
    preference changes little (0.432 against 0.429), as most picks are single groups.
    """
    family_picks: Counter[str] = Counter()

    def pick(groups: list[Candidate]) -> Candidate:
        fewest = min(family_picks[c.family] for c in groups)
        options = [c for c in groups if family_picks[c.family] == fewest]
        chosen = rng.choices(options, weights=[c.spread for c in options])[0]
        family_picks[chosen.family] += 1
        return chosen

    return _in_turns(cands, count, rng, pick)


def _in_turns(
    cands: Sequence[Candidate],
    count: int,
    rng: random.Random,
    pick: Callable[[list[Candidate]], Candidate],
) -> list[int]:
    """Up to ``count`` groups with signal, authors in turns: each pick goes to an author
    picked least so far (ties at random), and ``pick`` chooses among its groups."""
    by_author: dict[str, list[Candidate]] = {}
    for c in cands:
        if c.has_signal:
            by_author.setdefault(c.author, []).append(c)
    picks: list[int] = []
    author_picks: Counter[str] = Counter()
    while len(picks) < count and by_author:
        least = min(author_picks[a] for a in by_author)
        author = rng.choice(sorted(a for a in by_author if author_picks[a] == least))
        groups = by_author[author]
        chosen = pick(groups)
        picks.append(chosen.key)
        author_picks[author] += 1
        groups.remove(chosen)
        if not groups:
            del by_author[author]
    return picks


def sample_teaching(cands: Sequence[Candidate], count: int, rng: random.Random) -> list[int]:
    """Groups with signal, one author at a time, each drawn with weight ``spread**2 *
    need``: what can teach this node most, without letting any author decide what it is.

    Why these weights:
    - GRPO's update from a group is its advantages times the completions' gradients; the
      advantages' variance is the rewards' variance (``spread**2``; p(1 - p) for 0/1
      rewards): a 4-of-8 group carries about twice the signal of a 1-of-8 one and an
      all-same group none (the paper's filter, and DAPO's dynamic sampling, drop those).
    - ``need`` is 1 minus this node's own recent mean reward on the group's family
      (floored; 1 for a family it has not tried): a peer's solved group on a task where
      this node fails is an experience its own sampling rarely produces, which is SAPO's
      stated lever ("aha moments" spread from nodes that found them). Tasks it already
      solves teach little more: their own groups already carry that signal.
    - Authors take turns, as in ``balanced``: each pick goes to an author picked least so
      far. The weights are this node's own (its verifier's rewards, its own failure
      rates), but a peer can still aim at them: copy half of a task's right answers
      into a group on this node's weakest family and every such group weighs the most.
      Turns cap what a hostile peer gains from that at its share of the authors (the
      per-peer cap and the suspects' joint cap apply on top, ``Pool.sample``).
    Cheap: no forward pass, one weighted draw per pick over the chosen author's groups.
    Measured against ``paper`` (docs/results/teaching-cpu/, pre-registered, one family, so
    ``need`` was equal for every group): no detectable difference. Not the default.
    """
    return _in_turns(
        cands,
        count,
        rng,
        lambda groups: rng.choices(groups, weights=[c.spread**2 * c.need for c in groups])[0],
    )


POLICIES: dict[str, SamplingPolicy] = {
    "paper": sample_paper,
    "uniform": sample_uniform,
    "balanced": sample_balanced,
    "teaching": sample_teaching,
}
