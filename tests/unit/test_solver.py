"""The solver member: answers in the format, right as often as asked, and its groups
pass `sapo-node share`'s receiver checks through a real pipe."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

from sapo_node.solver import solve, wrong_answer
from sapo_node.tasks import TaskRef, extract_answer, make_task

REPO = Path(__file__).resolve().parents[2]
ARITH = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"]}


def test_answers_are_in_the_format_and_right_as_often_as_asked() -> None:
    rng = random.Random(0)
    right = total = 0
    for index in range(50):
        task = make_task(TaskRef.make("basic_arithmetic", ARITH, 1, index))
        texts, ok = solve(task, 8, 0.75, rng)
        for text, is_right in zip(texts, ok, strict=True):
            answer = extract_answer(text)
            assert answer is not None and (answer == task.answer) == is_right
        right += sum(ok)
        total += len(ok)
    assert 0.68 < right / total < 0.82  # 400 draws of p = 0.75


def test_wrong_answers_differ_for_every_kind() -> None:
    rng = random.Random(1)
    for answer in ["7", "-3", "0.5", "3/4", "True", "No", "abc", "aa", ""]:
        assert wrong_answer(answer, rng) != answer


def test_the_script_pipes_checked_groups_into_share(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    solver = subprocess.Popen(
        [sys.executable, "scripts/solver.py", "--rounds", "2", "--every", "0", "--groups", "2"]
        + ["--accuracy", "1", "--seed", "5", "--completions", "4"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
    )
    share = subprocess.run(
        [sys.executable, "-m", "sapo_node.cli", "share", "-", "--check"],
        cwd=REPO,
        env={**env, "SAPO_NODE__DATA_DIR": f'"{tmp_path}"'},
        stdin=solver.stdout,
        capture_output=True,
        text=True,
        timeout=300,
    )
    solver.stdout.close()
    assert solver.wait(30) == 0
    assert share.returncode == 0, share.stderr[-2000:]
    assert "4 lines checked, 0 refused, 0 sent" in share.stdout
    assert share.stderr.count("rewards 1 1 1 1") == 4
