"""Synthetic completions and the valid wire groups made of them, for the benchmarks that
publish or pool groups without a model."""

from __future__ import annotations

import random

from sapo_node.intake import wire
from sapo_node.tasks import TaskRef, generator_of

COMPLETIONS = 8
FAMILY = "basic_arithmetic"
CONFIG = {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 2}
_TEXT = (
    "first add the two numbers then carry one so we get next check sum result step "
    "digit plus minus times equals ones tens answer is which makes so far"
)
WORDS = _TEXT.split()


def word(rng: random.Random) -> str:
    """An arithmetic-looking word: one of WORDS, or a number below 100."""
    return rng.choice(WORDS) if rng.random() < 0.7 else str(rng.randint(0, 99))


def completion(rng: random.Random, answer: str) -> str:
    """About 64 tokens of arithmetic-looking text ending in an answer tag."""
    return " ".join(word(rng) for _ in range(34)) + f".\n<answer>{answer}</answer>"


def completions(rng: random.Random) -> tuple[str, ...]:
    """8 completions of about 260 characters of arithmetic-looking text."""
    out = []
    for _ in range(COMPLETIONS):
        words = [word(rng)]
        while sum(len(w) + 1 for w in words) < 240:
            words.append(word(rng))
        out.append(" ".join(words) + f".\n<answer>{rng.randint(0, 999)}</answer>")
    return tuple(out)


def group_bytes(texts: tuple[str, ...], node: int, seq: int, created_ms: int) -> bytes:
    """A valid group: node ``node``'s ``seq``-th, published at ``created_ms``."""
    group = wire.RolloutGroup(
        ref=TaskRef.make(FAMILY, CONFIG, node, seq),
        generator=generator_of(FAMILY),
        question=f"What is {seq} + {node} + 17? Give the answer in <answer></answer>.",
        completions=texts,
        model="embedded",
        round=seq,
        created_ms=created_ms,
    )
    return wire.encode(group)
