from __future__ import annotations

import doctest
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sapo_node import curriculum as curriculum_module
from sapo_node import tasks
from sapo_node.ops import plot as plot_module
from sapo_node.tasks import (
    PAPER_FAMILIES,
    Scorer,
    TaskRef,
    build_messages,
    extract_answer,
    make_task,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module", [tasks, plot_module, curriculum_module])
def test_doctests(module) -> None:
    assert doctest.testmod(module).failed == 0


def _digest(refs: list[TaskRef]) -> str:
    h = hashlib.sha256()
    made = {(r.family, r.index): make_task(r) for r in refs}
    for key in sorted(made):
        h.update(json.dumps([made[key].question, made[key].answer], sort_keys=True).encode())
    return h.hexdigest()


def _refs() -> list[TaskRef]:
    return [TaskRef.make(f, {}, 1234, i) for f in PAPER_FAMILIES for i in (0, 7)]


def test_paper_families_regenerate_identically_in_another_process() -> None:
    here = _digest(_refs())
    code = (
        "from tests.unit.test_tasks import _digest, _refs\nprint(_digest(list(reversed(_refs()))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONHASHSEED": "77", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == here  # also: nothing else printed (bf prints if let)


def test_ref_is_canonical() -> None:
    a = TaskRef.make("basic_arithmetic", {"b": 1, "a": [1, 2]}, 5, 3)
    b = TaskRef.make("basic_arithmetic", {"a": (1, 2), "b": 1}, 5, 3)
    assert a == b and hash(a) == hash(b)
    assert a.config == {"a": [1, 2], "b": 1}


def test_unknown_family() -> None:
    with pytest.raises(KeyError, match="unknown ReasoningGym dataset"):
        make_task(TaskRef.make("no_such_family", {}, 1, 0))


def test_messages_ask_for_answer_tags() -> None:
    msgs = build_messages("What is 2 + 2?", "Use <answer> tags.", one_shot=True)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert extract_answer(msgs[2]["content"]) == "26"
    assert msgs[-1]["content"] == "What is 2 + 2?"
    assert len(build_messages("q", "s", one_shot=False)) == 2


def test_extract_answer_is_linear_on_hostile_text() -> None:
    text = "<answer>" * 50_000 + "x"
    assert extract_answer(text) is None  # ReasoningGym's regex takes seconds on this


@pytest.fixture(scope="module")
def scorer():
    with Scorer(timeout_s=2.0) as s:
        yield s


def test_true_answer_scores_one_and_wrong_scores_zero(scorer: Scorer) -> None:
    task = make_task(TaskRef.make("basic_arithmetic", {"max_terms": 2, "max_digits": 1}, 9, 0))
    results = scorer.score(task, [f"<answer>{task.answer}</answer>", "<answer>nope</answer>", ""])
    assert [r.reward for r in results] == [1.0, 0.0, 0.0]
    assert all(r.error is None for r in results)


def test_partial_credit_becomes_binary(scorer: Scorer) -> None:
    task = make_task(TaskRef.make("basic_arithmetic", {"max_terms": 2, "max_digits": 1}, 9, 1))
    padded = f"<answer>{task.answer} {task.answer}</answer>"  # gold inside: partial credit
    raw = scorer.score(task, [padded])[0]
    assert 0 < raw.raw_score < 1 and raw.reward == 0.0


def test_eval_payload_in_a_completion_creates_nothing(scorer: Scorer, tmp_path: Path) -> None:
    target = tmp_path / "pwned.txt"
    task = make_task(TaskRef.make("binary_matrix", {"min_n": 2, "max_n": 3}, 3, 0))
    payloads = [
        f"<answer>__import__('os').system('touch {target}')</answer>",
        f"<answer>open('{target}', 'w').write('x')</answer>",
        f"<answer>[[1]] if open('{target}','w') else 0</answer>",
    ]
    results = scorer.score(task, payloads)
    assert [r.reward for r in results] == [0.0, 0.0, 0.0]
    assert not target.exists()
    assert not (REPO / "pwned.txt").exists()


def test_hanging_and_crashing_verifiers_score_zero_and_scoring_goes_on() -> None:
    with Scorer(timeout_s=0.5) as s:
        hang = make_task(TaskRef.make("tests.support.families:Hangs", {}, 1, 0))
        crash = make_task(TaskRef.make("tests.support.families:Crashes", {}, 1, 0))
        ok = make_task(TaskRef.make("tests.support.families:Sevens", {}, 1, 0))
        assert [r.error for r in s.score(hang, ["x"])] == ["timeout"]
        crashed = s.score(crash, ["x"])[0]
        assert crashed.reward == 0.0 and "crash" in crashed.error
        assert [r.reward for r in s.score(ok, ["77"])] == [1.0]


@pytest.mark.parametrize(
    ("families", "imported"),
    [
        (["tests.support.families:GymLoaded"], 0.0),
        (["tests.support.families:GymLoaded", "gcd"], 1.0),
    ],
)
def test_the_worker_imports_reasoning_gym_only_for_its_families(families, imported) -> None:
    """A node of custom families alone spares its scoring worker the import (seconds at
    each worker start); one with a ReasoningGym family imports it ahead of the first call."""
    from sapo_node.config import load_config

    specs = [{"name": f, "levels": [{}]} for f in families]
    config = load_config(overrides={"tasks": {"families": specs}}, environ={})
    task = make_task(TaskRef.make("tests.support.families:GymLoaded", {}, 1, 0))
    with Scorer.of(config) as s:
        assert [r.raw_score for r in s.score(task, ["x"])] == [imported]


def test_completions_are_bounded_before_scoring(scorer: Scorer) -> None:
    task = make_task(TaskRef.make("tests.support.families:Sevens", {}, 1, 0))
    long = "7" * 10 + "x" * 1_000_000
    r = scorer.score(task, [long])[0]
    assert r.error is None
    assert r.raw_score == pytest.approx(10 / scorer.max_completion_chars)


def test_a_worker_that_cannot_start_is_loud(monkeypatch) -> None:
    from tests.support.families import broken_warmup

    monkeypatch.setattr(tasks.safe_verifiers, "warmup", broken_warmup)
    with Scorer(timeout_s=1.0) as s:
        task = make_task(TaskRef.make("tests.support.families:Sevens", {}, 1, 0))
        with pytest.raises(tasks.ScorerUnavailable, match="cannot start"):
            s.score(task, ["7"])
