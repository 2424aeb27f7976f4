"""Which tasks a node practises: weighted families, each at an adaptive difficulty level.

A family's level rises when the node's mean reward over its last ``window`` completions
reaches ``raise_above`` and falls when it is at most ``lower_below`` (the node gets
nothing right). After a move the window starts empty, so one move waits for fresh
evidence. Levels come from the config, or from ReasoningGym's own curriculum
(``reasoning_gym.coaching``) when the config gives none.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from collections.abc import Sequence
from typing import Any

from sapo_node.config import CurriculumSection, FamilySection
from sapo_node.tasks import TaskRef, canonical_json

# Room for this many tasks per round in the index space of one node's seed.
TASKS_PER_ROUND_STRIDE = 4096
MAX_GLOBAL_LEVELS = 32


def reasoning_gym_levels(name: str) -> list[dict[str, Any]]:
    """The config fields that ReasoningGym's curriculum sets at each global level."""
    if ":" in name:  # a custom family (module:Class): ReasoningGym, slow to import, unneeded
        return [{}]
    from reasoning_gym.coaching import RangeAttributeDefinition, ScalarAttributeDefinition
    from reasoning_gym.factory import create_curriculum, has_curriculum

    if not has_curriculum(name):
        return [{}]
    curriculum = create_curriculum(name)
    fields: list[str] = []
    for attr in curriculum.attributes.values():
        if isinstance(attr, RangeAttributeDefinition):
            fields += [attr.lower_field_name, attr.upper_field_name]
        elif isinstance(attr, ScalarAttributeDefinition):
            fields.append(attr.field_name)
    levels: list[dict[str, Any]] = []
    for level in range(MAX_GLOBAL_LEVELS):  # until a level adds nothing new
        curriculum.set_global_level(level)
        generated = dataclasses.asdict(curriculum.generate_configuration())
        config = {f: _jsonable(generated[f]) for f in fields}
        if levels and config == levels[-1]:
            break
        levels.append(config)
    return levels


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


class Curriculum:
    """Family weights, levels and the reward history that moves them."""

    def __init__(self, families: Sequence[FamilySection], settings: CurriculumSection) -> None:
        self.settings = settings
        self.families = {f.name: f for f in families if f.weight > 0}
        self.levels = {
            name: f.levels or reasoning_gym_levels(name) for name, f in self.families.items()
        }
        self.level = {
            name: min(f.start_level, len(self.levels[name]) - 1)
            for name, f in self.families.items()
        }
        self.recent: dict[str, deque[float]] = {
            name: deque(maxlen=settings.window) for name in self.families
        }

    def config_for(self, family: str) -> dict[str, Any]:
        """The dataset config of a family at its current level."""
        return {**self.families[family].config, **self.levels[family][self.level[family]]}

    def known_configs(self) -> dict[str, frozenset[str]]:
        """Per family, the canonical config of every level: the tasks this node would set."""
        return {
            name: frozenset(canonical_json({**f.config, **level}) for level in self.levels[name])
            for name, f in self.families.items()
        }

    def sample(self, seed: int, round_: int, count: int) -> list[TaskRef]:
        """``count`` task references for a round, reproducible from (seed, round)."""
        rng = random.Random(f"{seed}:{round_}")
        names = list(self.families)
        weights = [self.families[n].weight for n in names]
        chosen = rng.choices(names, weights=weights, k=count)
        base = round_ * TASKS_PER_ROUND_STRIDE
        return [
            TaskRef.make(name, self.config_for(name), seed, base + k)
            for k, name in enumerate(chosen)
        ]

    def record(self, family: str, rewards: Sequence[float]) -> int:
        """Add a group's rewards; move the level if the window says so. Returns the move."""
        if family not in self.recent or not self.settings.enabled:
            return 0
        window = self.recent[family]
        window.extend(rewards)
        if len(window) < window.maxlen:
            return 0
        mean = sum(window) / len(window)
        top = len(self.levels[family]) - 1
        move = 0
        if mean >= self.settings.raise_above and self.level[family] < top:
            move = 1
        elif mean <= self.settings.lower_below and self.level[family] > 0:
            move = -1
        if move:
            self.level[family] += move
            window.clear()
        return move

    def state_dict(self) -> dict[str, Any]:
        return {
            "level": dict(self.level),
            "recent": {name: list(w) for name, w in self.recent.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, level in state.get("level", {}).items():
            if name in self.level:
                self.level[name] = max(0, min(int(level), len(self.levels[name]) - 1))
        for name, values in state.get("recent", {}).items():
            if name in self.recent:
                self.recent[name].clear()
                self.recent[name].extend(float(v) for v in values)
