"""The experiment file's model: its sections, its configurations (arms), each node's seed
and config, and the held-out evaluation log that the runner writes and the report reads."""

from __future__ import annotations

import contextlib
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sapo_node.config import Config, ConfigError, EvalSection, _deep_merge, _describe

SEED_SPACING = 2**40  # node seeds this far apart: their task streams never overlap
SOLVER_INDEX = 10**6  # the solver member of replicate k has the seed of node SOLVER_INDEX + k
Sampling = Literal["paper", "uniform", "balanced", "teaching"]


class Variant(BaseModel):
    """One of [experiment.variants]: a configuration at ``ratio`` whose nodes get ``set``
    over the base config (as in a node's TOML)."""

    model_config = ConfigDict(extra="forbid")

    ratio: str = Field("2/2", description="Its I/J.")
    set: dict[str, Any] = Field(
        default_factory=dict,
        description="Node config overrides; train.external_max makes its J adaptive (the "
        "ratio's J the first round).",
    )

    @model_validator(mode="after")
    def _not_the_ratio(self) -> Variant:
        ratio_keys = set(self.set.get("train", {})) & {"local_groups", "external_groups"}
        if ratio_keys:
            raise ValueError(f"variant sets {sorted(ratio_keys)}: its ratio sets I and J")
        return self


class ExperimentSection(BaseModel):
    """The [experiment] table."""

    model_config = ConfigDict(extra="forbid")

    nodes: int = Field(4, ge=1, le=64, description="Nodes per swarm.")
    rounds: int = Field(40, ge=1, le=1_000_000, description="Rounds per node.")
    grid: list[str] = Field(
        default_factory=lambda: ["4/0", "3/1", "2/2", "1/3"],
        min_length=1,
        description="I/J ratios, I + J the same for all; one has J = 0 (the baseline).",
    )
    sampling: list[Sampling] = Field(
        default_factory=list, description="Other pool sampling policies, run at sampling_ratio."
    )
    sampling_ratio: str = Field("2/2", description="The I/J of the sampling configurations.")
    adaptive: list[int] = Field(
        default_factory=list,
        description="Bounds of adaptive J (train.external_max); each adds a configuration at "
        "adaptive_ratio whose nodes choose J each round up to it.",
    )
    adaptive_ratio: str = Field("2/2", description="The I/J of the adaptive configurations.")
    solver: list[float] = Field(
        default_factory=list,
        description="Accuracies of a solver member (solver.py); each adds a configuration at "
        "solver_ratio whose swarm has one, besides its nodes.",
    )
    solver_ratio: str = Field("2/2", description="The I/J of the solver configurations.")
    solver_groups: int = Field(4, ge=1, le=64, description="Groups the solver shares a round.")
    variants: dict[str, Variant] = Field(
        default_factory=dict,
        description="Named configurations at a ratio with node config overrides of their "
        "own (label -> {ratio, set}), e.g. a sharing mechanism to screen.",
    )
    round_s: float = Field(
        30.0,
        gt=0.0,
        le=86400.0,
        description="Seconds the nodes' clock advances a round: pool ages, distrust and "
        "message times follow the rounds, not the machine's speed.",
    )
    seed: int = Field(1000, ge=0, lt=2**40, description="Base of the node seeds.")
    replicates: int = Field(1, ge=1, le=64, description="Independent swarms per configuration.")
    threads: int = Field(1, ge=0, le=1024, description="torch threads (0: torch's default).")
    checkpoint_every: int = Field(1, ge=1, le=100_000, description="Checkpoint every N rounds.")
    window: int = Field(10, ge=1, le=100_000, description="Moving-average window of the curves.")

    @model_validator(mode="after")
    def _grid(self) -> ExperimentSection:
        grid = [parse_ratio(g) for g in self.grid]
        ratios = grid + ([parse_ratio(self.sampling_ratio)] if self.sampling else [])
        if self.adaptive:
            i, j = parse_ratio(self.adaptive_ratio)
            ratios.append((i, j))
            if any(not 0 < m <= i + j for m in self.adaptive) or len(set(self.adaptive)) != len(
                self.adaptive
            ):
                raise ValueError(
                    f"adaptive bounds must be distinct, in [1, I + J]: {self.adaptive}"
                )
        for label, v in self.variants.items():
            ratios.append(parse_ratio(v.ratio))
            if not label.startswith(f"{v.ratio} ") or not label[len(v.ratio) :].strip():
                raise ValueError(
                    f"variant {label!r}: name it by its ratio and a word, e.g. '{v.ratio} answers'"
                )
        if self.solver:
            ratios.append(parse_ratio(self.solver_ratio))
            if parse_ratio(self.solver_ratio)[1] == 0:
                raise ValueError("solver_ratio needs J >= 1: with J = 0 nodes take nothing shared")
            if any(not 0.0 <= p <= 1.0 for p in self.solver) or len(set(self.solver)) != len(
                self.solver
            ):
                raise ValueError(f"solver accuracies must be distinct, in [0, 1]: {self.solver}")
        totals = {i + j for i, j in ratios}
        if len(totals) != 1:
            raise ValueError(
                f"I + J must be the same in grid, sampling_ratio, adaptive_ratio and "
                f"solver_ratio, got {totals}"
            )
        if not any(j == 0 for _, j in grid):
            raise ValueError("the grid needs the baseline, a ratio with J = 0 (e.g. '4/0')")
        if len(set(self.grid)) != len(self.grid):
            raise ValueError(f"grid has repeated ratios: {self.grid}")
        return self


class ExperimentSpec(BaseModel):
    """A whole experiment file."""

    model_config = ConfigDict(extra="forbid")

    experiment: ExperimentSection = Field(default_factory=ExperimentSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    base: dict[str, Any] = Field(default_factory=dict, description="Node config overrides.")

    @model_validator(mode="after")
    def _base(self) -> ExperimentSpec:
        per_arm = set(self.base.get("train", {})) & {
            "local_groups",
            "external_groups",
            "external_max",
        }
        if per_arm:
            raise ValueError(
                f"base sets {sorted(per_arm)}: the experiment sets I and J per configuration "
                "(grid, variants' ratio; an adaptive J in a variant's set or experiment.adaptive)"
            )
        for a in arms(self):  # validates base and each variant's overrides
            node_config(self, a, 0, Path("."))
        return self


def parse_ratio(text: str) -> tuple[int, int]:
    """'I/J' as (I, J).

    >>> parse_ratio("3/1")
    (3, 1)
    """
    try:
        i, j = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"{text!r} is not I/J (e.g. '2/2')") from None
    if i < 0 or j < 0 or i + j < 1:
        raise ValueError(f"{text!r}: I and J must be >= 0 with I + J >= 1")
    return i, j


@dataclass(frozen=True)
class Arm:
    """One configuration of the experiment."""

    label: str  # "2/2", "2/2 uniform", "2/2 adaptive 4" or "2/2 solver 0.8"
    local: int
    external: int
    sampling: str | None  # None: the base config's pool.sampling
    solver: float | None = None  # the accuracy of the swarm's solver member, if it has one
    external_max: int | None = None  # adaptive J up to this (train.external_max)
    overrides: str | None = None  # a variant's node config overrides, as JSON

    @property
    def plain(self) -> bool:
        """Its I/J with the base config: no other sampling, no adaptive J, no solver, no
        overrides."""
        return (
            self.sampling is None
            and self.solver is None
            and self.external_max is None
            and self.overrides is None
        )

    @property
    def ratio(self) -> str:
        return f"{self.local}/{self.external}"

    @property
    def dirname(self) -> str:
        name = f"{self.local}-{self.external}"
        if self.overrides is not None:
            rest = self.label.replace(self.ratio, "", 1).strip()
            return f"{name}-" + "".join(c if c.isalnum() or c in "-_." else "-" for c in rest)
        if self.solver is not None:
            return f"{name}-solver-{self.solver:g}"
        if self.external_max is not None:
            return f"{name}-adaptive-{self.external_max}"
        return f"{name}-{self.sampling}" if self.sampling else name


def arms(spec: ExperimentSpec) -> list[Arm]:
    """Every configuration: the grid, then the sampling policies, the adaptive J bounds
    and the solver members, each at its ratio."""
    e = spec.experiment
    out = [Arm(g, *parse_ratio(g), None) for g in e.grid]
    out += [Arm(f"{e.sampling_ratio} {s}", *parse_ratio(e.sampling_ratio), s) for s in e.sampling]
    out += [
        Arm(f"{e.adaptive_ratio} adaptive {m}", *parse_ratio(e.adaptive_ratio), None, None, m)
        for m in e.adaptive
    ]
    out += [
        Arm(f"{e.solver_ratio} solver {p:g}", *parse_ratio(e.solver_ratio), None, p)
        for p in e.solver
    ]
    out += [
        Arm(label, *parse_ratio(v.ratio), None, overrides=json.dumps(v.set, sort_keys=True))
        for label, v in e.variants.items()
    ]
    return out


def arm(spec: ExperimentSpec, label: str) -> Arm:
    for a in arms(spec):
        if label in (a.label, a.dirname):
            return a
    known = ", ".join(a.label for a in arms(spec))
    raise ConfigError(f"no configuration {label!r} in this experiment (it has {known})")


def node_seed(spec: ExperimentSpec, index: int) -> int:
    """Node ``index``'s seed: the same in every configuration, far from the others'."""
    return spec.experiment.seed + index * SEED_SPACING


def node_config(spec: ExperimentSpec, a: Arm, index: int, out: Path) -> Config:
    """The config of node ``index`` (over all replicates) of configuration ``a``."""
    e = spec.experiment
    variant = {} if a.overrides is None else json.loads(a.overrides)
    bound = a.external_max
    if bound is None:  # a variant may make its J adaptive; every other J is fixed
        bound = variant.get("train", {}).get("external_max")
    forced: dict[str, Any] = {
        "node": {
            "data_dir": str(out / a.dirname / f"node-{index}"),
            "seed": node_seed(spec, index),
            "rounds": e.rounds,
            "checkpoint_every": e.checkpoint_every,
            "threads": e.threads,
        },
        # J fixed at the arm's ratio, unless the arm makes it adaptive
        "train": {"local_groups": a.local, "external_groups": a.external}
        | ({"external_by": "fixed"} if bound is None else {"external_max": bound}),
        "curriculum": {"enabled": False},
        "net": {"enabled": False},
        "eval": {**spec.eval.model_dump(), "every": 0},  # the experiment runs the evals
    }
    if a.sampling:
        forced["pool"] = {"sampling": a.sampling}
    base = _deep_merge(spec.base, variant)
    try:
        return Config.model_validate(_deep_merge(base, forced))
    except ValidationError as exc:
        raise ConfigError(f"experiment [base]: {_describe(exc)}") from None


def load_spec(path: Path, overrides: dict[str, Any] | None = None) -> ExperimentSpec:
    """Read and validate an experiment file (ConfigError with a one-line reason)."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"experiment file not found: {path}") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read experiment file {path}: {exc}") from None
    data = _deep_merge(data, overrides or {})
    try:
        return ExperimentSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid experiment file {path}: {_describe(exc)}") from None


class EvalLog:
    """A node's held-out evaluations, one JSON line each, keyed by rounds trained."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        rows = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                rows.append(json.loads(line))
        return rows

    def rounds(self) -> set[int]:
        return {int(r["round"]) for r in self.read()}

    def keep_up_to(self, round_: int) -> None:
        """Forget evaluations of rounds after ``round_`` (a resume redoes them)."""
        from sapo_node.checkpoint import write_text_atomic

        rows = self.read()
        kept = [r for r in rows if int(r["round"]) <= round_]
        if len(kept) != len(rows):
            write_text_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def append(self, record: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, allow_nan=False) + "\n")


def eval_due(spec: ExperimentSpec, round_: int) -> bool:
    """Whether a node that finished ``round_`` rounds is evaluated now.

    >>> spec = ExperimentSpec.model_validate({"experiment": {"rounds": 10}})
    >>> [r for r in range(11) if eval_due(spec, r)]
    [0, 10]
    """
    every = spec.eval.every
    return round_ in (0, spec.experiment.rounds) or bool(every and round_ % every == 0)
