"""Task families for tests, importable in the sandboxed scoring worker."""

from __future__ import annotations

import time

from sapo_node.tasks import Task, TaskRef


class Sevens:
    """A trivially verifiable task: the reward is the share of '7' among the characters.

    A random tiny model writes about 1% sevens; a policy that learns writes only sevens.
    """

    def make(self, ref: TaskRef) -> Task:
        return Task(ref, f"Write sevens ({ref.index}).", "7777")

    def score(self, task: Task, completion: str) -> float:
        text = completion.strip()
        return text.count("7") / len(text) if text else 0.0


class Hangs:
    """A verifier that never returns."""

    def make(self, ref: TaskRef) -> Task:
        return Task(ref, "Wait.", "0")

    def score(self, task: Task, completion: str) -> float:
        while True:
            time.sleep(0.01)


class Crashes:
    """A verifier that kills its process."""

    def make(self, ref: TaskRef) -> Task:
        return Task(ref, "Crash.", "0")

    def score(self, task: Task, completion: str) -> float:
        import os

        os._exit(7)


class GymLoaded:
    """Scores 1 when ReasoningGym is imported in the scoring worker, else 0."""

    def make(self, ref: TaskRef) -> Task:
        return Task(ref, "Anything.", "1")

    def score(self, task: Task, completion: str) -> float:
        import sys

        return float("reasoning_gym" in sys.modules)


def broken_warmup(reasoning_gym: bool = True) -> None:
    """A scoring worker start-up that fails."""
    raise ImportError("reasoning_gym is broken")


class PrivateData:
    """A custom dataset of which each node holds a different share: this node has items
    below 10; a peer may send others, with their answer attached."""

    generator = "private-data 1"

    def make(self, ref: TaskRef) -> Task:
        if ref.index >= 10:
            raise LookupError(f"item {ref.index} is not in this node's copy")
        return Task(ref, f"Say {ref.index * 3}.", str(ref.index * 3))

    def score(self, task: Task, completion: str) -> float:
        return 1.0 if completion.strip() == task.answer else 0.0


class Levelled:
    """Sevens in two levels (the task config's ``level``): at level 0 every completion
    scores 1, a level any node has learnt; at level 1 a tenth plus the share of sevens,
    which a random tiny model barely earns (and never nothing, so the curriculum holds)."""

    def make(self, ref: TaskRef) -> Task:
        return Task(ref, f"Write sevens ({ref.index}).", "7777")

    def score(self, task: Task, completion: str) -> float:
        import json

        if json.loads(task.ref.config_json).get("level", 0) == 0:
            return 1.0
        text = completion.strip()
        return 0.1 + 0.9 * (text.count("7") / len(text) if text else 0.0)
