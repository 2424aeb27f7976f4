"""A member that is not a model: a solver that knows the answers and the answer format.

It stands for "a better generator in the swarm": for each task it writes L completions,
each the task's true answer with probability ``accuracy`` and a wrong one otherwise,
always in the format the prompts ask for (``<answer>...</answer>``). It trains nothing
and runs no model; its groups reach the swarm through ``sapo-node share`` (the example
program ``scripts/solver.py``) or, in the experiment, through the same checks in process.
"""

from __future__ import annotations

import random
from fractions import Fraction

from sapo_node.curriculum import Curriculum
from sapo_node.tasks import Task, make_task


def wrong_answer(answer: str, rng: random.Random) -> str:
    """An answer that is not ``answer`` but looks like one.

    >>> wrong_answer("7", random.Random(0)) != "7"
    True
    >>> wrong_answer("True", random.Random(0))
    'False'
    """
    flips = {"True": "False", "False": "True", "Yes": "No", "No": "Yes"}
    if answer in flips:
        return flips[answer]
    offset = rng.choice([-3, -2, -1, 1, 2, 3])
    try:
        return str(int(answer) + offset)
    except ValueError:
        pass
    try:
        return str(Fraction(answer) + offset)
    except (ValueError, ZeroDivisionError):
        pass
    return answer[::-1] if answer[::-1] != answer else answer + "0"


def solve(task: Task, n: int, accuracy: float, rng: random.Random) -> tuple[list[str], list[bool]]:
    """``n`` completions of ``task`` in the answer format, and which of them are right."""
    if task.answer is None:
        raise ValueError(f"task {task.ref} has no answer to give")
    right = [rng.random() < accuracy for _ in range(n)]
    texts = [
        f"<answer>{task.answer if ok else wrong_answer(task.answer, rng)}</answer>" for ok in right
    ]
    return texts, right


def solve_round(
    curriculum: Curriculum,
    seed: int,
    round_: int,
    groups: int,
    n: int,
    accuracy: float,
) -> list[tuple[Task, list[str]]]:
    """One round of a solver member: ``groups`` tasks from its curriculum, solved.

    Reproducible from (seed, round); the curriculum moves on the solver's own
    correctness, as a node's moves on its rewards.
    """
    rng = random.Random(f"{seed}:solve:{round_}")
    out = []
    for ref in curriculum.sample(seed, round_, groups):
        task = make_task(ref)
        texts, right = solve(task, n, accuracy, rng)
        curriculum.record(ref.family, [float(x) for x in right])
        out.append((task, texts))
    return out
