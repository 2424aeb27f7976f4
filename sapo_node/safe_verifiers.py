"""Eval-free replacements for the ReasoningGym verifiers that ``eval`` text.

Threat model: the *answer* passed to a verifier is written by a language model or received
from a network peer, so it is hostile text.  ReasoningGym 0.1.25 hands such text to ``eval``
in a few ``score_answer`` methods (their partial-credit path for answers written as a Python
list), which lets a completion run arbitrary code (``__import__('os').system(...)``) or burn
CPU (``9**9**9``).  Two more verifiers ``eval`` *task-side* strings (number_sorting's gold
answer fallback, bitwise_arithmetic's problem); those strings are trusted only because tasks
are regenerated locally, and evaluating them without ``eval`` costs nothing.

This module replaces those verifiers by functions that reproduce the original scores
(including the 0.1 / 0.5 partial credit) on every literal input while never calling
``eval``/``exec``:

* ``binary_matrix``, ``spiral_matrix``, ``string_insertion``, ``n_queens``: the answer-side
  ``eval`` becomes :func:`ast.literal_eval` after a length check.
* ``number_sorting``: the gold-answer ``eval`` fallback becomes :func:`ast.literal_eval`.
* ``bitwise_arithmetic``: the problem is evaluated by a tiny interpreter of the grammar the
  generator emits (int literals, ``+ - * << >>``, parentheses) with bounds on shift amounts
  and integer size.

* ``countdown``, ``puzzle24``, ``polynomial_multiplication``, ``simple_integration``,
  ``intermediate_integration`` parse the answer with ``sympy.parse_expr``, which is ``eval``
  underneath (``__import__('os').system(...)`` runs).  Their answers are vetted first
  (:func:`vet_sympy_text`: numbers, operators, parentheses, commas and names that are either
  plain symbols or known math functions; no attributes, strings, subscripts, keywords or
  dunders) and only vetted text reaches the original verifier; rejected text gets the score
  the original gives to an unparsable answer.  Vetting removes code execution, not cost
  (``9**9**9``): run these inside :class:`sapo_node.sandbox.Sandbox`, whose compile guard must
  then allow :data:`TRUSTED_COMPILE_CALLERS`.

Known, deliberate differences from the originals: answers that are non-literal Python
expressions (``[[0]*3]*3``, ``[1+2]``, ``list(range(3))``) or longer than the length bound no
longer earn the list-form partial credit; problems outside the generator's grammar or
bounds score 0; sympy answers using names outside the vetted set (``N(x)``, ``S(1)/2``,
``Rational`` is fine) or non-ASCII names get the unparsable-answer score.

The module is pure (no processes, no I/O).  Run all scoring, these scorers included, inside
:class:`sapo_node.sandbox.Sandbox`: other verifiers may still hang, recurse or allocate on
hostile text.
"""

from __future__ import annotations

import ast
import builtins
import io
import json
import keyword
import tokenize
from collections.abc import Callable
from functools import lru_cache
from typing import Any

__all__ = [
    "MAX_PROBLEM_CHARS",
    "MAX_SYMPY_CHARS",
    "MIN_LITERAL_CHARS",
    "DATASET_FREE_FAMILIES",
    "SAFE_SCORERS",
    "SAFE_SYMPY_NAMES",
    "TRUSTED_COMPILE_CALLERS",
    "Scorer",
    "safe_int_eval",
    "score_answer",
    "score_entry",
    "vet_sympy_text",
    "warmup",
]

Scorer = Callable[[Any, str | None, dict[str, Any]], float]
"""Signature of a scorer: ``(dataset, answer, entry) -> score``."""

MIN_LITERAL_CHARS = 4096
"""Answers up to this many characters are always fed to ``literal_eval``."""

LITERAL_CHARS_PER_ORACLE_CHAR = 10
"""Longer answers are accepted up to this multiple of the gold answer's length (the list form
of a gold answer is 1.5-5 times longer than the gold answer itself)."""

MAX_PROBLEM_CHARS = 200_000
"""Longest bitwise_arithmetic problem evaluated (difficulty 10 problems are ~25k chars)."""

MAX_SHIFT = 1024
"""Largest shift amount accepted in a bitwise_arithmetic problem (the generator uses 0-3)."""

MAX_INT_BITS = 1 << 17
"""Largest integer (in bits) a bitwise_arithmetic problem may produce on the way (difficulty
10 problems stay below 2**15 bits)."""


def _literal(text: str, oracle_len: int) -> Any:
    """``ast.literal_eval(text)`` for texts of a bounded length (relative to the gold answer).

    Raises ValueError when ``text`` is too long, and whatever ``literal_eval`` raises.
    """
    limit = max(MIN_LITERAL_CHARS, LITERAL_CHARS_PER_ORACLE_CHAR * oracle_len)
    if len(text) > limit:
        raise ValueError(f"literal of {len(text)} chars exceeds the bound of {limit}")
    return ast.literal_eval(text)


def _matrix_to_str(matrix: Any) -> str:
    """Same as ``BinaryMatrixDataset._matrix_to_str``."""
    return "\n".join(" ".join(str(x) for x in row) for row in matrix)


def _board_to_string(board: Any) -> str:
    """Same as ``NQueensDataset._board_to_string``."""
    return "\n".join(" ".join(x for x in row) for row in board)


def score_binary_matrix(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """``BinaryMatrixDataset.score_answer`` without ``eval``."""
    oracle_answer = entry["answer"]
    if answer is not None:
        if answer == oracle_answer:
            return 1.0
        try:
            # check if answer is python list of lists
            if not isinstance(answer, str):
                return 0.0
            if _matrix_to_str(_literal(answer, len(oracle_answer))) == oracle_answer:
                return 0.1
        except Exception:
            return 0.0
    return 0.0


def score_spiral_matrix(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """``SpiralMatrixDataset.score_answer`` without ``eval``."""
    oracle_answer = entry["answer"].strip()
    if answer is not None and len(answer) > 0:
        answer = answer.strip()
        if answer == oracle_answer:
            return 1.0
        # Try to see if the model's answer is a python list
        try:
            literal = _literal(answer, len(oracle_answer))
            if " ".join(str(item) for item in literal) == oracle_answer:
                return 0.1
        except Exception:
            pass
    return 0.0


def score_string_insertion(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """``StringInsertionDataset.score_answer`` without ``eval``."""
    oracle_answer = entry["answer"]
    if isinstance(answer, str):
        if answer == oracle_answer:
            return 1.0
        try:
            # check if answer is python list of characters
            if "".join(_literal(answer, len(oracle_answer))) == oracle_answer:
                return 0.1
        except Exception:
            pass
    return 0.0


def score_n_queens(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """``NQueensDataset.score_answer`` without ``eval``."""
    if isinstance(answer, str):
        valid_solutions = entry["metadata"]["valid_answers"]
        if answer in valid_solutions:
            return 1.0
        try:
            oracle_len = len(entry["answer"])
            if _board_to_string(_literal(answer, oracle_len)) in valid_solutions:
                return 0.5
        except Exception:
            pass
    return 0.0


def score_number_sorting(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """``NumberSortingDataset.score_answer`` with its gold-answer ``eval`` fallback replaced."""
    if answer is None:
        return 0.0
    try:
        try:
            user_answer = json.loads(answer.replace("'", '"'))
        except json.JSONDecodeError:
            return 0.0
        if not isinstance(user_answer, list):
            return 0.0
        try:
            expected_answer = json.loads(entry["answer"])
        except json.JSONDecodeError:
            # the generator writes str(list_of_str): a Python literal, not JSON
            expected_answer = ast.literal_eval(entry["answer"])
        if len(user_answer) != len(expected_answer):
            return 0.0
        user_floats = [float(num) for num in user_answer]
        expected_floats = [float(num) for num in expected_answer]
        if entry["metadata"]["direction"] == "ascending":
            is_correctly_sorted = user_floats == sorted(user_floats)
        else:
            is_correctly_sorted = user_floats == sorted(user_floats, reverse=True)
        if not is_correctly_sorted:
            return 0.0
        tolerance = 1
        for user, expected in zip(user_floats, expected_floats, strict=True):
            if abs(user - expected) > tolerance:
                return 0.0
        return 1.0
    except Exception:
        return 0.0


_INT_BINOPS: dict[type[ast.operator], Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.LShift: lambda a, b: a << b,
    ast.RShift: lambda a, b: a >> b,
}


def safe_int_eval(expression: str) -> int:
    """Evaluate an integer expression of the bitwise_arithmetic grammar without ``eval``.

    Accepts int literals (any base Python accepts), unary ``+``/``-``, binary ``+ - * << >>``
    and parentheses; gives what ``eval`` gives on them.  Raises ValueError for anything else,
    for shift amounts outside ``[0, MAX_SHIFT]``, for values over ``MAX_INT_BITS`` bits and for
    expressions too long or deep, and SyntaxError (like ``eval``) for text that does not parse.
    """
    if len(expression) > MAX_PROBLEM_CHARS:
        raise ValueError(f"expression of {len(expression)} chars is too long")
    try:
        tree = ast.parse(expression.lstrip(" \t"), mode="eval")
    except RecursionError:
        raise ValueError("expression too deeply nested") from None

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant):
            if type(node.value) is not int:
                raise ValueError(f"unsupported constant {node.value!r}")
            result = node.value
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            operand = value(node.operand)
            result = -operand if isinstance(node.op, ast.USub) else operand
        elif isinstance(node, ast.BinOp) and type(node.op) in _INT_BINOPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, (ast.LShift, ast.RShift)):
                if right < 0:
                    raise ValueError("negative shift count")
                if right > MAX_SHIFT:
                    raise ValueError(f"shift by {right} exceeds {MAX_SHIFT}")
            if (
                isinstance(node.op, ast.Mult)
                and left.bit_length() + right.bit_length() > MAX_INT_BITS + 1
            ):
                raise ValueError("product too large")
            result = _INT_BINOPS[type(node.op)](left, right)
        else:
            raise ValueError(f"unsupported syntax: {type(node).__name__}")
        if result.bit_length() > MAX_INT_BITS:
            raise ValueError("intermediate value too large")
        return result

    try:
        return value(tree.body)
    except RecursionError:
        raise ValueError("expression too deeply nested") from None


def score_bitwise_arithmetic(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """``BitwiseArithmeticDataset.score_answer`` with the problem evaluated without ``eval``."""
    if isinstance(answer, str):
        try:
            correct_value = safe_int_eval(entry["metadata"]["problem"])
            # base 0: 0x -> hex, 0b -> binary, 0o -> octal, no prefix -> decimal
            user_value = int(str(answer), 0)
        except Exception:
            return 0.0
        if correct_value == user_value:
            return 1.0
    return 0.0


MAX_SYMPY_CHARS = 10_000
"""Longest answer handed to ``sympy.parse_expr``."""

SAFE_SYMPY_NAMES: frozenset[str] = frozenset(
    {
        *("sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "acot", "atan2"),
        *("asec", "acsc", "sinh", "cosh", "tanh", "coth", "sech", "csch"),
        *("asinh", "acosh", "atanh", "acoth", "erfi", "Ei", "Si", "Ci", "li"),
        *("exp", "log", "ln", "sqrt", "cbrt", "root", "Abs", "abs", "sign", "floor", "ceiling"),
        *("factorial", "binomial", "gamma", "erf", "Max", "Min", "max", "min", "pow", "round"),
        *("re", "im", "conjugate", "Integer", "Rational", "Float", "pi", "E", "I", "oo"),
        *("Integral", "Derivative"),  # intermediate_integration gold answers use Integral
    }
)
"""Names a vetted answer may use although sympy or Python defines them (math only)."""

_SYMPY_OPERATORS = frozenset({"+", "-", "*", "/", "**", "(", ")", ",", "^", "!"})
_SYMPY_SKIPPED_TOKENS = frozenset(
    {
        tokenize.NUMBER,
        tokenize.NEWLINE,
        tokenize.NL,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENDMARKER,
        tokenize.COMMENT,
    }
)

TRUSTED_COMPILE_CALLERS: frozenset[str] = frozenset({"sympy."})
"""Modules (a trailing dot: a package prefix) that compile/exec code while the sympy-based
scorers run: ``sympy.parse_expr`` evaluates the vetted answer, and sympy generates some
polynomial code at run time.  A :class:`sapo_node.sandbox.Sandbox` running :func:`score_entry`
must allow them (``SandboxLimits(compile_allowed_from=DEFAULT_COMPILE_ALLOWLIST |
TRUSTED_COMPILE_CALLERS)``); it is safe because no other verifier hands answer text to sympy's
parser (checked for ReasoningGym 0.1.25)."""


def _is_math_library_name(name: str) -> bool:
    """Whether ``name`` means something to ``parse_expr`` (a sympy or builtin global)."""
    import sympy

    return hasattr(sympy, name) or hasattr(builtins, name)


def vet_sympy_text(text: str, extra_names: frozenset[str] = frozenset()) -> bool:
    """Whether ``text`` is harmless to hand to ``sympy.parse_expr``.

    Accepts numbers, the operators ``+ - * / ** ^ !``, parentheses, commas and ASCII names
    that are either unknown to sympy and Python (``parse_expr`` turns them into symbols or
    undefined functions), in :data:`SAFE_SYMPY_NAMES`, or in ``extra_names`` (the task's own
    variables).  Rejects everything else: attribute access, strings, subscripts, keywords
    (``lambda``), names starting with ``_``, and texts over :data:`MAX_SYMPY_CHARS` chars.
    """
    if not isinstance(text, str) or len(text) > MAX_SYMPY_CHARS:
        return False
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, ValueError):
        return False
    for token in tokens:
        kind, string = token.type, token.string
        if kind in _SYMPY_SKIPPED_TOKENS:
            continue
        if kind == tokenize.NAME:
            if not string.isascii() or string.startswith("_") or keyword.iskeyword(string):
                return False
            if string in SAFE_SYMPY_NAMES or string in extra_names:
                continue
            if _is_math_library_name(string):
                return False
            continue
        if kind in (tokenize.OP, tokenize.ERRORTOKEN) and string in _SYMPY_OPERATORS:
            continue
        if kind == tokenize.ERRORTOKEN and string.isspace():
            continue
        return False
    return True


def _task_names(names: Any) -> frozenset[str]:
    """The task's variable names usable in answers (plain identifiers only)."""
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, (list, tuple, set, frozenset)):
        return frozenset()
    return frozenset(
        name
        for name in names
        if isinstance(name, str)
        and name.isidentifier()
        and name.isascii()
        and not name.startswith("_")
        and not hasattr(builtins, name)
    )


def _vetted_sympy_scorer(
    unparsable_score: float, names_key: str | None, extra: frozenset[str] = frozenset()
) -> Scorer:
    """A scorer that calls the original ``score_answer`` on vetted answers only.

    Args:
        unparsable_score: what the original returns for an answer ``parse_expr`` rejects;
            given to answers that fail vetting.
        names_key: ``entry["metadata"]`` key listing the task's variable names, if any.
        extra: further names allowed (the integration constant ``C``).
    """

    def score(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
        if answer is None:
            return float(dataset.score_answer(None, entry))
        names = extra
        if names_key is not None:
            names = names | _task_names(entry.get("metadata", {}).get(names_key))
        if not vet_sympy_text(answer, names):
            return unparsable_score
        return float(dataset.score_answer(answer, entry))

    return score


SAFE_SCORERS: dict[str, Scorer] = {
    "binary_matrix": score_binary_matrix,
    "spiral_matrix": score_spiral_matrix,
    "string_insertion": score_string_insertion,
    "n_queens": score_n_queens,
    "number_sorting": score_number_sorting,
    "bitwise_arithmetic": score_bitwise_arithmetic,
    "countdown": _vetted_sympy_scorer(0.01, None),
    "puzzle24": _vetted_sympy_scorer(0.01, None),
    "polynomial_multiplication": _vetted_sympy_scorer(0.0, "variables"),
    "simple_integration": _vetted_sympy_scorer(0.0, "variable", frozenset({"C"})),
    "intermediate_integration": _vetted_sympy_scorer(0.0, "variable", frozenset({"C"})),
}
"""Family name -> eval-free scorer reproducing the ReasoningGym ``score_answer``."""

DATASET_FREE_FAMILIES: frozenset[str] = frozenset(
    {
        "binary_matrix",
        "spiral_matrix",
        "string_insertion",
        "n_queens",
        "number_sorting",
        "bitwise_arithmetic",
    }
)
"""Families whose safe scorer does not use the dataset object (``dataset`` may be None)."""


def score_answer(family: str, dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """Score ``answer`` for ``entry`` of ReasoningGym family ``family``.

    Uses the eval-free scorer from :data:`SAFE_SCORERS` when there is one, else
    ``dataset.score_answer``.  ``family`` is the registered dataset name (for entries of a
    composite dataset: ``entry["metadata"]["source_dataset"]``); ``dataset`` (the dataset the
    entry came from, or one with the same config) may be None for the families in
    :data:`DATASET_FREE_FAMILIES`.
    """
    if dataset is None and family not in DATASET_FREE_FAMILIES:
        raise ValueError(f"family {family!r} needs its dataset to be scored")
    scorer = SAFE_SCORERS.get(family)
    if scorer is not None:
        return float(scorer(dataset, answer, entry))
    return float(dataset.score_answer(answer, entry))


@lru_cache(maxsize=64)
def _dataset(family: str, config_json: str) -> Any:
    """A small dataset of ``family`` built with the given (JSON-encoded) config, cached."""
    import reasoning_gym

    config = json.loads(config_json)
    config.setdefault("size", 1)
    config.setdefault("seed", 0)
    return reasoning_gym.create_dataset(family, **config)


def score_entry(
    family: str,
    answer: str | None,
    entry: dict[str, Any],
    config: dict[str, Any] | None = None,
) -> float:
    """Score by family name; a module-level function meant to run inside a sandbox worker.

    The dataset object needed by families without a safe scorer is built once per process
    from ``config`` (the dataset's config fields, JSON-serialisable; defaults when None) and
    cached, so that it never has to be pickled per call.
    """
    dataset = None
    if family not in DATASET_FREE_FAMILIES:
        dataset = _dataset(family, json.dumps(config or {}, sort_keys=True))
    return score_answer(family, dataset, answer, entry)


def warmup(reasoning_gym: bool = True) -> None:
    """Import ReasoningGym (slow, ~1-3 s) and sympy's parser ahead of the first scoring
    call; nothing for a node whose families are all custom (``reasoning_gym`` False)."""
    if reasoning_gym:
        import reasoning_gym  # noqa: F401
        import sympy.parsing.sympy_parser  # noqa: F401
