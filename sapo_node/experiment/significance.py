"""Small, pure statistics for the experiment's report: paired tests and intervals.

Nothing here knows of nodes or files; every function is a plain function of numbers,
tested with known inputs (tests/unit/test_significance.py).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence

EXACT_UP_TO = 20  # 2**20 sign patterns; above that the test samples patterns


def sign_flip_p(diffs: Sequence[float], *, samples: int = 200_000, seed: int = 0) -> float:
    """Two-sided p-value of a paired sign-flip permutation test of mean(diffs) = 0.

    Under the null each pair's difference is as likely to have either sign, so the
    observed |mean| is ranked among the |mean| of all 2**n sign patterns (exact up to
    n = 20, else ``samples`` random patterns plus the observed one). With n pairs the
    smallest possible p is 2 / 2**n (n = 4: 0.125), whatever the effect size.

    >>> sign_flip_p([1.0, 2.0, 3.0, 4.0])
    0.125
    >>> sign_flip_p([0.0, 0.0])
    1.0
    """
    d = [float(x) for x in diffs]
    n = len(d)
    if n == 0:
        return 1.0
    observed = abs(sum(d))
    tol = 1e-9 * max(1.0, observed)
    if n <= EXACT_UP_TO:
        hits = sum(
            abs(sum(s * x for s, x in zip(signs, d, strict=True))) >= observed - tol
            for signs in itertools.product((1.0, -1.0), repeat=n)
        )
        return hits / 2**n
    rng = random.Random(seed)
    hits = 1 + sum(
        abs(sum(x if rng.random() < 0.5 else -x for x in d)) >= observed - tol
        for _ in range(samples)
    )
    return hits / (samples + 1)


def smallest_p(n: int) -> float:
    """The smallest two-sided p an exact sign-flip test over n pairs can give.

    >>> smallest_p(4), smallest_p(8)
    (0.125, 0.0078125)
    """
    return 1.0 if n == 0 else min(1.0, 2.0 / 2**n)


def wilson_interval(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% by default).

    >>> lo, hi = wilson_interval(5, 10)
    >>> round(lo, 4), round(hi, 4)
    (0.2366, 0.7634)
    >>> wilson_interval(0, 0)
    (0.0, 1.0)
    """
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_interval(
    values: Sequence[float], *, level: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (deterministic by ``seed``).

    >>> bootstrap_interval([1.0, 1.0, 1.0])
    (1.0, 1.0)
    >>> bootstrap_interval([])
    (0.0, 1.0)
    """
    v = [float(x) for x in values]
    if not v:
        return 0.0, 1.0
    rng = random.Random(seed)
    n = len(v)
    means = sorted(sum(v[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    lo = means[int(math.floor((1 - level) / 2 * (resamples - 1)))]
    hi = means[int(math.ceil((1 + level) / 2 * (resamples - 1)))]
    return lo, hi
