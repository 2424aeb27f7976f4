"""The round loop of one SAPO node: Algorithm 1 of the paper.

Every round r the node
  1. takes up to J groups from the pool of what peers shared (decoded strictly and
     regenerated when they arrived, scored by this node's own verifier then or, if J
     was at 0, before the first draw that may take them: intake/checks.py),
  2. samples I + (J - taken) tasks of its own from its curriculum,
  3. generates L completions per task in batched calls,
  4. scores them with its own verifier in a sandboxed worker,
  5. shares them: one wire message per group (wire.py), published on the swarm's
     transport (net/); what peers sent meanwhile is checked into the pool,
  6. screens the peers' groups against poisoning: their completions with a positive
     advantage that carry text this node's own policy would not write are removed
     (defence.py),
  7. computes group advantages and drops groups without signal,
  8. takes one GRPO step (or ppo_epochs steps) on the mix, and
  9. records metrics, moves the curriculum, and checkpoints every N rounds.

Departures from the paper, and why:
- External groups are taken at the start of the round, not after generation, so that
  missing external slots are filled with own tasks in the same batched generate call.
- Groups whose rewards are all equal are dropped before the update: their advantage
  is zero, so they would cost a forward/backward pass for no gradient. The loss is still
  normalised over the whole round's batch (all I + J groups), so that dropping them
  does not rescale the step (``groups.TrainingSet``).
- A peer's completion is trained as this node would have written it: re-tokenised, cut
  to this node's token limit, closed with its end-of-turn token only if the peer says it
  finished, and scored as cut (intake/checks.py), so its reward is earned by what is trained.
- A curriculum moves each family's difficulty (the paper fixed it): the small models
  this daemon targets get no reward at all at ReasoningGym's default difficulty.
- Seeds derive from (node seed, round), so a resumed node replays the same stream.

A generating member (``train.enabled = false``) runs steps 2-5 only, with all I + J
tasks its own: it shares what its model writes, and never takes from the pool or trains.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import structlog
import torch

from sapo_node import __version__
from sapo_node.checkpoint import CheckpointError, CheckpointStore
from sapo_node.config import Config
from sapo_node.curriculum import Curriculum
from sapo_node.evaluate import EvalReport, evaluate
from sapo_node.groups import Group, training_set
from sapo_node.intake import wire
from sapo_node.intake.checks import Intake, Verdict
from sapo_node.intake.defence import Defence, bare_answer, cut_after_answer
from sapo_node.intake.demand import OwnGroupStats, choose_external
from sapo_node.intake.pool import Pool, PooledGroup
from sapo_node.metrics import MetricsLog
from sapo_node.net import NetStats, Transport
from sapo_node.record import age_record, finished_format_rate, log_round, round_record
from sapo_node.tasks import (
    Scorer,
    ScorerUnavailable,
    Task,
    build_messages,
    canonical_json,
    generator_of,
    make_task,
)
from sapo_node.train.policy import Completion, Policy
from sapo_node.train.trainer import Trainer, TrainStats

log = structlog.get_logger(__name__)


class Stopped(Exception):
    """A stop was requested mid-round; the round is abandoned, not recorded."""


class Progress:
    """Where the round loop is, for the status endpoint (status.py), which reads it from
    its own thread: the phase now, when a phase or round last finished (monotonic
    seconds) and how long the recent rounds took."""

    def __init__(self) -> None:
        self.phase = "starting"
        self.beat = time.monotonic()
        self.recent_rounds: deque[float] = deque(maxlen=10)
        self._open: list[str] = []

    def enter(self, name: str) -> None:
        self._open.append(name)
        self.phase = name

    def leave(self, name: str, seconds: float) -> None:
        self._open.pop()
        self.phase = self._open[-1] if self._open else "between rounds"
        self.beat = time.monotonic()
        if name == "round":
            self.recent_rounds.append(seconds)


class Timer:
    """Wall-clock seconds per named phase, each phase also marked in ``progress``, and the
    CPU seconds of the calling thread in it (``cpu``): the node's own compute, which other
    load on the machine does not inflate (with ``node.threads`` 1 torch computes in this
    thread; the scorer's sandbox is another process, so its phase counts wall seconds)."""

    def __init__(self, progress: Progress) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.progress = progress

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start, start_cpu = time.perf_counter(), time.thread_time()
        self.progress.enter(name)
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            self.seconds[name] = self.seconds.get(name, 0.0) + spent
            self.cpu[name] = self.cpu.get(name, 0.0) + time.thread_time() - start_cpu
            self.progress.leave(name, spent)

    def compute_s(self) -> float:
        """The node's compute this round: CPU seconds of generation, screening and
        training, and the wall seconds of scoring its own groups and taking in peers'
        (their scoring runs in the sandbox, another process)."""
        cpu = sum(self.cpu.get(k, 0.0) for k in ("generate", "screen", "train"))
        return cpu + self.seconds.get("score", 0.0) + self.seconds.get("intake", 0.0)


@dataclass
class Parts:
    """What a node is made of; ``Node`` drives them round by round."""

    data_dir: Path
    lock: IO[str]
    seed: int
    policy: Policy
    scorer: Scorer
    curriculum: Curriculum
    trainer: Trainer | None  # None for a generating member (train.enabled = false)
    pool: Pool
    defence: Defence | None
    intake: Intake
    metrics: MetricsLog
    store: CheckpointStore


class Node:
    """A node: policy, tasks, scorer, trainer, pool and state, driven round by round."""

    def __init__(
        self,
        config: Config,
        parts: Parts,
        *,
        stop: threading.Event | None = None,
        transport: Transport | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """A node of ``parts`` made from ``config`` (``build.build_node`` makes both)."""
        self.config = config
        self.clock = clock
        self.stop = stop or threading.Event()
        self.data_dir, self._lock, self.seed = parts.data_dir, parts.lock, parts.seed
        self.policy, self.scorer, self.curriculum = parts.policy, parts.scorer, parts.curriculum
        self.trainer, self.trains = parts.trainer, parts.trainer is not None
        self.pool, self.defence, self.intake = parts.pool, parts.defence, parts.intake
        self.metrics, self.store = parts.metrics, parts.store
        self.transport = transport
        self._net_before = NetStats()
        self._outcomes_before: Counter[str] = Counter()
        self._outcomes_before = self._pool_outcomes()
        self._expired_before = self.pool.expired_drawable
        self.round = 0
        self.cumulative_reward = 0.0
        self.own_stats = OwnGroupStats()  # own groups' signal and per-family reward: J and the need
        # The last round that changed what a checkpoint holds: until it is counted
        # (self.round past it) a checkpoint would label its state as its start (save).
        self._changed_round: int | None = None
        self.failure: str | None = None
        # What the status endpoint reads: the loop's progress, the last round recorded
        # and the last one that ran the held-out evaluation.
        self.progress = Progress()
        self.last_record: dict[str, Any] | None = None
        self.last_eval: dict[str, Any] | None = None

    # --- the loop ---------------------------------------------------------------------

    def run_round(self, r: int) -> dict[str, Any]:
        """Algorithm 1, one round; returns the round's metrics."""
        s, timer = self.config.train, Timer(self.progress)
        with timer("round"):
            with timer("intake"):  # peers' groups scored now only if J may take some
                inbound = self._take_in(score=self._choose_j(pooled=1)[0] > 0)
                pooled = len(self.pool)
                j, why = self._choose_j(pooled)
                external = self._take_external(r, j) if self.trains else []
            n_local = s.local_groups + s.external_groups - len(external)
            tasks = [make_task(ref) for ref in self.curriculum.sample(self.seed, r, n_local)]
            if s.external_use == "tasks":  # peers choose the tasks, this node writes the text
                tasks += [make_task(p.group.ref) for p in external]
            with timer("generate"):
                generated, new_tokens = self._generate(tasks, r)
            with timer("score"):
                self._score(generated)
            local, practice = generated[:n_local], generated[n_local:]
            published = self._share(generated, r)
            theirs = [] if s.external_use == "tasks" else [self._as_group(p) for p in external]
            screened: Counter[str] = Counter()
            if self.defence is not None:
                with timer("screen"):
                    theirs, screened = self.defence.screen(local, theirs)
            groups = local + practice + theirs
            with timer("train"):
                batch = training_set(
                    groups,
                    s.advantage_scale,
                    external_completions=s.external_completions,
                    rng=random.Random(f"{self.seed}:external_completions:{r}"),
                )
                stats = TrainStats()
                if self.trainer is not None:
                    try:
                        stats = self.trainer.step(
                            batch.samples,
                            should_stop=self.stop.is_set,
                            batch_rows=batch.batch_rows,
                            batch_tokens=batch.batch_tokens,
                        )
                    finally:
                        if self.trainer.changed:  # even if the step then failed
                            self._changed_round = self.round
            if stats is None:
                raise Stopped
            # From here the round changes what a checkpoint holds until it is counted.
            self._changed_round = self.round
            self.own_stats.observe(
                ((g.task.ref.family, g.rewards) for g in local),
                format_rate=finished_format_rate(local),
                levels=self.curriculum.level,  # the levels this round's tasks were set at
            )
            self.own_stats.chose(j, pooled)
            moves: Counter[str] = Counter()
            for g in local:
                moves[g.task.ref.family] += self.curriculum.record(g.task.ref.family, g.rewards)
        record = self._record(r, local, groups, stats, new_tokens, timer, moves, len(practice))
        record.update(
            {
                "train/external_target": j,
                "train/own_signal_rate": self.own_stats.signal_rate,
                "train/own_format_rate": self.own_stats.format_rate,
                "train/own_skill": self._own_rate("skill")[0],
            }
        )
        if s.j_bound() is not None:
            log.info("J chosen", round=r, j=j, reason=why)
        record.update({f"defence/{k}": v for k, v in sorted(screened.items())})
        record.update(age_record(theirs, r, self.pool.clock()))
        record.update(self._net_record(published, inbound))
        record.update(self._outcome_record())
        record.update(self._unfilled_record(r, j if self.trains else 0, len(external)))
        if self.config.eval.every and (r + 1) % self.config.eval.every == 0:
            with timer("eval"):
                report = self.evaluate()
            if not self.stop.is_set():  # a stop cut it short: the round stands without it
                record.update(report.metrics())
                record["phase_s/eval"] = timer.seconds["eval"]
        return record

    def run(self) -> int:
        """Run rounds until the configured total or a stop; save on the way out.

        Every checkpoint holds the state at the start of the round it names, wherever a
        stop lands: a round changes what a checkpoint holds (weights, optimiser, mix,
        curriculum, reward sum) only from its optimiser step on (a stop before it ends the
        round with nothing changed; after it, the round runs to the end), and until the
        round is counted ``save`` writes nothing. SystemExit (a second signal:
        ``lifecycle.on_signals``) and KeyboardInterrupt abort without saving; the last
        checkpoint stands, and a resume cuts metrics.jsonl back to it.
        """
        self.resume()
        target = self.config.node.rounds
        done_here = 0
        aborted = False
        try:
            while not self.stop.is_set() and (target == 0 or self.round < target):
                started = time.monotonic()
                try:
                    record = self.run_round(self.round)
                except Stopped:
                    break
                except ScorerUnavailable as exc:
                    self.failure = str(exc)
                    log.error("stopping", reason=self.failure)
                    break
                except (MemoryError, RuntimeError) as exc:
                    if not _is_out_of_memory(exc):
                        raise
                    self.failure = self._out_of_memory_hint()
                    log.error("stopping", reason=self.failure)
                    break
                try:
                    self.metrics.append(record)
                except OSError as exc:  # a full disk, a read-only mount
                    self.failure = f"cannot write {self.metrics.path}: {exc}"
                    log.error("stopping", reason=self.failure)
                    break
                self.round += 1
                done_here += 1
                self.last_record = record
                if "eval/pass1" in record:
                    self.last_eval = record
                log_round(record)
                if self.round % self.config.node.checkpoint_every == 0:
                    self.save()
                self._pace(started)
        except (SystemExit, KeyboardInterrupt):
            aborted = True
            raise
        finally:
            if done_here and not aborted and self.round % self.config.node.checkpoint_every:
                self.save()
        return done_here

    def _pace(self, started: float) -> None:
        """Wait out the rest of ``node.min_round_s`` since the round started (a stop ends
        the wait at once)."""
        rest = self.config.node.min_round_s - (time.monotonic() - started)
        if rest > 0 and not (self.config.node.rounds and self.round >= self.config.node.rounds):
            self.stop.wait(rest)

    def _choose_j(self, pooled: int) -> tuple[int, str]:
        """J for this round with ``pooled`` groups waiting, and why (intake/demand.py)."""
        s = self.config.train
        rate, what = self._own_rate(s.external_by)
        return choose_external(
            s.external_groups, s.j_bound(), rate, pooled, what, previous=self.own_stats.last_j
        )

    def _own_rate(self, by: str) -> tuple[float | None, str]:
        weights = {name: f.weight for name, f in self.curriculum.families.items()}
        return self.own_stats.own_rate(by, self.curriculum.level, weights)

    def _take_external(self, r: int, count: int) -> list[PooledGroup]:
        """Up to ``count`` (J) groups from the pool, those pooled unscored scored first;
        none if the pool cannot be read (the round goes on). Under ``external_by =
        "skill"`` the groups at each family's current level come first: where this node
        is still learning."""
        rng = random.Random(f"{self.seed}:pool:{r}")
        need = self.own_stats.need()
        d = self.defence
        exclude = d.distrusted_authors() if d is not None else set()
        prefer: set[tuple[str, str]] = set()
        if self.config.train.external_by == "skill":
            prefer = {
                (name, canonical_json(self.curriculum.config_for(name)))
                for name in self.curriculum.families
            }
        try:
            if count > 0:
                self.intake.score_pooled(exclude, should_stop=self.stop.is_set)
                if self.stop.is_set():
                    raise Stopped
            if d is None:
                return self.pool.sample(count, rng, need=need, prefer=prefer)
            cap = max(1, int(count * self.config.defence.max_author_share))
            return self.pool.sample(
                count,
                rng,
                per_author=cap,
                exclude=exclude,
                together=d.suspects(),
                need=need,
                prefer=prefer,
            )
        except sqlite3.Error as exc:
            log.error("cannot read the pool: this round uses own groups only", error=str(exc))
            return []

    def _out_of_memory_hint(self) -> str:
        c = self.config
        return (
            f"out of memory in round {self.round}: lower train.micro_batch_size "
            f"(now {c.train.micro_batch_size}), generation.max_batch_sequences "
            f"(now {c.generation.max_batch_sequences}) or generation.max_new_tokens "
            f"(now {c.generation.max_new_tokens}), or train LoRA adapters (--lora)"
        )

    # --- phases ----------------------------------------------------------------------

    def _generate(self, tasks: Sequence[Task], r: int) -> tuple[list[Group], int]:
        t = self.config.tasks
        torch.manual_seed(_derive(self.seed, "generate", r))
        prompts = [
            self.policy.encode_chat(build_messages(task.question, t.system_prompt, t.one_shot))
            for task in tasks
        ]
        n = self.config.generation.completions_per_task
        out = self.policy.generate(
            prompts, self.config.generation, n=n, should_stop=self.stop.is_set
        )
        if self.stop.is_set():
            raise Stopped
        eos = set(self.policy.eos_ids)
        groups = [
            Group(task, prompt, ids, texts, [bool(c) and c[-1] in eos for c in ids])
            for task, prompt, ids, texts in zip(tasks, prompts, out.ids, out.texts, strict=True)
        ]
        return groups, out.new_tokens

    def _score(self, groups: Sequence[Group]) -> None:
        for g in groups:
            g.rewards = [res.reward for res in self.scorer.score(g.task, g.texts)]
            if self.stop.is_set():
                raise Stopped

    def _take_in(self, score: bool = True) -> Counter[str]:
        """Every message peers sent since the last round, through the intake into the pool
        (scored, or with ``score`` False left for the draw to score); the author of a
        message refused as its own fault loses score in the swarm."""
        outcomes: Counter[str] = Counter()
        if self.transport is None:
            return outcomes
        for (author, reason), n in self.transport.refusals().items():
            self.pool.record(author, reason, n)  # refused by the network process: per peer
        t = self.config.train
        takes = self.trains and t.external_groups > 0
        if not takes:  # it takes nothing from the pool: no need to check, nor keep
            outcomes["unread"] = len(self.transport.received())
            return outcomes
        for message in self.transport.received():
            verdict = self.receive(message.data, message.author, message.received_at, score)
            outcomes[verdict.outcome] += 1
            if verdict.outcome == "rejected":
                self.transport.penalise(message.author)
            if self.stop.is_set():
                raise Stopped
        return outcomes

    def _share(self, groups: Sequence[Group], r: int) -> int:
        """Publish this round's groups to peers (which ones: ``net.publish``)."""
        choice = self.config.net.publish
        if self.transport is None or choice == "none":
            return 0
        created_ms = int(self.clock() * 1000)
        sent = 0
        for g in groups:
            if choice == "signal" and not g.has_signal:
                continue
            texts = tuple(wire.clip_utf8(t, wire.MAX_COMPLETION_BYTES) for t in g.texts)
            message = wire.RolloutGroup(
                ref=g.task.ref,
                generator=generator_of(g.task.ref.family),
                question=g.task.question,
                completions=texts,
                unfinished=frozenset(
                    i
                    for i, (f, t, full) in enumerate(zip(g.finished, texts, g.texts, strict=True))
                    if not f or t != full
                ),
                model=wire.clip_utf8(self._model_label(), wire.MAX_MODEL_BYTES),
                round=r,
                created_ms=created_ms,
            )
            try:
                data = wire.encode(message)
            except wire.EncodeError as exc:
                log.warning("group not shared", family=g.task.ref.family, reason=str(exc))
                continue
            sent += self.transport.publish(data)
        return sent

    def _net_record(self, published: int, inbound: Counter[str]) -> dict[str, Any]:
        """This round's swarm figures: peers now, the rest since the previous round."""
        now = self.transport.stats() if self.transport is not None else NetStats()
        before, self._net_before = self._net_before, now
        return {
            "net/peers": now.peers,
            "net/published": published,
            "net/received": sum(inbound.values()),
            "net/accepted": inbound["accepted"],
            "net/rejected": inbound["rejected"]
            + inbound["ignored"]
            + now.rejected
            - before.rejected,
            "net/dropped": now.inbox_dropped - before.inbox_dropped,
            "net/unsent": now.publish_dropped - before.publish_dropped,
            "net/bytes_in": now.bytes_in - before.bytes_in,
            "net/bytes_out": now.bytes_out - before.bytes_out,
        }

    def _unfilled_record(self, r: int, j: int, drawn: int) -> dict[str, int]:
        """Slots of J the draw left to own groups, and two reasons that can be told apart:
        groups it could take that the per-author cap held back (``defence.max_author_share``)
        and ones that aged out of the pool since the previous round (``pool.max_age_s``).
        The rest: the pool held no more that it could take (few peers' groups with signal,
        or their authors distrusted)."""
        expired = self.pool.expired_drawable - self._expired_before
        self._expired_before = self.pool.expired_drawable
        unfilled = max(0, j - drawn)
        out = {
            "train/j_unfilled": unfilled,
            "train/j_unfilled_capped": min(unfilled, self.pool.last_capped),
            "train/j_unfilled_expired": min(unfilled, expired),
        }
        if out["train/j_unfilled_expired"]:
            log.warning(
                "J not filled: peers' groups aged out of the pool before this round drew them",
                round=r,
                j=j,
                unfilled=unfilled,
                max_age_s=self.pool.max_age_s,
            )
        return out

    def _outcome_record(self) -> dict[str, int]:
        """Peers' groups by outcome since the previous round (``peer_groups/<outcome>``,
        non-zero ones): accepted, each refusal reason (``too_old`` on arrival,
        ``duplicate``, ...), and what became of pooled groups never trained on
        (``expired``: aged out unused; ``evicted_*``). The pool's per-peer counts grow by
        exactly these (``sapo-node pool``, ``/metrics``' ``sapo_peer_groups``)."""
        now = self._pool_outcomes()
        before, self._outcomes_before = self._outcomes_before, now
        return {f"peer_groups/{k}": n - before[k] for k, n in sorted(now.items()) if n > before[k]}

    def _pool_outcomes(self) -> Counter[str]:
        totals: Counter[str] = Counter()
        try:
            for counts in self.pool.counts().values():
                totals.update(counts)
        except sqlite3.Error as exc:
            log.warning("cannot read the pool's counts", error=str(exc))
            return self._outcomes_before
        # completions (the poisoning checks) are counted in defence/*
        return Counter({k: n for k, n in totals.items() if not k.startswith("completions_")})

    def _model_label(self) -> str:
        """The model's name for peers: a local directory by its last part only (its full
        path would tell strangers about this machine)."""
        name = self.config.model.name
        return Path(name).name if Path(name).is_dir() else name

    def _as_group(self, pooled: PooledGroup) -> Group:
        """A peer's group in this node's own tokenizer and chat template (its question was
        checked against our own regeneration when it arrived, and its completions were
        scored exactly as prepared here)."""
        t = self.config.tasks
        task = Task(pooled.group.ref, pooled.group.question, None)
        prompt = self.policy.encode_chat(build_messages(task.question, t.system_prompt, t.one_shot))
        done = [
            prepare_completion(self.config, self.policy, c, f)
            for c, f in zip(pooled.group.completions, pooled.group.finished, strict=True)
        ]
        return Group(
            task,
            prompt,
            [c.ids for c in done],
            [c.text for c in done],
            [c.finished for c in done],
            list(pooled.rewards),
            origin=pooled.author,
            pooled=pooled,
        )

    def evaluate(self) -> EvalReport:
        """The held-out evaluation of the current policy (evaluate.py); trains nothing."""
        return evaluate(self.policy, self.scorer, self.config, should_stop=self.stop.is_set)

    def receive(
        self, data: bytes, author: str, arrived: float | None = None, score: bool = True
    ) -> Verdict:
        """A peer's message, which reached this node at ``arrived`` (now if not given):
        checked, regenerated and (unless ``score`` is False) scored by this node, then
        pooled."""
        return self.intake.receive(data, author, arrived, score=score)

    # --- record and state --------------------------------------------------------------

    def _record(self, r, local, groups, stats: TrainStats, new_tokens, timer, moves, practice=0):
        """The round's metrics row (record.round_record, which says what each key means),
        with this round's own reward added to the cumulative one."""
        own = [x for g in local for x in g.rewards]
        self.cumulative_reward += sum(own) / len(own) if own else 0.0
        return round_record(
            r,
            local,
            groups,
            stats,
            new_tokens,
            timer,
            moves,
            practice,
            cumulative=self.cumulative_reward,
            threshold=self.config.tasks.correct_threshold,
            pool=self.pool,
            levels=self.curriculum.level,
            device=self.policy.device,
        )

    def save(self) -> None:
        """Checkpoint the completed rounds; a failure is logged and training goes on.

        Nothing is written while a round that changed the state is not counted yet (its
        caller adds 1 to ``round`` once it is recorded): that checkpoint would hold round
        r's weights labelled r, and a resume would train round r twice (``run``).
        """
        if self._changed_round is not None and self.round <= self._changed_round:
            log.warning(
                "no checkpoint: round part-way, the last checkpoint stands", round=self.round
            )
            return
        state = {
            "round": self.round,
            "seed": self.seed,
            "cumulative_reward": self.cumulative_reward,
            "curriculum": self.curriculum.state_dict(),
            "mix": self.own_stats.state_dict(),  # the key checkpoints since 0.3.1 carry
            "metrics_offset": self.metrics.offset(),
            "fingerprint": self.config.fingerprint(),
            "sapo_node": __version__,
            "time": time.time(),
        }
        try:
            path = self.store.save(
                self.round,
                self.policy.trainable_state(),  # empty for a generating member
                self.trainer.optimizer.state_dict() if self.trainer else {},
                state,
            )
        except OSError as exc:
            log.error("checkpoint failed; the previous one is kept", error=str(exc))
            return
        log.info("checkpoint saved", round=self.round, path=str(path))

    def resume(self) -> None:
        """Load the latest checkpoint, if any (CheckpointError if it is unusable)."""
        path = self.store.latest()
        if path is None:
            if self.metrics.offset():
                log.warning(
                    "metrics without a checkpoint: starting over", path=str(self.metrics.path)
                )
                self.metrics.truncate(0)
            return
        ckpt = self.store.load(path, self.config.fingerprint())
        if not self.trains and ckpt.weights:
            raise CheckpointError(
                f"{self.data_dir} holds a training node's checkpoint ({path}); a generating "
                "member keeps its model as it is: give it another --data-dir"
            )
        try:
            self.policy.load_trainable_state(ckpt.weights)
            if self.trainer is not None:
                self.trainer.optimizer.load_state_dict(ckpt.optimizer)
        except ValueError as exc:
            raise CheckpointError(f"checkpoint {path} does not fit this model: {exc}") from None
        st = ckpt.state
        self.round = int(st["round"])
        self.cumulative_reward = float(st["cumulative_reward"])
        self.curriculum.load_state_dict(st["curriculum"])
        self.own_stats.load_state_dict(st.get("mix", {}))  # absent before 0.3.1: starts afresh
        self.metrics.truncate(int(st["metrics_offset"]))
        self._changed_round = None  # the state is the checkpoint's
        log.info("resumed", round=self.round, checkpoint=str(path))

    def close(self) -> None:
        if self.defence is not None:
            self.defence.save()
        self.scorer.close()
        self.pool.close()
        with contextlib.suppress(OSError):
            self._lock.close()


def prepare_completion(config: Config, policy: Policy, text: str, finished: bool) -> Completion:
    """A peer's completion as this node trains it (the intake scores its text): with
    ``train.external_use = "answers"`` only its last answer in its tags; else, with
    defences on, cut after its last answer (intake/defence.py); then in this node's
    tokens, cut to its token limit."""
    d = config.defence
    if config.train.external_use == "answers":
        text, finished = bare_answer(text), True
    elif d.enabled and d.cut_after_answer:
        cut = cut_after_answer(text)
        finished = finished or cut != text
        text = cut
    return policy.encode_completion(text, finished, config.generation.max_new_tokens)


def _is_out_of_memory(exc: BaseException) -> bool:
    """torch's CUDA/MPS/CPU allocators and Python's own, by type or message."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text


def _derive(seed: int, *parts: object) -> int:
    """A 63-bit seed from the node seed and a purpose (stable across processes)."""
    return random.Random(":".join(map(str, (seed, *parts)))).getrandbits(63)
