"""The paper's controlled experiment: does sharing help?

For each configuration of a grid of (I, J) with I + J fixed (and optionally other pool
sampling policies at one ratio), N nodes run through the real ``Node.run_round`` path
in one process, exchanging real wire bytes over the in-memory transport, in lockstep:
every node runs round r, then what they published in round r is delivered, then every
node runs round r + 1. So in every configuration node i has the same seed, the same
schedule and the same view of its peers (their previous round's groups). Each node is
evaluated on the held-out set (evaluate.py) before training, every ``eval.every``
rounds, and at the end. Curriculum off (fixed difficulty, as in the paper).

Departures from the paper, and why: 4 nodes and I + J = 4 by default (a CPU holds four
135M models; the paper had 8 GPUs and I + J = 8); held-out evaluation added, since
training reward alone is confounded by what a node chooses to generate.

Experiment file (TOML), every key optional but ``grid``::

    [experiment]
    nodes = 4                           # N nodes per swarm
    rounds = 40                         # rounds per node
    grid = ["4/0", "3/1", "2/2", "1/3"] # I/J, I + J the same; one must have J = 0
    sampling = ["uniform"]              # other pool.sampling policies, at ...
    sampling_ratio = "2/2"              # ... this I/J (the grid's use base pool.sampling)
    solver = []                         # accuracies: each adds a configuration at ...
    solver_ratio = "2/2"                # ... this I/J whose swarm has a solver member too
    solver_groups = 4                   # groups the solver member shares a round
    seed = 1000                         # node i of replicate k: seed + (k * N + i) * 2**40
    replicates = 1                      # independent swarms per configuration
    threads = 1                         # torch threads of the process (0: torch's default)
    checkpoint_every = 1                # 1: a stop loses no finished round
    window = 10                         # moving average of the reward curves
    [eval]                              # the held-out evaluation: node [eval] fields
    tasks = 32
    samples = 4
    seed = 0
    every = 0                           # also every N rounds (start and end always)
    [base]                              # node config overrides, as in a node's TOML
    [base.generation]
    max_new_tokens = 48

Output under OUT::

    OUT/experiment.json                 the resolved experiment (a resume must match)
    OUT/<I-J[-sampling]>/node-<i>/      each node's data dir: metrics.jsonl, eval.jsonl,
                                        checkpoints/, pool.sqlite3
    OUT/results.json                    every figure of the report, per node too
    OUT/results.md                      the table, like the paper's, with its notes
    OUT/reward_curves.png               mean reward per round, moving average
    OUT/heldout.png                     held-out accuracy at each evaluation
    OUT/answer_format.png               share of own completions in the answer format

Resuming: running the same command again continues each node from its checkpoint;
rounds in metrics.jsonl and evaluations in eval.jsonl up to the checkpoint are not
redone. Configurations can run as separate processes (``--only 2/2``), e.g. two at
once with one thread each; the report covers every configuration found finished.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import json
import threading
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sapo_node.config import Config, ConfigError, EvalSection, _deep_merge, _describe
from sapo_node.stats import bootstrap_interval, sign_flip_p, smallest_p, wilson_interval

log = structlog.get_logger(__name__)

PARKED = "in-flight.json"  # messages between nodes when a run stopped
START_EVALS = "start-eval"  # OUT/start-eval/node-<i>.json: node i's evaluation before training
SEED_SPACING = 2**40  # node seeds this far apart: their task streams never overlap
SOLVER_INDEX = 10**6  # the solver member of replicate k has the seed of node SOLVER_INDEX + k
Sampling = Literal["paper", "uniform", "balanced"]


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
    solver: list[float] = Field(
        default_factory=list,
        description="Accuracies of a solver member (solver.py); each adds a configuration at "
        "solver_ratio whose swarm has one, besides its nodes.",
    )
    solver_ratio: str = Field("2/2", description="The I/J of the solver configurations.")
    solver_groups: int = Field(4, ge=1, le=64, description="Groups the solver shares a round.")
    seed: int = Field(1000, ge=0, lt=2**40, description="Base of the node seeds.")
    replicates: int = Field(1, ge=1, le=64, description="Independent swarms per configuration.")
    threads: int = Field(1, ge=0, le=1024, description="torch threads (0: torch's default).")
    checkpoint_every: int = Field(1, ge=1, le=100_000, description="Checkpoint every N rounds.")
    window: int = Field(10, ge=1, le=100_000, description="Moving-average window of the curves.")

    @model_validator(mode="after")
    def _grid(self) -> ExperimentSection:
        grid = [parse_ratio(g) for g in self.grid]
        ratios = grid + ([parse_ratio(self.sampling_ratio)] if self.sampling else [])
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
            raise ValueError(f"I + J must be the same in grid and sampling_ratio, got {totals}")
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
        node_config(self, arm(self, self.experiment.grid[0]), 0, Path("."))  # validates base
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

    label: str  # "2/2", "2/2 uniform" or "2/2 solver 0.8"
    local: int
    external: int
    sampling: str | None  # None: the base config's pool.sampling
    solver: float | None = None  # the accuracy of the swarm's solver member, if it has one

    @property
    def ratio(self) -> str:
        return f"{self.local}/{self.external}"

    @property
    def dirname(self) -> str:
        name = f"{self.local}-{self.external}"
        if self.solver is not None:
            return f"{name}-solver-{self.solver:g}"
        return f"{name}-{self.sampling}" if self.sampling else name


def arms(spec: ExperimentSpec) -> list[Arm]:
    """Every configuration: the grid, then the sampling policies at their ratio."""
    e = spec.experiment
    out = [Arm(g, *parse_ratio(g), None) for g in e.grid]
    out += [Arm(f"{e.sampling_ratio} {s}", *parse_ratio(e.sampling_ratio), s) for s in e.sampling]
    out += [
        Arm(f"{e.solver_ratio} solver {p:g}", *parse_ratio(e.solver_ratio), None, p)
        for p in e.solver
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
    forced: dict[str, Any] = {
        "node": {
            "data_dir": str(out / a.dirname / f"node-{index}"),
            "seed": node_seed(spec, index),
            "rounds": e.rounds,
            "checkpoint_every": e.checkpoint_every,
            "threads": e.threads,
        },
        "train": {"local_groups": a.local, "external_groups": a.external},
        "curriculum": {"enabled": False},
        "net": {"enabled": False},
        "eval": {**spec.eval.model_dump(), "every": 0},  # the experiment runs the evals
    }
    if a.sampling:
        forced["pool"] = {"sampling": a.sampling}
    try:
        return Config.model_validate(_deep_merge(spec.base, forced))
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


# --- running -----------------------------------------------------------------------------


class Deferred:
    """A transport whose publications wait for ``flush(r)``: the lockstep barrier.

    Every node of round r publishes into its own queue; after all of them ran round r
    the queues are delivered, so every node sees its peers' round r in round r + 1,
    whatever its place in the order. A stop keeps what is in flight (``park``), and a
    resume puts it back (``unpark``), so a stopped experiment sees the same messages in
    the same rounds as one that was never stopped.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.peer_id = inner.peer_id
        self.round = 0  # the round whose publications are being queued
        self._queue: list[tuple[int, bytes]] = []

    def publish(self, data: bytes) -> bool:
        self._queue.append((self.round, data))
        return True

    def flush(self, round_: int) -> None:
        """Deliver what was published in rounds up to ``round_``."""
        due = [d for r, d in self._queue if r <= round_]
        self._queue = [(r, d) for r, d in self._queue if r > round_]
        for data in due:
            self.inner.publish(data)

    def discard(self, round_: int) -> None:
        """Forget the publications of an abandoned round (it is redone on resume)."""
        self._queue = [(r, d) for r, d in self._queue if r != round_]

    def park(self, path: Path) -> None:
        """Write what is in flight (queued and received, not yet taken in) to ``path``."""
        from sapo_node.checkpoint import write_text_atomic

        state = {
            "outbox": [[r, base64.b64encode(d).decode()] for r, d in self._queue],
            "inbox": [[m.author, base64.b64encode(m.data).decode()] for m in self.inner.received()],
        }
        write_text_atomic(path, json.dumps(state) + "\n")

    def unpark(self, path: Path) -> None:
        """Put back what ``park`` wrote, then remove the file."""
        from sapo_node.net import Received

        if not path.exists():
            return
        state = json.loads(path.read_text(encoding="utf-8"))
        self._queue = [(int(r), base64.b64decode(d)) for r, d in state["outbox"]] + self._queue
        for author, data in state["inbox"]:
            self.inner._arrive(Received(base64.b64decode(data), author))
        path.unlink()

    def received(self):
        return self.inner.received()

    def peers(self) -> int:
        return self.inner.peers()

    def stats(self):
        # a copy: the in-memory transport hands out its live counters, and the node keeps
        # the previous round's figures to subtract (bytes_in would always read 0)
        return dataclasses.replace(self.inner.stats())

    def penalise(self, author: str) -> None:
        self.inner.penalise(author)

    def refusals(self) -> dict[tuple[str, str], int]:
        return self.inner.refusals()

    def close(self) -> None:
        self.inner.close()


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


def run_arm(
    spec: ExperimentSpec,
    a: Arm,
    out: Path,
    stop: threading.Event,
    *,
    progress: Callable[[str], None] = lambda _: None,
) -> bool:
    """Run (or continue) every replicate swarm of one configuration; False if stopped."""
    e = spec.experiment
    for rep in range(e.replicates):
        indices = list(range(rep * e.nodes, (rep + 1) * e.nodes))
        if _swarm_done(spec, a, out, indices):
            continue
        if not _run_swarm(spec, a, out, indices, stop, progress):
            return False
    return True


def _swarm_done(spec: ExperimentSpec, a: Arm, out: Path, indices: list[int]) -> bool:
    """Whether every node of a swarm has its metrics of every round and its final
    evaluation (taken after its last checkpoint). Checkpoints are not needed: a finished
    swarm's metrics.jsonl and eval.jsonl, copied into a new OUT, count as finished."""
    from sapo_node.metrics import read_metrics

    rounds = spec.experiment.rounds
    for i in indices:
        d = out / a.dirname / f"node-{i}"
        if rounds not in EvalLog(d / "eval.jsonl").rounds() or not (d / "metrics.jsonl").exists():
            return False
        done = {int(r["round"]) for r in read_metrics(d / "metrics.jsonl")}
        if not set(range(rounds)) <= done:
            return False
    return True


class SolverMember:
    """A swarm's member that trains nothing and runs no model: every round it shares
    ``groups`` tasks of the nodes' curriculum, solved by solver.py, each line checked as
    ``sapo-node share`` checks it (share.py) and sent as the bytes that were checked.
    Stateless but for its seed: round r's groups are the same however often it resumes."""

    def __init__(self, config: Config, seed: int, accuracy: float, groups: int, transport):
        from sapo_node.curriculum import Curriculum
        from sapo_node.share import Checker

        self.config, self.seed, self.accuracy, self.groups = config, seed, accuracy, groups
        self.curriculum = Curriculum(config.tasks.families, config.curriculum)
        self.transport = transport
        self.checker = Checker(config, transport.peer_id)
        self.label = f"solver-{accuracy:g}"

    def run_round(self, r: int) -> int:
        """Share round r's groups; returns how many were sent."""
        from sapo_node.share import line_of
        from sapo_node.solver import solve_round

        n = self.config.generation.completions_per_task
        sent = 0
        self.transport.round = r
        solved = solve_round(self.curriculum, self.seed, r, self.groups, n, self.accuracy)
        for task, texts in solved:
            checked = self.checker.check(line_of(task.ref, texts, model=self.label), r)
            if not checked.ok:  # a solver answer this node's own checks refuse: say so
                log.warning("solver group refused", reason=checked.reason, detail=checked.detail)
                continue
            sent += self.transport.publish(checked.data)
        return sent

    def close(self) -> None:
        self.checker.close()
        self.transport.close()


def _run_swarm(spec, a: Arm, out: Path, indices: list[int], stop, progress) -> bool:
    from sapo_node.net.memory import MemoryHub
    from sapo_node.node import Node, Stopped

    e = spec.experiment
    rounds, every = e.rounds, e.checkpoint_every
    hub = MemoryHub()
    nodes: list[Node] = []
    evals: list[EvalLog] = []
    solver: SolverMember | None = None
    try:
        if a.solver is not None:
            replicate = indices[0] // e.nodes
            solver = SolverMember(
                node_config(spec, a, indices[0], out),
                node_seed(spec, SOLVER_INDEX + replicate),
                a.solver,
                e.solver_groups,
                Deferred(hub.join(f"solver-{replicate}")),
            )
        for i in indices:
            config = node_config(spec, a, i, out)
            data_dir = config.node.resolved_data_dir()
            data_dir.mkdir(parents=True, exist_ok=True)
            _share_model_cache(out, data_dir)
            with _locked(out / ".models.lock"):  # one de-quantises, the others reuse it
                node = Node(config, stop=stop, transport=Deferred(hub.join(f"node-{i}")))
            nodes.append(node)
            node.resume()
            node.transport.unpark(data_dir / PARKED)
            evals.append(EvalLog(data_dir / "eval.jsonl"))
            evals[-1].keep_up_to(node.round)
        _evaluate_due(spec, nodes, evals, indices, stop, progress, a, out)
        for r in range(min(n.round for n in nodes), rounds):
            for node in nodes:
                if node.round != r or stop.is_set():
                    continue
                node.transport.round = r
                try:
                    record = node.run_round(r)
                except Stopped:
                    node.transport.discard(r)
                    break
                node.metrics.append(record)
                node.round += 1
                if node.round % every == 0 or node.round == rounds:
                    node.save()
                progress(
                    f"{a.label} node {indices[nodes.index(node)]} round {r}: "
                    f"reward {record['reward_mean']:.3f} ({record['t_round']:.1f} s)"
                )
            if stop.is_set():
                return False
            if solver is not None:
                solver.run_round(r)
                solver.transport.flush(r)
            for node in nodes:
                node.transport.flush(r)
            _evaluate_due(spec, nodes, evals, indices, stop, progress, a, out)
        return not stop.is_set()
    finally:
        for node in nodes:
            if node.round % every != 0 and node.round != rounds:
                node.save()
            node.transport.park(node.data_dir / PARKED)
            node.close()
            node.transport.close()
        if solver is not None:
            solver.close()


def _evaluate_due(spec, nodes, evals, indices, stop, progress, a: Arm, out: Path) -> None:
    """Evaluate the nodes that are due. Before training, node i is the same model in every
    configuration (same seed, same weights, the sampling RNG fixed by eval.seed): its
    start evaluation is computed once, kept in OUT/start-eval/, and reused by the others."""
    for node, log_, index in zip(nodes, evals, indices, strict=True):
        if stop.is_set() or not eval_due(spec, node.round) or node.round in log_.rounds():
            continue
        kept = out / START_EVALS / f"node-{index}.json"
        if node.round == 0 and kept.exists():
            log_.append(json.loads(kept.read_text(encoding="utf-8")))
            continue
        report = node.evaluate()
        if stop.is_set():
            return
        record = {"round": node.round, **report.metrics()}
        log_.append(record)
        if node.round == 0:
            from sapo_node.checkpoint import write_text_atomic

            kept.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(kept, json.dumps(record) + "\n")
        progress(
            f"{a.label} node {index} held-out eval after {node.round} rounds: "
            f"greedy {report.metrics()['eval/greedy']:.3f}, "
            f"pass@1 {report.metrics()['eval/pass1']:.3f} ({report.seconds:.1f} s)"
        )


def _share_model_cache(out: Path, data_dir: Path) -> None:
    """Point the node's model cache at one shared directory (one de-quantised copy)."""
    shared = out / ".models"
    shared.mkdir(parents=True, exist_ok=True)
    link = data_dir / "models"
    if not link.exists() and not link.is_symlink():
        link.symlink_to(shared.resolve(), target_is_directory=True)


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def check_resumable(spec: ExperimentSpec, out: Path) -> None:
    """Write OUT/experiment.json, or check that a run already there is this one (rounds
    may grow; anything else would mix two experiments in one table)."""
    from sapo_node.checkpoint import write_text_atomic

    path = out / "experiment.json"
    mine = json.loads(spec.model_dump_json())
    if path.exists():
        theirs = json.loads(path.read_text(encoding="utf-8"))
        a, b = dict(theirs), dict(mine)
        older = set(b["experiment"]) - set(a["experiment"])  # keys added since it was written
        for d in (a, b):
            d["experiment"] = {
                k: v
                for k, v in d["experiment"].items()
                if k not in ("rounds", "threads", "window", "sampling", "grid", "solver")
                and k not in older
            }
        if a != b:
            diff = sorted(
                f"{s}.{k}"
                for s in set(a) | set(b)
                for k in set(a.get(s, {})) | set(b.get(s, {}))
                if a.get(s, {}).get(k) != b.get(s, {}).get(k)
            )
            raise ConfigError(
                f"{out} holds another experiment (it differs in {', '.join(diff)}); "
                "pass another --out"
            )
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(mine, indent=2) + "\n")


# --- analysis (pure) ---------------------------------------------------------------------


def node_summary(rows: Sequence[dict[str, Any]], evals: Sequence[dict[str, Any]], rounds: int):
    """One node's figures from its metrics rows and evaluations."""
    done = [r for r in rows if r["round"] < rounds]
    by_round = {int(e["round"]): e for e in evals}
    start, end = by_round.get(0), by_round.get(rounds)
    return {
        "rounds": len(done),
        "cumulative_reward": sum(r["reward_mean"] for r in done),
        "rewards": [r["reward_mean"] for r in sorted(done, key=lambda r: r["round"])],
        "format_rates": [
            r.get("answer_tag_rate", 0.0) for r in sorted(done, key=lambda r: r["round"])
        ],
        "new_tokens": sum(r.get("new_tokens", 0) for r in done),
        "node_seconds": sum(r.get("t_round", 0.0) for r in done),
        "eval_start": _eval_brief(start),
        "eval_end": _eval_brief(end),
        "evals": [_eval_brief(by_round[k]) | {"round": k} for k in sorted(by_round)],
        "halves": [mechanism_sums(h) for h in halves(done, rounds)],
    }


# What sharing did, from the rows' per-round facts (node.Node._record): own and peers'
# groups by outcome, the peers' groups' reward and age, and the gradient clip.
OUTCOMES = ("all_wrong", "all_right", "signal")


def halves(rows: Sequence[dict[str, Any]], rounds: int) -> list[list[dict[str, Any]]]:
    """The rows of rounds 0..R/2-1 and of R/2..R-1 (R = ``rounds``; R/2 rounded down).

    >>> [[r["round"] for r in h] for h in halves([{"round": r} for r in range(5)], 5)]
    [[0, 1], [2, 3, 4]]
    """
    mid = rounds // 2
    return [
        [r for r in rows if r["round"] < mid],
        [r for r in rows if mid <= r["round"] < rounds],
    ]


def mechanism_sums(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Sums over metrics rows from which ``mechanism`` pools nodes: group counts by
    outcome, and each mean's numerator and weight. Rows without a fact (older metrics,
    rounds with no peers' group or no step: null or absent) add nothing to it."""
    out: dict[str, float] = dict.fromkeys(
        [f"{side}_{kind}" for side in ("local", "external") for kind in OUTCOMES], 0
    )
    out |= dict.fromkeys(
        ("external_reward", "external_reward_groups", "steps", "clipped_steps", "grad_norm")
        + ("grad_norm_rounds", "age_rounds", "age_groups"),
        0.0,
    )
    for r in rows:
        for side in ("local", "external"):
            for kind in OUTCOMES:
                out[f"{side}_{kind}"] += r.get(f"{side}_groups_{kind}", 0)
        n = r.get("external_groups", 0)
        if r.get("external_reward_mean") is not None:
            out["external_reward"] += r["external_reward_mean"] * n
            out["external_reward_groups"] += n
        if r.get("train/grad_clipped") is not None:
            out["steps"] += r["train/steps"]
            out["clipped_steps"] += r["train/grad_clipped"] * r["train/steps"]
        if r.get("train/grad_norm_max") is not None:
            out["grad_norm"] += r["train/grad_norm_max"]
            out["grad_norm_rounds"] += 1
        if r.get("external_age_rounds") is not None:
            out["age_rounds"] += r["external_age_rounds"] * n
            out["age_groups"] += n
    return out


def mechanism(nodes: Sequence[dict[str, Any]], half: int, rounds: int) -> dict[str, Any]:
    """One half of the run over a configuration's nodes, pooled over nodes and rounds.

    Shares of own (``local_*``) and peers' (``external_*``) groups by outcome;
    ``external_reward``: mean reward of the peers' groups trained on (each round's mean
    weighted by its groups); ``clipped``: share of optimiser steps whose gradient the clip
    scaled down; ``grad_norm``: mean over rounds with a step of the round's largest
    gradient norm before clipping; ``age_rounds``: mean age of the peers' groups trained
    on, in the node's rounds. None where nothing was measured.
    """
    t: dict[str, float] = {}
    for n in nodes:
        for k, v in n["halves"][half].items():
            t[k] = t.get(k, 0.0) + v
    mid = rounds // 2
    out: dict[str, Any] = {"rounds": [0, mid - 1] if half == 0 else [mid, rounds - 1]}
    for side in ("local", "external"):
        total = sum(t.get(f"{side}_{kind}", 0.0) for kind in OUTCOMES)
        out[f"{side}_groups"] = int(total)
        for kind in OUTCOMES:
            out[f"{side}_{kind}"] = _ratio(t.get(f"{side}_{kind}", 0.0), total)
    out["external_reward"] = _ratio(t.get("external_reward", 0.0), t.get("external_reward_groups"))
    out["steps"] = int(t.get("steps", 0))
    out["clipped"] = _ratio(t.get("clipped_steps", 0.0), t.get("steps"))
    out["grad_norm"] = _ratio(t.get("grad_norm", 0.0), t.get("grad_norm_rounds"))
    out["age_rounds"] = _ratio(t.get("age_rounds", 0.0), t.get("age_groups"))
    return out


def _ratio(x: float, n: float | None) -> float | None:
    return x / n if n else None


def _eval_brief(e: dict[str, Any] | None) -> dict[str, Any] | None:
    if e is None:
        return None
    keep = {k: v for k, v in e.items() if k.startswith("eval/")}
    return {
        "greedy": e["eval/greedy"],
        "pass1": e["eval/pass1"],
        "answer_tag_rate": e["eval/answer_tag_rate"],
        "per_task_greedy": keep.get("eval/per_task_greedy", []),
        "per_task_pass1": keep.get("eval/per_task_pass1", []),
        "families": {
            k.removeprefix("eval/greedy/"): v
            for k, v in keep.items()
            if k.startswith("eval/greedy/")
        },
    }


def heldout_summary(nodes: Sequence[dict[str, Any]], which: str) -> dict[str, Any] | None:
    """Held-out accuracy over tasks x nodes: greedy with a Wilson interval, pass@1 with a
    percentile bootstrap over the (node, task) cells. At the start (``eval_start``) every
    node is the same untrained model under the same eval seed: copies of its answers are
    not independent cells, so identical start evaluations count once (``models``: how
    many distinct evaluations were pooled)."""
    evals = [n[which] for n in nodes]
    if not evals or any(e is None for e in evals):
        return None
    if which == "eval_start":
        distinct = {json.dumps([e["per_task_greedy"], e["per_task_pass1"]]): e for e in evals}
        evals = list(distinct.values())
    greedy = [x for e in evals for x in e["per_task_greedy"]]
    pass1 = [x for e in evals for x in e["per_task_pass1"]]
    return {
        "greedy": sum(greedy) / len(greedy) if greedy else 0.0,
        "greedy_ci95": list(wilson_interval(int(sum(greedy)), len(greedy))),
        "pass1": sum(pass1) / len(pass1) if pass1 else 0.0,
        "pass1_ci95": list(bootstrap_interval(pass1)),
        "cells": len(greedy),
        "models": len(evals),
    }


FORMAT_WINDOW = 10  # the early rounds over which the answer-format rate is compared
FORMAT_TARGET = 0.9  # "has the format": this share of a round's own completions


def format_summary(nodes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How fast the nodes wrote in the answer format: the mean rate over the first
    rounds, and the first round where the nodes' mean rate reached FORMAT_TARGET.

    >>> format_summary([{"format_rates": [0.5, 1, 1]}, {"format_rates": [0.25, 0.75, 1]}])
    {'early': 0.75, 'first_round_at_target': 2, 'curve': [0.375, 0.875, 1.0]}
    """
    curves = [n["format_rates"] for n in nodes if n.get("format_rates")]
    if not curves:
        return {"early": None, "first_round_at_target": None, "curve": []}
    length = min(len(c) for c in curves)
    curve = [sum(c[r] for c in curves) / len(curves) for r in range(length)]
    early = curve[:FORMAT_WINDOW]
    first = next((r for r, x in enumerate(curve) if x >= FORMAT_TARGET), None)
    return {"early": sum(early) / len(early), "first_round_at_target": first, "curve": curve}


def analyse(spec: ExperimentSpec, data: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The results: per configuration (label -> node summaries, in node order) the totals,
    ratio to J = 0 and paired sign-flip tests against J = 0 by node seed; a configuration
    with a solver member is also tested against the same I/J without one."""
    rounds = spec.experiment.rounds
    order = [a for a in arms(spec) if a.label in data]
    baseline = next(
        (a for a in order if a.external == 0 and a.sampling is None and a.solver is None), None
    )
    base_nodes = data.get(baseline.label) if baseline else None
    out: dict[str, Any] = {"rounds": rounds, "configurations": []}
    for a in order:
        nodes = data[a.label]
        complete = all(n["rounds"] == rounds and n["eval_end"] is not None for n in nodes)
        total = sum(n["cumulative_reward"] for n in nodes)
        entry: dict[str, Any] = {
            "label": a.label,
            "local": a.local,
            "external": a.external,
            "sampling": a.sampling or spec.base.get("pool", {}).get("sampling", "paper"),
            "complete": complete,
            "rounds_done": min((n["rounds"] for n in nodes), default=0),
            "cumulative_reward": total,
            "new_tokens": sum(n["new_tokens"] for n in nodes),
            "node_seconds": sum(n["node_seconds"] for n in nodes),
            "heldout_start": heldout_summary(nodes, "eval_start"),
            "heldout_end": heldout_summary(nodes, "eval_end"),
            "format": format_summary(nodes),
            "mechanism": [mechanism(nodes, h, rounds) for h in (0, 1)],
            "solver": a.solver,
            "nodes": nodes,
        }
        if base_nodes is not None and a is not baseline:
            entry |= _versus(nodes, base_nodes)
        plain = next(
            (p for p in order if p.ratio == a.ratio and p.sampling is None and p.solver is None),
            None,
        )
        if a.solver is not None and plain is not None:
            entry["versus_plain"] = {"label": plain.label, **_versus(nodes, data[plain.label])}
        out["configurations"].append(entry)
    base_total = next(
        (
            c["cumulative_reward"]
            for c in out["configurations"]
            if baseline and c["label"] == baseline.label
        ),
        None,
    )
    for c in out["configurations"]:
        c["ratio"] = c["cumulative_reward"] / base_total if base_total else None
    n = len(base_nodes or [])
    out["pairs"] = n
    out["smallest_p"] = smallest_p(n)
    return out


def _versus(nodes, base_nodes) -> dict[str, Any]:
    """Paired by node seed (same index, same seed): per-node differences and their p."""
    reward = [
        x["cumulative_reward"] - b["cumulative_reward"]
        for x, b in zip(nodes, base_nodes, strict=True)
    ]
    out: dict[str, Any] = {"p_reward": sign_flip_p(reward), "diff_reward": reward}
    if all(x["eval_end"] and b["eval_end"] for x, b in zip(nodes, base_nodes, strict=True)):
        acc = [
            x["eval_end"]["greedy"] - b["eval_end"]["greedy"]
            for x, b in zip(nodes, base_nodes, strict=True)
        ]
        out |= {"p_heldout": sign_flip_p(acc), "diff_heldout": acc}
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _ci(h: dict[str, Any] | None, key: str) -> str:
    if h is None:
        return "–"
    lo, hi = h[f"{key}_ci95"]
    return f"{_pct(h[key])} [{_pct(lo)}, {_pct(hi)}]"


def render_table(results: dict[str, Any]) -> str:
    """The markdown report: the paper's table plus held-out accuracy, tests and costs."""
    lines = [
        f"# SAPO experiment: {results['rounds']} rounds per node",
        "",
        "| I / J | sampling | cumulative reward | vs J=0 | p (reward) | held-out greedy, start "
        "| held-out greedy, end [95% CI] | held-out pass@1, end [95% CI] | p (held-out) "
        "| generated tokens | node-seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in results["configurations"]:
        label = _label(c) + ("" if c["complete"] else f" ({c['rounds_done']} rounds)")
        ratio = f"{c['ratio']:.2f}x" if c.get("ratio") is not None else "–"
        start = _pct(c["heldout_start"]["greedy"]) if c["heldout_start"] else "–"
        lines.append(
            f"| {label} | {c['sampling']} | {c['cumulative_reward']:.2f} | {ratio} "
            f"| {_p(c.get('p_reward'))} | {start} | {_ci(c['heldout_end'], 'greedy')} "
            f"| {_ci(c['heldout_end'], 'pass1')} | {_p(c.get('p_heldout'))} "
            f"| {c['new_tokens']:,} | {_seconds(c['node_seconds'])} |"
        )
    n = results["pairs"]
    lines += [
        "",
        "- Cumulative reward: each node's mean own-completion reward per round, summed over "
        "rounds and nodes (the paper's measure).",
        "- Held-out: the fixed evaluation set (seeds no node trains on), every node at the "
        "start (before training) and after the last round. Greedy accuracy with a Wilson 95% "
        "interval over tasks x nodes; pass@1 (mean of the sampled completions) with a "
        "percentile bootstrap 95% interval over the (node, task) cells. Both intervals treat "
        "cells as independent, which nodes of one swarm and tasks of one set are not quite.",
        f"- p: exact two-sided sign-flip permutation test against J = 0, paired by node seed "
        f"over {n} pairs (replicates pooled), on per-node cumulative reward and on per-node "
        f"final greedy held-out accuracy. With {n} pairs the smallest possible p is "
        f"{results['smallest_p']:.4g}. Nodes of one swarm interact, so the pairs are not "
        "independent: read p as descriptive.",
        "- Costs: tokens generated by the nodes' own rollouts and wall seconds of their "
        "rounds, summed over nodes (evaluation excluded; it is the same for every "
        "configuration).",
    ]
    lines += _format_table(results)
    lines += _mechanism_table(results)
    return "\n".join(lines) + "\n"


def _mechanism_table(results: dict[str, Any]) -> list[str]:
    """What sharing did, per configuration and half of the run (``mechanism``)."""
    lines = [
        "",
        "## What sharing did, by half of the run",
        "",
        "| I / J | sampling | rounds | own groups: all wrong / all right / signal "
        "| external groups: all wrong / all right / signal | external reward "
        "| steps clipped | grad norm | external age (rounds) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def shares(m: dict[str, Any], side: str) -> str:
        if not m[f"{side}_groups"]:
            return "–"
        return " / ".join(_pct(m[f"{side}_{kind}"]) for kind in OUTCOMES)

    def num(x: float | None, digits: int) -> str:
        return "–" if x is None else f"{x:.{digits}f}"

    for c in results["configurations"]:
        for m in c.get("mechanism") or []:
            lo, hi = m["rounds"]
            clipped = "–" if m["clipped"] is None else _pct(m["clipped"])
            lines.append(
                f"| {_label(c)} | {c['sampling']} | {lo}-{hi} | {shares(m, 'local')} "
                f"| {shares(m, 'external')} | {num(m['external_reward'], 3)} | {clipped} "
                f"| {num(m['grad_norm'], 2)} | {num(m['age_rounds'], 2)} |"
            )
    lines += [
        "",
        "- Pooled over the nodes and rounds of each half. Groups: those trained on, own and "
        "peers' (after the poisoning screen), by outcome: signal (rewards differ), else all "
        "right (every reward counts as correct) or all wrong.",
        "- External reward: mean reward of the peers' groups' completions trained on. Steps "
        "clipped: share of optimiser steps whose gradient norm exceeded the clip. Grad norm: "
        "mean over rounds with a step of the norm before clipping. External age: rounds "
        "from a peer's group entering the pool to the round that trained on it.",
    ]
    return lines


def _label(c: dict[str, Any]) -> str:
    ratio = c["label"].split(" ")[0]
    return f"{ratio} + solver ({c['solver']:g})" if c.get("solver") is not None else ratio


def _format_table(results: dict[str, Any]) -> list[str]:
    """The answer format of the nodes' own completions, and the solver comparisons."""
    lines = [
        "",
        "## Answer format and the solver member",
        "",
        f"| I / J | sampling | format rate, rounds 0-{FORMAT_WINDOW - 1} "
        f"| first round at {_pct(FORMAT_TARGET)} | vs same I/J without solver: "
        "reward diff (p) | held-out diff (p) |",
        "|---|---|---|---|---|---|",
    ]
    for c in results["configurations"]:
        f = c.get("format") or {}
        early = _pct(f["early"]) if f.get("early") is not None else "–"
        first = f.get("first_round_at_target")
        versus = c.get("versus_plain")
        if versus:
            reward = f"{sum(versus['diff_reward']):+.2f} ({_p(versus['p_reward'])})"
            held = (
                f"{100 * sum(versus['diff_heldout']) / len(versus['diff_heldout']):+.1f} pt "
                f"({_p(versus['p_heldout'])})"
                if versus.get("diff_heldout")
                else "–"
            )
        else:
            reward = held = "–"
        lines.append(
            f"| {_label(c)} | {c['sampling']} | {early} | {'never' if first is None else first} "
            f"| {reward} | {held} |"
        )
    lines += [
        "",
        "- Format rate: share of the nodes' own completions with a complete "
        "`<answer>...</answer>` (mean over nodes per round). A solver member (solver.py) "
        "shares groups in that format with the given accuracy; the nodes train on them only "
        "through the pool, like any peer's.",
        "- vs same I/J: paired by node seed, the sum over nodes of the cumulative-reward "
        "difference and the mean final held-out greedy difference, with the sign-flip p.",
    ]
    return lines


def _seconds(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def _p(p: float | None) -> str:
    return "–" if p is None else f"{p:.3g}"


def plot_results(results: dict[str, Any], out: Path, window: int) -> list[Path]:
    """reward_curves.png (mean reward of the nodes per round, moving average) and
    heldout.png (greedy held-out accuracy at each evaluation)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sapo_node.plot import moving_average

    written = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for c in results["configurations"]:
        curves = [n["rewards"] for n in c["nodes"] if n["rewards"]]
        if not curves:
            continue
        length = min(len(x) for x in curves)
        mean = [sum(x[r] for x in curves) / len(curves) for r in range(length)]
        (line,) = ax.plot(range(length), moving_average(mean, window), label=c["label"])
        ax.plot(range(length), mean, color=line.get_color(), alpha=0.2, lw=0.8)
    ax.set(
        xlabel="round",
        ylabel=f"reward (mean over nodes, moving average {window})",
        title="Reward of own completions",
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    written.append(_save(fig, out / "reward_curves.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    for c in results["configurations"]:
        points: dict[int, list[float]] = {}
        for n in c["nodes"]:
            for e in n["evals"]:
                points.setdefault(e["round"], []).append(e["greedy"])
        xs = sorted(points)
        if xs:
            ax.plot(xs, [sum(points[x]) / len(points[x]) for x in xs], "o-", label=c["label"])
    ax.set(xlabel="rounds trained", ylabel="held-out greedy accuracy", title="Held-out accuracy")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    written.append(_save(fig, out / "heldout.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    for c in results["configurations"]:
        curve = (c.get("format") or {}).get("curve") or []
        if curve:
            ax.plot(range(len(curve)), curve, label=_label(c))
    ax.set(
        xlabel="round",
        ylabel="own completions in the answer format",
        title="Answer format (mean over nodes)",
        ylim=(0, 1.02),
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    written.append(_save(fig, out / "answer_format.png"))
    return written


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


def collect(spec: ExperimentSpec, out: Path) -> dict[str, list[dict[str, Any]]]:
    """Node summaries of every configuration that has started, from OUT's files."""
    from sapo_node.metrics import read_metrics

    e = spec.experiment
    data: dict[str, list[dict[str, Any]]] = {}
    for a in arms(spec):
        dirs = [out / a.dirname / f"node-{i}" for i in range(e.nodes * e.replicates)]
        if not any((d / "metrics.jsonl").exists() or (d / "eval.jsonl").exists() for d in dirs):
            continue
        nodes = []
        for i, d in enumerate(dirs):
            rows = read_metrics(d / "metrics.jsonl") if (d / "metrics.jsonl").exists() else []
            summary = node_summary(rows, EvalLog(d / "eval.jsonl").read(), e.rounds)
            nodes.append({"index": i, "seed": node_seed(spec, i), **summary})
        data[a.label] = nodes
    return data


def report(spec: ExperimentSpec, out: Path) -> dict[str, Any]:
    """Write results.json, results.md and the plots from what OUT holds; return results."""
    from sapo_node.checkpoint import write_text_atomic

    results = analyse(spec, collect(spec, out))
    write_text_atomic(out / "results.json", json.dumps(results, indent=1, allow_nan=False) + "\n")
    write_text_atomic(out / "results.md", render_table(results))
    if results["configurations"]:
        plot_results(results, out, spec.experiment.window)
    return results


def run_experiment(
    spec: ExperimentSpec,
    out: Path,
    *,
    only: Sequence[str] = (),
    stop: threading.Event | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> bool:
    """Run (or continue) the chosen configurations, then write the report; False if a
    stop came first (the report is written from what finished)."""
    stop = stop or threading.Event()
    check_resumable(spec, out)
    chosen = [arm(spec, label) for label in only] if only else arms(spec)
    finished = True
    try:
        for a in chosen:
            if not run_arm(spec, a, out, stop, progress=progress):
                finished = False
                break
    finally:
        with _locked(out / ".report.lock"):
            report(spec, out)
    return finished and not stop.is_set()
