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
AT_JOIN = "at-join.json"  # OUT/swarm-<w>/at-join.json: the members' evaluations at the join
MEMBER_INDEX = 2 * 10**6  # member m of warm swarm w (late joiner): node MEMBER_INDEX + w * N + m
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


class LateJoiner(BaseModel):
    """[experiment.late_joiner]: each compared node joins a swarm that has trained before it.

    Joiner k (node k, one per replicate) joins warm swarm ``k % swarms``: ``nodes``
    members that trained ``swarm_rounds`` rounds and keep training and sharing while the
    joiner runs its ``rounds``. In a configuration with J = 0 the joiner runs alone (its
    pair); only the joiners are compared."""

    model_config = ConfigDict(extra="forbid")

    swarm_rounds: int = Field(
        ..., ge=1, le=1_000_000, description="Rounds the swarm trained before the joiner came."
    )
    swarm_from: str = Field(
        "",
        description="A directory holding node-<i>/ data directories (an earlier run's "
        "OUT/<configuration>) whose latest checkpoint is round swarm_rounds: member m of "
        "warm swarm w resumes node-<w * nodes + m>'s. Empty: the runner trains the warm "
        "swarms itself (OUT/swarm-<w>/).",
    )
    swarms: int = Field(1, ge=1, le=64, description="Warm swarms (joiner k joins k % swarms).")
    swarm_arm: str = Field(
        "",
        description="The configuration whose node config the members run (empty: the first "
        "with J > 0).",
    )
    threshold_at_join: bool = Field(
        True,
        description="Add a time-to-accuracy threshold: the mean held-out greedy accuracy of "
        "the joiner's warm swarm when it joined.",
    )


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
    curriculum: bool = Field(
        False,
        description="Keep the nodes' curriculum (the base config's levels); false: fixed "
        "difficulty, as in the paper.",
    )
    periodic_samples: int | None = Field(
        None,
        ge=0,
        le=64,
        description="Sampled completions per task at the evaluations between the start and "
        "the end (eval.every), to make them cheaper (0: greedy only, no pass@1); unset: "
        "eval.samples. Greedy is the same in every evaluation.",
    )
    thresholds: list[float] = Field(
        default_factory=list,
        description="Held-out greedy accuracies: the report gives each node's compute-seconds "
        "until its evaluations first reach each (time to accuracy).",
    )
    late_joiner: LateJoiner | None = Field(
        None, description="Compare nodes that join a swarm trained before them (LateJoiner)."
    )
    confirmatory_runs_on_question: int | None = Field(
        None,
        ge=0,
        le=10_000,
        description="Confirmatory (pre-registered) runs made on this experiment's question, "
        "this one included if it is one; printed in the report (a p is read against them).",
    )
    question: str = Field("", description="The question those runs asked, in a few words.")
    setting: str = Field(
        "",
        description="Printed in the report with the [base] overrides: how and why the "
        "setting differs from the defaults.",
    )

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
        if any(not 0.0 < t <= 1.0 for t in self.thresholds):
            raise ValueError(f"thresholds are held-out accuracies in (0, 1]: {self.thresholds}")
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
        lj = self.experiment.late_joiner
        if lj is not None:
            if lj.swarm_arm:
                try:
                    members = arm(self, lj.swarm_arm)
                except ConfigError as exc:
                    raise ValueError(f"late_joiner.swarm_arm: {exc}") from None
                if members.external == 0:
                    raise ValueError("late_joiner.swarm_arm needs J >= 1: its members share")
            elif swarm_arm(self) is None:
                raise ValueError("a late joiner needs a configuration with J >= 1 to join")
            if self.experiment.solver:
                raise ValueError("a late joiner's swarm has no solver member")
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


def swarm_arm(spec: ExperimentSpec) -> Arm | None:
    """The configuration whose node config a late joiner's swarm members run."""
    lj = spec.experiment.late_joiner
    if lj is None:
        return None
    if lj.swarm_arm:
        return arm(spec, lj.swarm_arm)
    return next((a for a in arms(spec) if a.external > 0), None)


def compared_nodes(spec: ExperimentSpec) -> int:
    """The nodes compared per configuration: every node of every swarm, or with a late
    joiner, the one joiner of each replicate."""
    e = spec.experiment
    return e.replicates if e.late_joiner is not None else e.nodes * e.replicates


def compared_per_swarm(spec: ExperimentSpec) -> int:
    """Compared nodes in one swarm (one replicate)."""
    return 1 if spec.experiment.late_joiner is not None else spec.experiment.nodes


def member_config(spec: ExperimentSpec, data_dir: Path, seed: int, rounds: int) -> Config:
    """A late joiner's swarm member: the swarm configuration's node, in ``data_dir``, with
    ``seed``, trained up to ``rounds`` rounds in all."""
    a = swarm_arm(spec)
    assert a is not None  # the spec's validator requires one
    c = node_config(spec, a, 0, data_dir)
    node = c.node.model_copy(update={"data_dir": Path(data_dir), "seed": seed, "rounds": rounds})
    return c.model_copy(update={"node": node})


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
        "net": {"enabled": False},
        "eval": {**spec.eval.model_dump(), "every": 0},  # the experiment runs the evals
    }
    if not e.curriculum:  # fixed difficulty, as in the paper
        forced["curriculum"] = {"enabled": False}
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


def eval_samples(spec: ExperimentSpec, round_: int) -> int:
    """Sampled completions per task of the evaluation after ``round_`` rounds: the full
    ``eval.samples`` at the start and the end, ``periodic_samples`` in between.

    >>> spec = ExperimentSpec.model_validate(
    ...     {"experiment": {"rounds": 4, "periodic_samples": 1}, "eval": {"every": 2}})
    >>> [eval_samples(spec, r) for r in (0, 2, 4)]
    [4, 1, 4]
    """
    e = spec.experiment
    if round_ in (0, e.rounds) or e.periodic_samples is None:
        return spec.eval.samples
    return e.periodic_samples


def eval_due(spec: ExperimentSpec, round_: int) -> bool:
    """Whether a node that finished ``round_`` rounds is evaluated now.

    >>> spec = ExperimentSpec.model_validate({"experiment": {"rounds": 10}})
    >>> [r for r in range(11) if eval_due(spec, r)]
    [0, 10]
    """
    every = spec.eval.every
    return round_ in (0, spec.experiment.rounds) or bool(every and round_ % every == 0)
