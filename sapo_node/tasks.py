"""Verifiable tasks: references, families, prompts, answer extraction, sandboxed scoring.

A task is fully determined by its reference (family, config, seed, index): any process
with the same ReasoningGym version regenerates the same question and true answer, so
a receiver never needs to trust a sender's answer. Model output is hostile text: it is
cut to a bounded length and scored in a sandboxed worker process (see sandbox.py),
with eval-based ReasoningGym verifiers replaced by safe parsers (safe_verifiers.py).

Custom families: a family name of the form ``package.module:attr`` names an object
with ``make(ref) -> Task`` and ``score(task, completion) -> float`` (the TaskFamily
protocol); it must be importable in the scoring worker too.
"""

from __future__ import annotations

import contextlib
import decimal
import functools
import importlib
import importlib.metadata
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import structlog

from sapo_node import safe_verifiers
from sapo_node.sandbox import DEFAULT_COMPILE_ALLOWLIST, Sandbox, SandboxLimits

log = structlog.get_logger(__name__)

RG_VERSION = importlib.metadata.version("reasoning-gym")

# The nine families of the paper's controlled experiment.
PAPER_FAMILIES = (
    "base_conversion",
    "basic_arithmetic",
    "arc_1d",
    "bf",
    "propositional_logic",
    "fraction_simplification",
    "decimal_arithmetic",
    "calendar_arithmetic",
    "binary_matrix",
)

ONE_SHOT_QUESTION = "Calculate 12 + 7 * 2."
ONE_SHOT_ANSWER = "7 * 2 = 14, 12 + 14 = 26.\n<answer>26</answer>"


def canonical_json(value: Any) -> str:
    """The one JSON spelling of a config: sorted keys, no spaces, tuples as lists.

    >>> canonical_json({"b": (1, 2), "a": "x"})
    '{"a":"x","b":[1,2]}'
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class TaskRef:
    """What makes a task reproducible anywhere: family, config, seed and index."""

    family: str
    config_json: str
    seed: int
    index: int

    @classmethod
    def make(cls, family: str, config: Mapping[str, Any], seed: int, index: int) -> TaskRef:
        return cls(family, canonical_json(dict(config)), seed, index)

    @property
    def config(self) -> dict[str, Any]:
        return json.loads(self.config_json)


@dataclass(frozen=True)
class Task:
    """A regenerated task: its reference, question and (possibly absent) true answer."""

    ref: TaskRef
    question: str
    answer: str | None
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)


@runtime_checkable
class TaskFamily(Protocol):
    """The narrow contract of a task family."""

    def make(self, ref: TaskRef) -> Task: ...

    def score(self, task: Task, completion: str) -> float: ...


def last_answer(text: str, tag: str = "answer") -> tuple[int, int] | None:
    """Where the last complete ``<tag>...</tag>`` pair of ``text`` opens and where its
    closing tag starts (None if it has none), in linear time: the last closing tag, then
    the last opening tag before it. What the node scores (``extract_answer``) and what its
    defences keep of a peer's completion (intake/defence.py) are found by this one search.

    ReasoningGym's regex version is quadratic on repeated unclosed tags.

    >>> last_answer("so <answer>7</answer>")
    (3, 12)
    >>> last_answer("<answer>a<answer>b</answer>")
    (9, 18)
    >>> last_answer("<answer>unclosed") is None
    True
    """
    close = text.rfind(f"</{tag}>")
    start = text.rfind(f"<{tag}>", 0, close) if close >= 0 else -1
    return (start, close) if start >= 0 else None


def extract_answer(text: str, tag: str = "answer") -> str | None:
    """The stripped content of the last complete ``<tag>...</tag>`` pair (``last_answer``).

    >>> extract_answer("so <answer> 26 </answer>")
    '26'
    >>> extract_answer("<answer>1</answer> then <answer>2</answer>")
    '2'
    >>> extract_answer("<answer>unclosed") is None
    True
    >>> extract_answer("<answer>a<answer>b</answer>")
    'b'
    """
    found = last_answer(text, tag)
    return None if found is None else text[found[0] + len(tag) + 2 : found[1]].strip()


def answer_format_share(texts: Iterable[str]) -> float:
    """The share of ``texts`` with an answer between the tags, 0 if there are none: the
    answer format a round's metrics and the held-out evaluation both report.

    >>> answer_format_share(["<answer>1</answer>", "1", "x <answer>2</answer>", "<answer>"])
    0.5
    """
    found = [extract_answer(x) is not None for x in texts]
    return sum(found) / len(found) if found else 0.0


class ReasoningGymFamily:
    """A ReasoningGym procedural dataset as a task family."""

    def __init__(self, name: str) -> None:
        import reasoning_gym.factory as factory

        if name not in factory.DATASETS:
            raise KeyError(f"unknown ReasoningGym dataset {name!r}")
        self.name = name

    def make(self, ref: TaskRef) -> Task:
        dataset = _dataset(ref.family, ref.config_json, ref.seed)
        # Some generators print (bf) or change the process-wide decimal context
        # (decimal_arithmetic): keep both to themselves.
        with contextlib.redirect_stdout(io.StringIO()), decimal.localcontext():
            entry = dataset[ref.index]
        return Task(ref, entry["question"], entry["answer"], entry["metadata"])

    def score(self, task: Task, completion: str) -> float:
        entry = {"question": task.question, "answer": task.answer, "metadata": task.metadata}
        dataset = _dataset(task.ref.family, task.ref.config_json, task.ref.seed)
        answer = extract_answer(completion)
        return float(safe_verifiers.score_answer(self.name, dataset, answer, entry))


@functools.lru_cache(maxsize=256)
def _dataset(name: str, config_json: str, seed: int) -> Any:
    import reasoning_gym

    config = json.loads(config_json)
    config.pop("seed", None)
    config.pop("size", None)
    # size only bounds iteration; ds[i] depends on (config, seed + i) alone.
    return reasoning_gym.create_dataset(name, seed=seed, size=2**31 - 1, **config)


@functools.lru_cache(maxsize=64)
def get_family(name: str) -> TaskFamily:
    """The family for a name: a ReasoningGym dataset or ``module:attr``."""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        obj = getattr(importlib.import_module(module_name), attr)
        family = obj() if isinstance(obj, type) else obj
        if not isinstance(family, TaskFamily):
            raise TypeError(f"{name} has no make(ref) and score(task, completion)")
        return family
    return ReasoningGymFamily(name)


def make_task(ref: TaskRef) -> Task:
    """Regenerate a task from its reference."""
    return get_family(ref.family).make(ref)


def build_messages(question: str, system_prompt: str, one_shot: bool) -> list[dict[str, str]]:
    """The chat of one prompt: system, optionally one worked example, the question."""
    messages = [{"role": "system", "content": system_prompt}]
    if one_shot:
        messages += [
            {"role": "user", "content": ONE_SHOT_QUESTION},
            {"role": "assistant", "content": ONE_SHOT_ANSWER},
        ]
    messages.append({"role": "user", "content": question})
    return messages


# --- scoring -------------------------------------------------------------------------


def score_in_worker(task: Task, completion: str) -> float:
    """Runs inside the sandbox worker: the family's verifier on one completion."""
    score = get_family(task.ref.family).score(task, completion)
    return min(1.0, max(0.0, float(score)))


def generator_of(family: str) -> str:
    """What generates a family's tasks, as 'name version'; peers must agree on it.

    >>> generator_of("basic_arithmetic") == f"reasoning_gym {RG_VERSION}"
    True
    """
    if ":" not in family:
        return f"reasoning_gym {RG_VERSION}"
    return str(getattr(get_family(family), "generator", "custom 1"))


@dataclass(frozen=True)
class ScoreResult:
    """Reward of one completion, and why it is 0 when the verifier failed."""

    reward: float
    raw_score: float
    error: str | None = None


class ScorerUnavailable(RuntimeError):
    """The scoring worker cannot start: the node cannot score anything."""


class Scorer:
    """Scores completions in a sandboxed worker; failures score 0 and are logged.

    A worker that cannot start at all raises ScorerUnavailable instead: scoring every
    completion 0 would train on nothing while looking alive.
    """

    def __init__(
        self,
        *,
        reward: str = "binary",
        correct_threshold: float = 0.999,
        max_completion_chars: int = 8192,
        timeout_s: float = 2.0,
        memory_mb: int = 1024,
        reasoning_gym: bool = True,
    ) -> None:
        self.reward = reward
        self.correct_threshold = correct_threshold
        self.max_completion_chars = max_completion_chars
        self._sandbox = Sandbox(
            score_in_worker,
            SandboxLimits(
                timeout_s=timeout_s,
                memory_mb=memory_mb,
                # sympy's parser compiles text; safe_verifiers vets the text first.
                compile_allowed_from=DEFAULT_COMPILE_ALLOWLIST
                | safe_verifiers.TRUSTED_COMPILE_CALLERS,
            ),
            warmup=functools.partial(safe_verifiers.warmup, reasoning_gym=reasoning_gym),
        )

    @classmethod
    def of(cls, config: Any) -> Scorer:
        """The scorer of a node's ``Config`` (its ``tasks`` and ``scoring``; not imported
        here: config imports this module through the wire format). Its worker imports
        ReasoningGym ahead of the first call only if a family is ReasoningGym's: a node of
        custom families alone never scores one (peers' groups of other families are
        refused before scoring), and spares each worker start that import."""
        sc = config.scoring
        return cls(
            reward=config.tasks.reward,
            correct_threshold=config.tasks.correct_threshold,
            max_completion_chars=sc.max_completion_chars,
            timeout_s=sc.timeout_s,
            memory_mb=sc.memory_mb,
            reasoning_gym=any(":" not in f.name for f in config.tasks.families),
        )

    def _to_reward(self, raw: float) -> float:
        if self.reward == "binary":
            return 1.0 if raw >= self.correct_threshold else 0.0
        return raw

    def score(self, task: Task, completions: Sequence[str]) -> list[ScoreResult]:
        """Score every completion of one task, in order."""
        bounded = [c[: self.max_completion_chars] for c in completions]
        results = self._sandbox.map([(task, c) for c in bounded])
        out = []
        for r in results:
            if r.error is not None and r.error.startswith("startup failed"):
                raise ScorerUnavailable(f"the scoring worker cannot start: {r.error}")
            if r.error is not None:
                log.warning("verifier failed", family=task.ref.family, reason=r.error)
                out.append(ScoreResult(0.0, 0.0, r.error))
            else:
                out.append(ScoreResult(self._to_reward(r.value), r.value))
        return out

    def close(self) -> None:
        self._sandbox.close()

    def __enter__(self) -> Scorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
