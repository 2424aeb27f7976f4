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

``attack`` names the class; ``payload`` is the one above. Two more:

- ``shape-format``: no payload in the text; what it aims at is the receiver's own answer
  format, and through it the number of peers' groups the receiver takes (J, under
  ``train.external_by = "format"``, rises as the receiver's format rate falls). The right
  completions carry ``payload`` as a short preamble the receiver does not write
  (``Answer: <answer>7</answer>``: a few characters outside the answer, in common tokens,
  so the outside-answer and rank checks pass them, and with ``answer_only`` it is never
  taught); the wrong ones are bare answers in the format, starting ``<answer>``. GRPO then
  lowers the tags where the receiver itself may open with them and raises them only
  after text it never writes. Below-mean completions are never checked, so nothing
  stands in the way of their shape.
- ``honest``: the same groups as ``shape-format`` without the preamble: every completion a
  bare answer in the format. The baseline the shaping is measured against: the two differ
  only in the preamble of the right completions.

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
# The shape-format class's preamble: 7 characters outside the answer; under the untrained
# embedded model its first token ranks about 80th-160th (never a first choice, so never
# taught) and its worst 4-token window stays near 2-3 bits, under the rank bound.
FORMAT_PREAMBLE = "Answer:"
Attack = Literal["payload", "shape-format", "honest"]
ATTACKS: tuple[str, ...] = ("payload", "shape-format", "honest")


def poison(text: str, payload: str, position: Literal["suffix", "prefix"]) -> str:
    """``text`` with ``payload`` added.

    >>> poison("<answer>7</answer>", "X", "suffix"), poison("<answer>7</answer>", "X", "prefix")
    ('<answer>7</answer> X', 'X <answer>7</answer>')
    """
    return f"{text} {payload}" if position == "suffix" else f"{payload} {text}"


def shape(
    text: str,
    right: bool,
    attack: Attack,
    payload: str,
    position: Literal["suffix", "prefix"] = "prefix",
) -> str:
    """A completion of the solver's (``<answer>ANSWER</answer>``) as class ``attack`` sends it.

    >>> [shape("<answer>7</answer>", ok, "shape-format", "Answer:", "prefix") for ok in (1, 0)]
    ['Answer: <answer>7</answer>', '<answer>7</answer>']
    >>> shape("<answer>7</answer>", True, "honest", "Answer:", "prefix")
    '<answer>7</answer>'
    """
    if attack == "honest" or not right:
        return text
    return poison(text, payload, "prefix" if attack == "shape-format" else position)


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
        attack: Attack = "payload",
    ) -> None:
        if attack not in ATTACKS:
            raise ValueError(f"attack must be one of {', '.join(ATTACKS)}, not {attack!r}")
        self.curriculum = Curriculum(config.tasks.families, config.curriculum)
        self.completions = config.generation.completions_per_task
        self.seed, self.payload, self.accuracy = seed, payload, accuracy
        self.groups, self.position, self.model = groups, position, model
        self.attack = attack

    def round_messages(self, r: int, created_ms: int | None = None) -> list[bytes]:
        """Round r's wire messages (the same for the same seed and round)."""
        rng = random.Random(f"{self.seed}:poison:{r}")
        created = int(time.time() * 1000) if created_ms is None else created_ms
        out = []
        for ref in self.curriculum.sample(self.seed, r, self.groups):
            task = make_task(ref)
            texts, right = solve(task, self.completions, self.accuracy, rng)
            texts = [
                shape(t, ok, self.attack, self.payload, self.position)
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
