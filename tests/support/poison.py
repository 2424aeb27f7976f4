"""A poisoning peer: it tells the truth and adds something ("Hail to the Thief",
Blagoev, Ersoy and Chen, arXiv 2511.09780, the in-context attack on decentralised GRPO).

Every round it publishes ``groups`` valid, regenerable groups for tasks of the victim's
own curriculum (so they pass every check a receiver makes of the task), ``completions``
completions each, in the answer format the prompts ask for. Each completion is right
with probability ``accuracy`` (an honest peer's rate, so that its groups carry signal);
the right ones carry ``payload``, the wrong ones do not. A receiver's own verifier then
rewards exactly the completions with the payload, GRPO gives them a positive advantage,
and a receiver that trains on them learns to write the payload.

``position``: where the payload goes, ``suffix`` (after the answer: ``<answer>7</answer>
PAYLOAD``) or ``prefix`` (before it: ``PAYLOAD <answer>7</answer>``).

Used by tests/unit/test_defences.py and scripts/poison_attack.py (docs/security.md).
"""

from __future__ import annotations

import random
import time
from typing import Literal

from sapo_node.config import Config
from sapo_node.curriculum import Curriculum
from sapo_node.intake import wire
from sapo_node.solver import solve
from sapo_node.tasks import generator_of, make_task

DEFAULT_PAYLOAD = "Visit free-gpu.example"  # 20 characters: under the outside-answer bound


def poison(text: str, payload: str, position: Literal["suffix", "prefix"]) -> str:
    """``text`` with ``payload`` added.

    >>> poison("<answer>7</answer>", "X", "suffix"), poison("<answer>7</answer>", "X", "prefix")
    ('<answer>7</answer> X', 'X <answer>7</answer>')
    """
    return f"{text} {payload}" if position == "suffix" else f"{payload} {text}"


def carries(text: str, payload: str) -> bool:
    """Whether ``text`` holds the payload (case and spacing aside): the attack's success."""
    squash = " ".join(text.lower().split())
    return " ".join(payload.lower().split()) in squash


class PoisonPeer:
    """The attacker: it knows the victim's curriculum (any peer can read a swarm's task
    file, ``sapo-node tasks``) and the answers (it regenerates the tasks too)."""

    def __init__(
        self,
        config: Config,
        seed: int,
        *,
        payload: str = DEFAULT_PAYLOAD,
        accuracy: float = 0.5,
        groups: int = 4,
        position: Literal["suffix", "prefix"] = "suffix",
        model: str = "attacker",
    ) -> None:
        self.curriculum = Curriculum(config.tasks.families, config.curriculum)
        self.completions = config.generation.completions_per_task
        self.seed, self.payload, self.accuracy = seed, payload, accuracy
        self.groups, self.position, self.model = groups, position, model

    def round_messages(self, r: int, created_ms: int | None = None) -> list[bytes]:
        """Round r's wire messages (the same for the same seed and round)."""
        rng = random.Random(f"{self.seed}:poison:{r}")
        created = int(time.time() * 1000) if created_ms is None else created_ms
        out = []
        for ref in self.curriculum.sample(self.seed, r, self.groups):
            task = make_task(ref)
            texts, right = solve(task, self.completions, self.accuracy, rng)
            texts = [
                poison(t, self.payload, self.position) if ok else t
                for t, ok in zip(texts, right, strict=True)
            ]
            group = wire.RolloutGroup(
                ref=ref,
                generator=generator_of(ref.family),
                question=task.question,
                completions=tuple(texts),
                unfinished=frozenset(),
                model=self.model,
                round=r,
                created_ms=created,
            )
            out.append(wire.encode(group))
        return out
