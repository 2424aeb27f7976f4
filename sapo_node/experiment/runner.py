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
    SOLVER_INDEX,
    Arm,
    EvalLog,
    ExperimentSpec,
    arm,
    arms,
    eval_due,
    node_config,
    node_seed,
)
from sapo_node.ops.lifecycle import cap_kernel_caches, fix_mmap_threshold

log = structlog.get_logger(__name__)

PARKED = "in-flight.json"  # messages between nodes when a run stopped
START_EVALS = "start-eval"  # OUT/start-eval/node-<i>.json: node i's evaluation before training


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


def _run_swarm(spec, a: Arm, out: Path, indices: list[int], stop, progress) -> bool:
    from sapo_node.build import build_node
    from sapo_node.net.memory import MemoryHub
    from sapo_node.node import Node, Stopped

    e = spec.experiment
    rounds, every = e.rounds, e.checkpoint_every
    hub = MemoryHub()
    clock = RoundClock(e.round_s)
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
                Deferred(hub.join(f"solver-{replicate}"), clock.now),
                clock.now,
            )
        for i in indices:
            config = node_config(spec, a, i, out)
            data_dir = config.node.resolved_data_dir()
            data_dir.mkdir(parents=True, exist_ok=True)
            _share_model_cache(out, data_dir)
            with _locked(out / ".models.lock"):  # one de-quantises, the others reuse it
                node = build_node(
                    config,
                    stop=stop,
                    transport=Deferred(hub.join(f"node-{i}"), clock.now),
                    clock=clock.now,
                )
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
                node.transport.round = clock.round = r
                try:
                    record = node.run_round(r)
                except Stopped:
                    node.transport.discard(r)
                    break
                node.metrics.append(record)
                node.round += 1
                if node.round % every == 0 or node.round == rounds:
                    node.save()
                unfilled = record.get("train/j_unfilled_expired", 0)
                progress(
                    f"{a.label} node {indices[nodes.index(node)]} round {r}: "
                    f"reward {record['reward/mean']:.3f} ({record['phase_s/round']:.1f} s)"
                    + (f"; J unfilled by {unfilled}: peers' groups expired" if unfilled else "")
                )
            if stop.is_set():
                return False
            if solver is not None:
                clock.round = r
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
        if node.round > 0:
            _evaluate(node, log_, index, progress, a)
            continue
        # configurations run side by side (--only) take turns: one evaluates, the rest reuse
        kept = out / START_EVALS / f"node-{index}.json"
        with _locked(kept.with_suffix(".lock")):
            if kept.exists():
                log_.append(json.loads(kept.read_text(encoding="utf-8")))
                continue
            record = _evaluate(node, log_, index, progress, a)
            if record is not None:
                from sapo_node.checkpoint import write_text_atomic

                write_text_atomic(kept, json.dumps(record) + "\n")


def _evaluate(node, log_: EvalLog, index: int, progress, a: Arm) -> dict[str, Any] | None:
    """Evaluate one node and log it; None if a stop cut it short."""
    report = node.evaluate()
    if node.stop.is_set():
        return None
    record = {"round": node.round, **report.metrics()}
    log_.append(record)
    progress(
        f"{a.label} node {index} held-out eval after {node.round} rounds: "
        f"greedy {report.metrics()['eval/greedy']:.3f}, "
        f"pass@1 {report.metrics()['eval/pass1']:.3f} ({report.seconds:.1f} s)"
    )
    return record


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
