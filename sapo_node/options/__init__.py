"""One typed config tree for a node (loaded by sapo_node/config.py).

Every field carries a docstring (its ``description``) and bounds; cross-field checks
say why a combination is refused. ``configs/default.toml`` mirrors the defaults here
(a test keeps them equal), so ``sapo-node start`` with no file runs the default config.
The sections are split by concern: a node's own work (``training.py``), its life among
peers (``local_swarm.py``), and what they share (``base.py``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from sapo_node.options.base import (
    DEFAULT_STATUS_LISTEN,
    ENV_PREFIX,
    SWARM_NAME,
    UNCHECKED_TOKENS,
    ConfigError,
    _deep_merge,
    _describe,
    _Section,
    parse_host_port,
)
from sapo_node.options.swarm import DefenceSection, NetSection, PoolSection, StatusSection
from sapo_node.options.training import (
    CurriculumSection,
    EvalSection,
    FamilySection,
    GenerationSection,
    LoraSection,
    ModelSection,
    NodeSection,
    ScoringSection,
    TasksSection,
    TrainSection,
)

__all__ = [
    "DEFAULT_STATUS_LISTEN",
    "ENV_PREFIX",
    "FINGERPRINT",
    "SWARM_NAME",
    "UNCHECKED_TOKENS",
    "Config",
    "ConfigError",
    "CurriculumSection",
    "DefenceSection",
    "EvalSection",
    "FamilySection",
    "GenerationSection",
    "LoraSection",
    "ModelSection",
    "NetSection",
    "NodeSection",
    "PoolSection",
    "ScoringSection",
    "StatusSection",
    "TasksSection",
    "TrainSection",
    "_Section",
    "_deep_merge",
    "_describe",
    "parse_host_port",
]


# What a checkpoint records of its config, and must agree with to be resumed: its key in
# the checkpoint, the config field.
FINGERPRINT: dict[str, tuple[str, ...]] = {
    "model": ("model", "name"),
    "lora": ("model", "lora", "enabled"),
}


class Config(_Section):
    """The whole node config."""

    node: NodeSection = Field(default_factory=NodeSection)
    model: ModelSection = Field(default_factory=ModelSection)
    generation: GenerationSection = Field(default_factory=GenerationSection)
    tasks: TasksSection = Field(default_factory=TasksSection)
    curriculum: CurriculumSection = Field(default_factory=CurriculumSection)
    scoring: ScoringSection = Field(default_factory=ScoringSection)
    train: TrainSection = Field(default_factory=TrainSection)
    pool: PoolSection = Field(default_factory=PoolSection)
    defence: DefenceSection = Field(default_factory=DefenceSection)
    net: NetSection = Field(default_factory=NetSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    status: StatusSection = Field(default_factory=StatusSection)

    @model_validator(mode="after")
    def _cross(self) -> Config:
        if self.model.dtype == "float16" and self.node.device == "cpu":
            raise ValueError("model.dtype float16 is not supported on the CPU; use float32")
        return self

    def fingerprint(self) -> dict[str, Any]:
        """The fields a checkpoint must agree with to be resumed (``FINGERPRINT``)."""
        out: dict[str, Any] = {}
        for key, path in FINGERPRINT.items():
            value: Any = self
            for name in path:
                value = getattr(value, name)
            out[key] = value
        return out
