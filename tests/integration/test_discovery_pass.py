"""A discovery pass spends at most its dialling budget in all (SPEC.md section 2), its
bootstrap peers and the other peers it knows together: it dialled each kind within the
whole budget, so a pass took up to twice it. Runs ``tests/support/dial_pass.py`` in a
user and network namespace of its own; skipped where those are not allowed."""

from __future__ import annotations

import pytest

from tests.support.namespaces import run_unshared, unshare_problem


@pytest.mark.timeout(150)
def test_a_pass_dials_its_bootstrap_and_known_peers_within_one_budget() -> None:
    problem = unshare_problem("ip", "link", "set", "lo", "up")
    if problem:
        pytest.skip(problem)
    code, result, log = run_unshared("tests.support.dial_pass", timeout=120)
    assert code == 0 and result["ok"], f"exit {code}: {result}\nlog:\n{log}"
    assert result["passes_s"], result
