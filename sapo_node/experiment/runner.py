"""The experiment's runner: lockstep swarms of nodes in one process, one configuration
after another, each resumable from its checkpoints; then the report."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from sapo_node.config import Config, ConfigError
from sapo_node.experiment.report import report
from sapo_node.experiment.spec import (
    AT_JOIN,
    MEMBER_INDEX,
    SOLVER_INDEX,
    Arm,
    EvalLog,
    ExperimentSpec,
    arm,
    arms,
    eval_due,
    eval_samples,
    member_config,
    node_config,
    node_seed,
)
from sapo_node.ops.lifecycle import cap_kernel_caches, fix_mmap_threshold

log = structlog.get_logger(__name__)

PARKED = "in-flight.json"  # messages between nodes when a run stopped
START_EVALS = "start-eval"  # OUT/start-eval/<key>.json: the untrained model's evaluation


class Deferred:
    """A transport whose publications wait for ``flush(r)``: the lockstep barrier.

    Every node of round r publishes into its own queue; after all of them ran round r
    the queues are delivered, so every node sees its peers' round r in round r + 1,
    whatever its place in the order. A stop keeps what is in flight (``park``), and a
    resume puts it back (``unpark``), so a stopped experiment sees the same messages in
    the same rounds as one that was never stopped. What it delivers arrives, on the
    experiment's clock, when the node takes it in (``clock``).
    """

    def __init__(self, inner: Any, clock: Callable[[], float]) -> None:
        self.inner, self.clock = inner, clock
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
        return [dataclasses.replace(m, received_at=self.clock()) for m in self.inner.received()]

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


class RoundClock:
    """The nodes' clock in an experiment: ``EPOCH`` plus ``round_s`` seconds a round.

    Pool ages, the defence's deadlines and shared groups' creation times then follow the
    lockstep rounds, so a slow or loaded machine cannot expire a peer's group that a fast
    one would have trained on: a group made in round r is ``k * round_s`` seconds old in
    round r + k, on any machine, and a resume sees the same times again."""

    EPOCH = 1.8e9  # 2027-01-15 UTC: any fixed instant; only differences matter

    def __init__(self, round_s: float) -> None:
        self.round_s = round_s
        self.round = 0

    def now(self) -> float:
        return self.EPOCH + self.round * self.round_s


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
    if e.late_joiner is not None:
        return _run_late_joiners(spec, a, out, stop, progress)
    for rep in range(e.replicates):
        indices = list(range(rep * e.nodes, (rep + 1) * e.nodes))
        if _swarm_done(spec, a, out, indices):
            continue
        seats = [_seat(spec, a, out, i) for i in indices]
        solver = None
        if a.solver is not None:
            config = node_config(spec, a, indices[0], out)
            solver = (config, node_seed(spec, SOLVER_INDEX + rep), a.solver, f"solver-{rep}")
        if not _run_swarm(spec, a.label, seats, e.rounds, 0, out, stop, progress, solver):
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


@dataclasses.dataclass
class Seat:
    """A node's place in a lockstep swarm: its config, its name on the swarm's transport
    and in the progress lines, the rounds it had trained at the swarm's first step, and
    which evaluations it takes (``due``: after how many rounds; None: none; ``periodic``:
    those between the start and the end with ``periodic_samples``)."""

    name: str
    config: Config
    first: int = 0
    due: Callable[[int], bool] | None = None
    periodic: bool = True


def _seat(spec: ExperimentSpec, a: Arm, out: Path, index: int) -> Seat:
    """Compared node ``index`` of configuration ``a``, evaluated as the spec says."""
    return Seat(f"node-{index}", node_config(spec, a, index, out), 0, lambda r: eval_due(spec, r))


class SolverMember:
    """A swarm's member that trains nothing and runs no model: every round it shares
    ``groups`` tasks of the nodes' curriculum, solved by solver.py, each line checked as
    ``sapo-node share`` checks it (share.py) and sent as the bytes that were checked.
    Stateless but for its seed: round r's groups are the same however often it resumes."""

    def __init__(self, config: Config, seed: int, accuracy: float, groups: int, transport, clock):
        from sapo_node.curriculum import Curriculum
        from sapo_node.share import Checker

        self.config, self.seed, self.accuracy, self.groups = config, seed, accuracy, groups
        self.curriculum = Curriculum(config.tasks.families, config.curriculum)
        self.transport = transport
        self.checker = Checker(config, transport.peer_id, clock=clock)
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


def _run_swarm(
    spec: ExperimentSpec,
    label: str,
    seats: list[Seat],
    steps: int,
    clock_start: int,
    out: Path,
    stop: threading.Event,
    progress: Callable[[str], None],
    solver: tuple[Config, int, float, str] | None = None,
) -> bool:
    """Run ``steps`` lockstep rounds of one swarm (or what a resume has left of them):
    at step s every seat runs its round ``first + s``, then what they published is
    delivered. The swarm's clock reads round ``clock_start + s``, so a swarm resumed
    from another run's checkpoints goes on with that run's times. False if stopped."""
    from sapo_node.build import build_node
    from sapo_node.net.memory import MemoryHub
    from sapo_node.node import Node, Stopped

    e = spec.experiment
    every = e.checkpoint_every
    hub = MemoryHub()
    clock = RoundClock(e.round_s)
    nodes: list[Node] = []
    evals: list[EvalLog] = []
    member: SolverMember | None = None
    try:
        if solver is not None:  # (config, seed, accuracy, name on the transport)
            config, seed, accuracy, name = solver
            member = SolverMember(
                config,
                seed,
                accuracy,
                e.solver_groups,
                Deferred(hub.join(name), clock.now),
                clock.now,
            )
        for seat in seats:
            data_dir = seat.config.node.resolved_data_dir()
            data_dir.mkdir(parents=True, exist_ok=True)
            _share_model_cache(out, data_dir)
            with _locked(out / ".models.lock"):  # one de-quantises, the others reuse it
                node = build_node(
                    seat.config,
                    stop=stop,
                    transport=Deferred(hub.join(seat.name), clock.now),
                    clock=clock.now,
                )
            nodes.append(node)
            node.resume()
            node.transport.unpark(data_dir / PARKED)
            evals.append(EvalLog(data_dir / "eval.jsonl"))
            evals[-1].keep_up_to(node.round)
        _evaluate_due(spec, seats, nodes, evals, stop, progress, label, out)
        done = min(n.round - seat.first for n, seat in zip(nodes, seats, strict=True))
        if done > 0:  # a stop after every node ran a step, before its delivery: deliver now
            for node in nodes:
                node.transport.flush(clock_start + done - 1)
        for s in range(done, steps):
            g = clock_start + s  # the swarm's round: its clock and its deliveries
            for node, seat in zip(nodes, seats, strict=True):
                r = seat.first + s
                if node.round != r or stop.is_set():
                    continue
                node.transport.round = clock.round = g
                try:
                    record = node.run_round(r)
                except Stopped:
                    node.transport.discard(g)
                    break
                node.metrics.append(record)
                node.round += 1
                if node.round % every == 0 or node.round == seat.first + steps:
                    node.save()
                unfilled = record.get("train/j_unfilled_expired", 0)
                progress(
                    f"{label} {seat.name.replace('-', ' ')} round {r}: "
                    f"reward {record['reward/mean']:.3f} ({record['phase_s/round']:.1f} s)"
                    + (f"; J unfilled by {unfilled}: peers' groups expired" if unfilled else "")
                )
            if stop.is_set():
                return False
            if member is not None:
                clock.round = g
                member.run_round(g)
                member.transport.flush(g)
            for node in nodes:
                node.transport.flush(g)
            _evaluate_due(spec, seats, nodes, evals, stop, progress, label, out)
        return not stop.is_set()
    finally:
        for node, seat in zip(nodes, seats, strict=False):  # fewer nodes if a build failed
            if node.round % every != 0 and node.round != seat.first + steps:
                node.save()
            node.transport.park(node.data_dir / PARKED)
            node.close()
            node.transport.close()
        if member is not None:
            member.close()


def start_eval_key(config: Config) -> str:
    """What the evaluation of the untrained model depends on: the model and how it is
    loaded, generation, the tasks and levels (which make the held-out set) and the eval
    settings; with LoRA also the node seed (the adapter's initial weights). Nodes whose
    keys are equal answer the held-out set alike before training, whatever their seed."""
    import hashlib

    c = config
    parts = {
        "model": c.model.model_dump(mode="json"),
        "generation": c.generation.model_dump(mode="json"),
        "tasks": c.tasks.model_dump(mode="json"),
        "curriculum": c.curriculum.model_dump(mode="json"),
        "eval": c.eval.model_dump(mode="json"),
        "device": c.node.device,
        "threads": c.node.threads,
        "seed": c.node.seed if c.model.lora.enabled else None,
    }
    text = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _evaluate_due(spec, seats, nodes, evals, stop, progress, label: str, out: Path) -> None:
    """Evaluate the nodes that are due. Before training, every node of equal
    ``start_eval_key`` is the same model under the same eval seed: that evaluation is
    computed once, kept in OUT/start-eval/<key>.json, and reused by every node and
    configuration."""
    for seat, node, log_ in zip(seats, nodes, evals, strict=True):
        due = seat.due
        if stop.is_set() or due is None or not due(node.round) or node.round in log_.rounds():
            continue
        if node.round > 0:
            _evaluate(spec, seat, node, log_, progress, label)
            continue
        # configurations run side by side (--only) take turns: one evaluates, the rest reuse
        kept = out / START_EVALS / f"{start_eval_key(node.config)}.json"
        with _locked(kept.with_suffix(".lock")):
            if kept.exists():
                log_.append(json.loads(kept.read_text(encoding="utf-8")))
                continue
            record = _evaluate(spec, seat, node, log_, progress, label)
            if record is not None:
                from sapo_node.checkpoint import write_text_atomic

                write_text_atomic(kept, json.dumps(record) + "\n")


def _evaluate(spec, seat: Seat, node, log_: EvalLog, progress, label: str) -> dict[str, Any] | None:
    """Evaluate one node and log it; None if a stop cut it short."""
    from sapo_node.evaluate import evaluate

    samples = eval_samples(spec, node.round) if seat.periodic else node.config.eval.samples
    report = evaluate(
        node.policy, node.scorer, node.config, should_stop=node.stop.is_set, samples=samples
    )
    if node.stop.is_set():
        return None
    record = {"round": node.round, **report.metrics()}
    log_.append(record)
    progress(
        f"{label} {seat.name.replace('-', ' ')} held-out eval after {node.round} rounds: "
        f"greedy {record['eval/greedy']:.3f}"
        + ("" if record["eval/pass1"] is None else f", pass@1 {record['eval/pass1']:.3f}")
        + f" ({report.seconds:.1f} s, "
        f"{report.thread_seconds:.1f} s of its thread's CPU)"
    )
    return record


# --- late joiners -----------------------------------------------------------------------


def _run_late_joiners(spec: ExperimentSpec, a: Arm, out: Path, stop, progress) -> bool:
    """Every joiner of configuration ``a``: with J = 0 alone, else in a copy of its warm
    swarm, whose members go on training and sharing beside it (not evaluated: only the
    joiners are compared)."""
    e = spec.experiment
    lj = e.late_joiner
    assert lj is not None
    for k in range(e.replicates):
        if _swarm_done(spec, a, out, [k]):
            continue
        joiner = _seat(spec, a, out, k)
        if a.external == 0:
            if not _run_swarm(spec, a.label, [joiner], e.rounds, 0, out, stop, progress):
                return False
            continue
        w = k % lj.swarms
        warm = _warm_swarm(spec, w, out, stop, progress)
        if warm is None:
            return False
        here = out / a.dirname / f"swarm-{k}"
        members = []
        for m, src in enumerate(warm):
            dst = here / f"node-{m}"
            if not dst.exists():
                _copy_node(src, dst)
            seed = _stored_seed(dst)
            config = member_config(spec, dst, seed, lj.swarm_rounds + e.rounds)
            # the names of the warm-up: what the members pooled then keeps its authors
            members.append(Seat(f"swarm-{w}-member-{m}", config, lj.swarm_rounds))
        if not _run_swarm(
            spec, a.label, [*members, joiner], e.rounds, lj.swarm_rounds, out, stop, progress
        ):
            return False
    return True


def _warm_swarm(spec: ExperimentSpec, w: int, out: Path, stop, progress) -> list[Path] | None:
    """The data directories of warm swarm ``w``'s members at round ``swarm_rounds``, each
    with its checkpoint of that round and its evaluation then (OUT/swarm-<w>/): trained
    here, or copied from ``swarm_from``. None if a stop came first."""
    e = spec.experiment
    lj = e.late_joiner
    assert lj is not None
    home = out / f"swarm-{w}"
    dirs = [home / f"node-{m}" for m in range(e.nodes)]
    if (home / AT_JOIN).exists():
        return dirs
    if lj.swarm_from:
        source = Path(lj.swarm_from)
        for m, dst in enumerate(dirs):
            src = source / f"node-{w * e.nodes + m}"
            if not dst.exists():
                _check_source(src, lj.swarm_rounds)
                _copy_node(src, dst)
    else:
        seats = [
            Seat(
                f"swarm-{w}-member-{m}",
                member_config(
                    spec, d, node_seed(spec, MEMBER_INDEX + w * e.nodes + m), lj.swarm_rounds
                ),
                0,
                lambda r: r == lj.swarm_rounds,
                periodic=False,
            )
            for m, d in enumerate(dirs)
        ]
        if not _run_swarm(spec, f"warm-up {w}", seats, lj.swarm_rounds, 0, out, stop, progress):
            return None
    records = []
    for m, d in enumerate(dirs):
        log_ = EvalLog(d / "eval.jsonl")
        record = next((r for r in log_.read() if int(r["round"]) == lj.swarm_rounds), None)
        if record is None:  # a swarm from elsewhere, not evaluated then: evaluate it here
            record = _evaluate_checkpoint(spec, d, out, progress, f"warm-up {w} member {m}")
            if record is None:
                return None
            log_.append(record)
        records.append(record)
    from sapo_node.checkpoint import write_text_atomic

    write_text_atomic(home / AT_JOIN, json.dumps({"round": lj.swarm_rounds, "members": records}))
    return dirs


def _evaluate_checkpoint(spec, d: Path, out: Path, progress, name: str) -> dict[str, Any] | None:
    from sapo_node.evaluate import evaluate_checkpoint

    lj = spec.experiment.late_joiner
    _share_model_cache(out, d)
    config = member_config(spec, d, _stored_seed(d), lj.swarm_rounds)
    with _locked(out / ".models.lock"):
        report, what = evaluate_checkpoint(config)
    record = {"round": lj.swarm_rounds, **report.metrics()}
    progress(f"{name} held-out eval of {what}: greedy {record['eval/greedy']:.3f}")
    return record


def _check_source(src: Path, swarm_rounds: int) -> None:
    """A swarm_from node: its latest checkpoint must be of round ``swarm_rounds`` (its pool
    and the defence's state are taken as they are, so they must be of that round too)."""
    from sapo_node.checkpoint import CheckpointError, CheckpointStore

    try:
        latest = CheckpointStore(src).latest()
    except CheckpointError as exc:
        raise ConfigError(f"late_joiner.swarm_from: {exc}") from None
    if latest is None or latest.name != f"round-{swarm_rounds:06d}":
        found = "none" if latest is None else latest.name
        raise ConfigError(
            f"late_joiner.swarm_from: {src} needs its latest checkpoint at round "
            f"{swarm_rounds} (checkpoints/round-{swarm_rounds:06d}); it has {found}"
        )


def _copy_node(src: Path, dst: Path) -> None:
    """Copy a node's data directory (not its model link, lock or evaluations), whole or
    not at all: a copy cut short is redone."""
    import shutil

    tmp = dst.with_name(f".{dst.name}.copying")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(
        src, tmp, symlinks=True, ignore=shutil.ignore_patterns("models", "lock", "eval.jsonl")
    )
    tmp.rename(dst)


def _stored_seed(data_dir: Path) -> int:
    try:
        return int(json.loads((data_dir / "node.json").read_text(encoding="utf-8"))["seed"])
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"{data_dir}/node.json has no node seed ({exc})") from None


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


# what the report alone reads: a resume may change them
REPORT_ONLY_KEYS = ("thresholds", "confirmatory_runs_on_question", "question", "setting")


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
                and k not in REPORT_ONLY_KEYS
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
    cap_kernel_caches()  # the process's settings, for all its nodes (each logs so)
    fix_mmap_threshold()  # the process's allocator, for all its nodes (it logs so)
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
