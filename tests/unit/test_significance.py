"""The experiment's statistics on known inputs."""

from __future__ import annotations

import itertools
import math

import pytest

from sapo_node.experiment.significance import (
    bootstrap_interval,
    sign_flip_p,
    smallest_p,
    wilson_interval,
)


def _naive_p(d: list[float]) -> float:
    obs = abs(sum(d))
    pats = list(itertools.product((1, -1), repeat=len(d)))
    return sum(
        abs(sum(s * x for s, x in zip(p, d, strict=True))) >= obs - 1e-12 for p in pats
    ) / len(pats)


def test_sign_flip_exact_values() -> None:
    assert sign_flip_p([1, 2, 3, 4]) == 0.125  # all one sign: the smallest p with 4 pairs
    assert sign_flip_p([-1, -2, -3, -4]) == 0.125
    assert sign_flip_p([0, 0, 0, 0]) == 1.0
    # |3, 1, 1, 2| with |signed sum| >= 5: 7 (all +), 5 twice (one 1 flipped), negated
    assert sign_flip_p([3, 1, -1, 2]) == 6 / 16
    assert sign_flip_p([1, 2, 3, 4, 5, 6, 7, 8]) == 2 / 256
    assert sign_flip_p([]) == 1.0


@pytest.mark.parametrize("d", [[0.3, -0.1, 0.7], [1.5, 1.5, -1.5, 0.2, 0.1], [2.0, -2.0]])
def test_sign_flip_equals_a_naive_enumeration(d: list[float]) -> None:
    assert sign_flip_p(d) == pytest.approx(_naive_p(d))


def test_sign_flip_sampled_beyond_exact() -> None:
    p = sign_flip_p([1.0] * 24, samples=20_000)
    assert 0 < p < 1e-3  # exact would be 2 / 2**24
    assert sign_flip_p([1.0, -1.0] * 12, samples=2000) == 1.0


def test_smallest_p() -> None:
    assert smallest_p(4) == 0.125
    assert smallest_p(1) == 1.0
    assert smallest_p(0) == 1.0


def test_wilson_known_values() -> None:
    lo, hi = wilson_interval(5, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.2366, 0.7634)
    lo, hi = wilson_interval(0, 20)
    assert lo == 0.0 and hi == pytest.approx(0.1611, abs=1e-4)
    lo, hi = wilson_interval(20, 20)
    assert hi == 1.0 and lo == pytest.approx(1 - 0.1611, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_bootstrap_interval() -> None:
    assert bootstrap_interval([0.5] * 7) == (0.5, 0.5)
    values = [0.0] * 50 + [1.0] * 50
    lo, hi = bootstrap_interval(values)
    half = 1.96 * math.sqrt(0.25 / 100)  # the normal approximation's half width
    assert lo < 0.5 < hi
    assert lo == pytest.approx(0.5 - half, abs=0.02) and hi == pytest.approx(0.5 + half, abs=0.02)
    assert bootstrap_interval(values) == bootstrap_interval(values)  # seeded
