"""The held-out evaluation: the paper's "judge", kept local and fixed.

Training reward is a confounded yardstick: a curriculum makes tasks harder as a node
improves, and a node that takes J external groups generates fewer completions of its
own. So a node is also judged on a fixed set of tasks that it never trains on, with
the same families, configs and levels as its config (all of a family's levels, round
robin, when the curriculum is on; its start level, the only one it ever sets, when the
curriculum is off). Per task: ``samples`` completions at the sampling temperature,
whose mean correctness is the task's pass@1, and one greedy completion. Reported
overall and per family: ``eval/pass1``, ``eval/greedy``, ``eval/answer_tag_rate``,
``eval/pass1/<family>``, ``eval/greedy/<family>``. Correct means the verifier's raw
score reaches ``tasks.correct_threshold``, whatever ``tasks.reward`` is.

Why the held-out seeds never meet a training stream. A ReasoningGym entry (family,
config, seed, index) is generated from ``Random(seed + index)``, so two references
collide when their sums ``seed + index`` are equal (and the configs match). Every
sum a node can ever train on is below 2**64:

- its own tasks have ``seed < 2**62`` (``node.seed``'s bound, and drawn seeds are below
  2**31) and ``index = round * 4096 + k``, so the sum stays below 2**63 for the next
  2**50 rounds;
- a peer's task arrives over the wire, where ``seed`` and ``index`` are each at most
  2**63 - 1 (protocol/SPEC.md, enforced by the decoder), so its sum is at most
  2**64 - 2, whatever the peer sends.

The held-out set of ``eval.seed = s`` uses ``seed = 2**64 + s * 2**16`` and indices
``0 .. eval.tasks - 1`` (at most 2**16), so its sums lie in
``[2**64 + s * 2**16, 2**64 + (s + 1) * 2**16)``: above every training sum, and
disjoint between different ``s``. No node draws such a seed and no peer can send one,
so nothing a node trains on is ever in its evaluation set.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sapo_node.config import Config, CurriculumSection, EvalSection, FamilySection
from sapo_node.curriculum import Curriculum
from sapo_node.tasks import (
    Scorer,
    Task,
    TaskRef,
    answer_format_share,
    build_messages,
    make_task,
)

EVAL_SEED_BASE = 2**64
EVAL_SET_STRIDE = 2**16  # room for eval.tasks (its bound) in one held-out set


def heldout_seed(eval_seed: int) -> int:
    """The dataset seed of held-out set ``eval_seed``.

    >>> heldout_seed(0) == 2**64 and heldout_seed(1) - heldout_seed(0) == 2**16
    True
    """
    return EVAL_SEED_BASE + eval_seed * EVAL_SET_STRIDE


def allocate(weights: Sequence[float], total: int) -> list[int]:
    """Split ``total`` tasks by weight, largest remainder first (ties: earlier first).

    >>> allocate([1, 1, 1], 10)
    [4, 3, 3]
    >>> allocate([3, 1], 4)
    [3, 1]
    """
    whole = sum(weights)
    quotas = [w / whole * total for w in weights]
    counts = [int(q) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def heldout_refs(
    families: Sequence[FamilySection], curriculum: CurriculumSection, settings: EvalSection
) -> list[tuple[TaskRef, int]]:
    """The held-out set: (task reference, level) pairs, the same for every node."""
    c = Curriculum(families, curriculum)
    names = list(c.families)
    counts = allocate([c.families[n].weight for n in names], settings.tasks)
    seed = heldout_seed(settings.seed)
    out: list[tuple[TaskRef, int]] = []
    index = 0
    for name, count in zip(names, counts, strict=True):
        levels = list(range(len(c.levels[name]))) if curriculum.enabled else [c.level[name]]
        for k in range(count):
            level = levels[k % len(levels)]
            config = {**c.families[name].config, **c.levels[name][level]}
            out.append((TaskRef.make(name, config, seed, index), level))
            index += 1
    return out


@dataclass(frozen=True)
class TaskResult:
    """One held-out task: how its sampled and greedy completions did."""

    family: str
    level: int
    pass1: float | None  # share of sampled completions that are correct (None: none sampled)
    greedy: bool  # whether the greedy completion is correct
    tagged: float  # share of sampled completions with an <answer> tag (else: the greedy one)
    texts: tuple[str, ...] = ()  # the sampled completions, then the greedy one


@dataclass(frozen=True)
class EvalReport:
    """The results of one evaluation, task by task."""

    tasks: list[TaskResult]
    samples: int
    new_tokens: int
    seconds: float
    thread_seconds: float = 0.0  # CPU seconds of the evaluating thread (its compute)

    def metrics(self) -> dict[str, Any]:
        """The eval/* keys of a metrics record."""
        return summarise(self.tasks) | {
            "eval/samples": self.samples,
            "eval/new_tokens": self.new_tokens,
            "eval/seconds": self.seconds,
            "eval/thread_s": self.thread_seconds,
            "eval/per_task_pass1": [
                None if t.pass1 is None else round(t.pass1, 6) for t in self.tasks
            ],
            "eval/per_task_greedy": [int(t.greedy) for t in self.tasks],
            "eval/per_task_family": [t.family for t in self.tasks],
            "eval/per_task_level": [t.level for t in self.tasks],
        }


def breakdown(record: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """Greedy and pass@1 of an evaluation's record (``EvalReport.metrics``) by level, by
    family and by the two together, from its per-task lists; None for a record made
    before they carried each task's family and level.

    >>> r = {"eval/per_task_greedy": [1, 0, 1], "eval/per_task_pass1": [0.5, 0.0, 1.0],
    ...      "eval/per_task_family": ["a", "a", "b"], "eval/per_task_level": [0, 1, 1]}
    >>> b = breakdown(r)
    >>> b["level"]["1"], b["family"]["a"]["greedy"], sorted(b["family_level"])
    ({'tasks': 2, 'greedy': 0.5, 'pass1': 0.5}, 0.5, ['a/0', 'a/1', 'b/1'])
    """
    families, levels = record.get("eval/per_task_family"), record.get("eval/per_task_level")
    if families is None or levels is None:
        return None
    cells: dict[str, dict[str, list[tuple[float, float]]]] = {
        "level": {},
        "family": {},
        "family_level": {},
    }
    for fam, level, greedy, pass1 in zip(
        families,
        levels,
        record["eval/per_task_greedy"],
        record["eval/per_task_pass1"],
        strict=True,
    ):
        keys = {"level": str(level), "family": fam, "family_level": f"{fam}/{level}"}
        for kind, key in keys.items():
            cells[kind].setdefault(key, []).append((float(greedy), pass1))
    return {
        kind: {
            key: {
                "tasks": len(xs),
                "greedy": _mean([g for g, _ in xs]),
                "pass1": _mean_or_none([p for _, p in xs]),
            }
            for key, xs in sorted(by.items(), key=lambda kv: _sort_key(kv[0]))
        }
        for kind, by in cells.items()
    }


def _sort_key(key: str) -> tuple:
    """Levels in numeric order, families by name."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in key.split("/"))


def summarise(results: Sequence[TaskResult]) -> dict[str, Any]:
    """Overall and per-family means of a list of task results.

    >>> r = [TaskResult("a", 0, 0.5, True, 1.0), TaskResult("b", 0, 0.0, False, 0.5)]
    >>> s = summarise(r)
    >>> s["eval/pass1"], s["eval/greedy"], s["eval/answer_tag_rate"], s["eval/pass1/a"]
    (0.25, 0.5, 0.75, 0.5)
    """
    out: dict[str, Any] = {"eval/tasks": len(results)}
    groups: dict[str, list[TaskResult]] = {"": list(results)}
    for r in results:
        groups.setdefault(f"/{r.family}", []).append(r)
    for suffix, rs in sorted(groups.items()):
        out[f"eval/pass1{suffix}"] = _mean_or_none([r.pass1 for r in rs])
        out[f"eval/greedy{suffix}"] = _mean([float(r.greedy) for r in rs])
    out["eval/answer_tag_rate"] = _mean([r.tagged for r in results])
    return out


def evaluate(
    policy: Any,
    scorer: Scorer,
    config: Config,
    *,
    should_stop: Callable[[], bool] | None = None,
    samples: int | None = None,
) -> EvalReport:
    """Run the held-out set on ``policy``: ``samples`` (default ``eval.samples``; 0: greedy
    only, pass@1 None) sampled and one greedy completion per task, scored by ``scorer``.
    The sampling RNG is fixed by ``eval.seed`` (every node and every round draws the same
    noise) and the caller's RNG state is restored."""
    start, start_thread = time.perf_counter(), time.thread_time()
    e, t, g = config.eval, config.tasks, config.generation
    refs = heldout_refs(t.families, config.curriculum, e)
    tasks: list[Task] = [make_task(ref) for ref, _ in refs]
    prompts = [
        policy.encode_chat(build_messages(task.question, t.system_prompt, t.one_shot))
        for task in tasks
    ]
    n = e.samples if samples is None else samples
    devices = [policy.device] if policy.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(e.seed)
        texts_of: list = [[] for _ in prompts]
        sampled_tokens = 0
        if n:
            sampled = policy.generate(prompts, g, n=n, should_stop=should_stop)
            texts_of, sampled_tokens = sampled.texts, sampled.new_tokens
        greedy = policy.generate(prompts, g, n=1, should_stop=should_stop, greedy=True)
    threshold = t.correct_threshold
    results = []
    for (ref, level), task, texts, best in zip(refs, tasks, texts_of, greedy.texts, strict=True):
        scores = [s.raw_score for s in scorer.score(task, [*texts, *best])]
        correct = [s >= threshold for s in scores]
        results.append(
            TaskResult(
                family=ref.family,
                level=level,
                pass1=_mean([float(c) for c in correct[: len(texts)]]) if texts else None,
                greedy=correct[-1],
                tagged=answer_format_share(texts or best),
                texts=(*texts, *best),
            )
        )
    return EvalReport(
        results,
        n,
        sampled_tokens + greedy.new_tokens,
        time.perf_counter() - start,
        time.thread_time() - start_thread,
    )


def _mean(values: Sequence[float]) -> float:
    return float(sum(values)) / len(values) if values else 0.0


def _mean_or_none(values: Sequence[float | None]) -> float | None:
    """The mean of the values measured; None if none was (a greedy-only evaluation)."""
    known = [float(v) for v in values if v is not None]
    return sum(known) / len(known) if known else None


def evaluate_checkpoint(config: Config, checkpoint: Path | None = None) -> tuple[EvalReport, str]:
    """Evaluate a node's latest checkpoint (or ``checkpoint``, a checkpoint directory);
    with none in the data directory, the untrained model. Returns the report and what
    was evaluated. Reads only: a running node may hold the data directory meanwhile."""
    from sapo_node.checkpoint import CheckpointError, CheckpointStore
    from sapo_node.train.policy import load_policy

    data_dir = config.node.resolved_data_dir()
    m = config.model
    if config.node.threads:
        torch.set_num_threads(config.node.threads)
    path = checkpoint if checkpoint is not None else CheckpointStore(data_dir).latest()
    if path is not None and not Path(path).is_dir():
        raise CheckpointError(f"checkpoint not found: {path} (give a checkpoints/round-N dir)")
    policy = load_policy(
        m.name,
        device=config.node.device,
        dtype=m.dtype,
        lora=m.lora,
        cache_dir=data_dir / "models",
    )
    what = f"{m.name} (untrained: no checkpoint in {data_dir})"
    if path is not None:
        ckpt = CheckpointStore(Path(path).parent.parent).load(Path(path), config.fingerprint())
        try:
            policy.load_trainable_state(ckpt.weights)
        except ValueError as exc:
            raise CheckpointError(f"checkpoint {path} does not fit this model: {exc}") from None
        what = f"{path} (round {ckpt.state.get('round')})"
    with Scorer.of(config) as scorer:
        return evaluate(policy, scorer, config), what
