"""Tests of the eval-free ReasoningGym scorers (sapo_node.safe_verifiers).

Each safe scorer must give exactly the original ``score_answer``'s score on gold, wrong,
list-form (partial credit), garbage and missing answers, and must do nothing on payloads.
Originals are only ever run on harmless text here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import reasoning_gym
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sapo_node import safe_verifiers as sv
from sapo_node.sandbox import DEFAULT_COMPILE_ALLOWLIST, Sandbox, SandboxLimits

EVAL_FAMILIES = sorted(sv.DATASET_FREE_FAMILIES)
SYMPY_FAMILIES = [
    "countdown",
    "puzzle24",
    "polynomial_multiplication",
    "simple_integration",
    "intermediate_integration",
]
N_ENTRIES = {family: 50 for family in EVAL_FAMILIES} | {family: 8 for family in SYMPY_FAMILIES}

GARBAGE = [
    "",
    "   ",
    "hello world",
    "None",
    "[]",
    "[[]]",
    "[[1, 2",
    "((((",
    "'abc'",
    "{'a': 1}",
    "[1, 2, 3]",
    "0x",
    "1 2 3",
    "x.y",
    "\x00",
]

PAYLOADS = [
    "__import__('os').system('touch PWNED_SYSTEM')",
    "open('PWNED_OPEN', 'w')",
    "[open('PWNED_LIST', 'w')]",
    "[[__import__('os').system('touch PWNED_MATRIX')]]",
    "exec(\"open('PWNED_EXEC', 'w')\")",
    "().__class__.__base__.__subclasses__()",
    "[x for x in ().__class__.__mro__]",
    "lambda: open('PWNED_LAMBDA', 'w')",
]
"""Answers that, eval'ed, would create files in the working directory (or dig for them)."""


@cache
def dataset(family: str) -> Any:
    return reasoning_gym.create_dataset(family, seed=1234, size=N_ENTRIES[family])


def entries(family: str) -> list[dict[str, Any]]:
    ds = dataset(family)
    return [ds[i] for i in range(len(ds))]


def _rows(gold: str) -> list[list[str]]:
    return [row.split() for row in gold.split("\n")]


def wrong_answer(family: str, entry: dict[str, Any]) -> str:
    """A plausible but wrong answer (same shape as the gold answer)."""
    gold = entry["answer"]
    if family == "bitwise_arithmetic":
        return hex(int(gold, 0) + 1)
    if family == "number_sorting":
        numbers = json.loads(gold.replace("'", '"'))
        return str(numbers[::-1] if len(set(numbers)) > 1 else numbers + numbers)
    if family == "n_queens":
        return "\n".join(row[::-1] for row in gold.split("\n")[::-1])
    if family in ("binary_matrix", "spiral_matrix"):
        return ("1" if gold[0] != "1" else "2") + gold[1:]
    return gold + "A"


def list_forms(family: str, answer: str) -> list[str]:
    """The answer written as Python literals (the partial-credit path of the originals)."""
    if family == "binary_matrix":
        rows = [[int(x) for x in row] for row in _rows(answer)]
        return [repr(rows), json.dumps(rows, indent=2), "  " + str(tuple(map(tuple, rows)))]
    if family == "spiral_matrix":
        items = [int(x) for x in answer.split()]
        return [repr(items), repr(tuple(items)), repr([str(x) for x in items])]
    if family == "string_insertion":
        return [repr(list(answer)), repr(answer), repr(tuple(answer))]
    if family == "n_queens":
        rows = _rows(answer)
        return [repr(rows), json.dumps(rows), repr(tuple(rows))]
    if family == "number_sorting":
        numbers = json.loads(answer.replace("'", '"'))
        return [json.dumps(numbers), json.dumps([float(x) for x in numbers]), repr(numbers)]
    if family == "bitwise_arithmetic":
        value = int(answer, 0)
        return [str(value), bin(value), f"  {answer}  ", answer.upper()]
    return []


def answers(family: str, entry: dict[str, Any]) -> list[str | None]:
    gold = entry["answer"]
    wrong = wrong_answer(family, entry) if family in EVAL_FAMILIES else "1"
    return [
        gold,
        wrong,
        *list_forms(family, gold),
        *list_forms(family, wrong),
        *GARBAGE,
        None,
    ]


@pytest.mark.parametrize("family", EVAL_FAMILIES + SYMPY_FAMILIES)
def test_safe_scorer_matches_original(family: str) -> None:
    ds = dataset(family)
    seen: set[float] = set()
    for entry in entries(family):
        for answer in answers(family, entry):
            expected = ds.score_answer(answer, entry)
            got = sv.score_answer(family, ds, answer, entry)
            assert got == expected, (family, answer, entry["answer"])
            seen.add(got)
    assert 1.0 in seen
    partial = {"binary_matrix": 0.1, "spiral_matrix": 0.1, "string_insertion": 0.1}
    partial |= {"n_queens": 0.5, "countdown": 0.01, "puzzle24": 0.01}
    if family in partial:
        assert partial[family] in seen  # the list-form / partial-credit path was exercised


@pytest.mark.parametrize("family", EVAL_FAMILIES)
def test_dataset_free_families_need_no_dataset(family: str) -> None:
    for entry in entries(family)[:5]:
        assert sv.score_answer(family, None, entry["answer"], entry) == 1.0


def test_other_families_use_the_dataset() -> None:
    ds = reasoning_gym.create_dataset("leg_counting", seed=3, size=2)
    entry = ds[0]
    assert sv.score_answer("leg_counting", ds, entry["answer"], entry) == 1.0
    assert sv.score_entry("leg_counting", entry["answer"], entry) == 1.0
    with pytest.raises(ValueError):
        sv.score_answer("leg_counting", None, entry["answer"], entry)


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("family", EVAL_FAMILIES + SYMPY_FAMILIES)
def test_payloads_score_zero_and_do_nothing(family: str, in_tmp: Path) -> None:
    ds = dataset(family)
    unparsable = 0.01 if family in ("countdown", "puzzle24") else 0.0
    for entry in entries(family)[:3]:
        for payload in PAYLOADS:
            assert sv.score_answer(family, ds, payload, entry) == unparsable, payload


def test_bitwise_problem_is_never_evaluated(in_tmp: Path) -> None:
    entry = entries("bitwise_arithmetic")[0]
    for problem in PAYLOADS + ["9**9**9", "1 << 10**9", "(1 << 1000) ** 1000"]:
        hostile = {**entry, "metadata": {**entry["metadata"], "problem": problem}}
        assert sv.score_answer("bitwise_arithmetic", None, "0x0", hostile) == 0.0


def _eval_trusted(expression: str) -> int:
    """Python's own evaluation of a generator-made expression (reference only)."""
    return eval(expression, {"__builtins__": {}})


@pytest.mark.parametrize("difficulty", [1, 2, 5, 10])
def test_safe_int_eval_matches_eval_on_generated_problems(difficulty: int) -> None:
    ds = reasoning_gym.create_dataset("bitwise_arithmetic", seed=7, size=20, difficulty=difficulty)
    for i in range(len(ds)):
        problem = ds[i]["metadata"]["problem"]
        assert sv.safe_int_eval(problem) == _eval_trusted(problem)
        assert hex(sv.safe_int_eval(problem)) == ds[i]["answer"]


@pytest.mark.parametrize(
    "expression",
    ["0x10 - -0x3", "+5", "(0x1 << 0x3) >> 0x1", "-7 >> 1", "0b101 * 0o7", "  (1 + 2)"],
)
def test_safe_int_eval_semantics(expression: str) -> None:
    assert sv.safe_int_eval(expression) == _eval_trusted(expression.lstrip())


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("1 << -1", ValueError),
        ("1 << 5000", ValueError),
        ("9 ** 9 ** 9", ValueError),
        ("1.5 + 1", ValueError),
        ("True + 1", ValueError),
        ("x + 1", ValueError),
        ("__import__('os')", ValueError),
        ("(1 + ", SyntaxError),
        ("(" * 300 + "1" + ")" * 300, SyntaxError),
        ("1" + " * (1 << 1000)" * 140, ValueError),  # too many bits
        ("1" + " + 1" * 3000, ValueError),  # too deep
        ("1" + " + 1" * 60_000, ValueError),  # too long
    ],
)
def test_safe_int_eval_refuses(expression: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        sv.safe_int_eval(expression)


def test_literal_length_bound() -> None:
    entry = entries("spiral_matrix")[0]
    gold = entry["answer"]
    padded = "[" + " " * (sv.MIN_LITERAL_CHARS + 10 * len(gold)) + ", ".join(gold.split()) + "]"
    assert sv.score_answer("spiral_matrix", None, padded, entry) == 0.0
    assert sv.score_answer("spiral_matrix", None, padded.replace(" " * 100, ""), entry) == 0.1


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("82 + 20 + 67 - 50", True),
        ("(4*8 - 6) - 2", True),
        ("3! + 2^3", True),
        ("2*(-10*x - 10)**(3/2)/3 + C", True),
        ("-3*Integral(x**2*sin(x), x) + exp(2*x)/2 + C", True),
        ("foo(x) + bar", True),  # unknown names become symbols / undefined functions
        ("__import__('os').system('x')", False),
        ("x.y", False),
        ("'text'", False),
        ("[1, 2]", False),
        ("lambda: 1", False),
        ("eval", False),
        ("sympify", False),
        ("N(2)", False),
        ("getattr(x, y)", False),
        ("𝐞𝐯𝐚𝐥(1)", False),  # NFKC-normalises to eval
        ("x = 1", False),
        ("1 if x else 2", False),
        ("(", False),
        ("1" * (sv.MAX_SYMPY_CHARS + 1), False),
    ],
)
def test_vet_sympy_text(text: str, ok: bool) -> None:
    assert sv.vet_sympy_text(text) is ok


def test_vet_sympy_text_allows_task_variables() -> None:
    assert not sv.vet_sympy_text("N**2 + C")
    assert sv.vet_sympy_text("N**2 + C", frozenset({"N"}))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    family=st.sampled_from(["binary_matrix", "spiral_matrix", "string_insertion", "n_queens"]),
    index=st.integers(min_value=0, max_value=4),
    text=st.text(alphabet="[](), '\"0123456789ABCDEQ_\n", max_size=40),
)
def test_literal_scorers_match_on_random_text(family: str, index: int, text: str) -> None:
    """Texts over this alphabet are harmless to ``eval``, so the originals may run on them."""
    ds = dataset(family)
    entry = ds[index]
    assert sv.score_answer(family, ds, text, entry) == ds.score_answer(text, entry)


# --------------------------------------------------------------------------------------------
# Through the sandbox
# --------------------------------------------------------------------------------------------

SANDBOX_LIMITS = SandboxLimits(
    timeout_s=3.0, compile_allowed_from=DEFAULT_COMPILE_ALLOWLIST | sv.TRUSTED_COMPILE_CALLERS
)


@pytest.fixture(scope="module")
def scoring_box() -> Iterator[Sandbox]:
    with Sandbox(sv.score_entry, SANDBOX_LIMITS, warmup=sv.warmup) as box:
        yield box


@pytest.mark.parametrize("family", EVAL_FAMILIES + SYMPY_FAMILIES)
def test_sandboxed_scoring_matches(scoring_box: Sandbox, family: str) -> None:
    for entry in entries(family)[:3]:
        for answer in (entry["answer"], *list_forms(family, entry["answer"]), "garbage", None):
            result = scoring_box.call(family, answer, entry)
            assert result.ok, result.error
            assert result.value == sv.score_answer(family, dataset(family), answer, entry)


@pytest.mark.parametrize("family", EVAL_FAMILIES + SYMPY_FAMILIES)
def test_sandboxed_payloads_create_nothing(
    scoring_box: Sandbox, family: str, tmp_path: Path
) -> None:
    entry = entries(family)[0]
    unparsable = 0.01 if family in ("countdown", "puzzle24") else 0.0
    for template in PAYLOADS:
        payload = template.replace("PWNED", str(tmp_path / "PWNED"))
        result = scoring_box.call(family, payload, entry)
        assert result.value == unparsable, (payload, result)
    assert list(tmp_path.iterdir()) == []


def test_sandbox_contains_what_vetting_does_not(scoring_box: Sandbox) -> None:
    """``9**9**9`` is valid arithmetic for sympy: only the sandbox's timeout stops it."""
    entry = entries("countdown")[0]
    assert scoring_box.call("countdown", "9**9**9", entry).error in ("timeout", "memory")
    assert scoring_box.call("countdown", entry["answer"], entry).value == 1.0


def test_sandbox_contains_deep_recursion(scoring_box: Sandbox) -> None:
    """propositional_logic's recursive parser raises RecursionError on deep nesting."""
    ds = reasoning_gym.create_dataset("propositional_logic", seed=1, size=1)
    entry = ds[0]
    result = scoring_box.call("propositional_logic", "(" * 5000 + "P" + ")" * 5000, entry)
    assert result.value in (None, 0.0)
    assert result.error is None or result.error.startswith("exception: RecursionError")
    assert scoring_box.call("propositional_logic", "P", entry).ok


def test_sandbox_blocks_raw_eval_verifiers(tmp_path: Path) -> None:
    """The original eval-based verifiers, sandboxed, are stopped by the guard instead."""
    entry = entries("string_insertion")[0]
    payload = f"__import__('os').system('touch {tmp_path}/PWNED')"
    with Sandbox(_original_score, SandboxLimits(timeout_s=3.0), warmup=sv.warmup) as box:
        result = box.call("string_insertion", payload, entry)
    assert result.error is not None
    assert result.error.startswith("blocked: compile")
    assert list(tmp_path.iterdir()) == []


def _original_score(family: str, answer: str | None, entry: dict[str, Any]) -> float:
    """The unpatched ReasoningGym scorer (runs in the worker)."""
    return reasoning_gym.create_dataset(family, size=1, seed=0).score_answer(answer, entry)
