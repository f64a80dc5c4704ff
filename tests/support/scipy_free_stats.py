"""A chi-square goodness-of-fit p-value without scipy (regularized upper incomplete gamma)."""

from __future__ import annotations

import math

import numpy as np


def _gammaincc(a: float, x: float) -> float:
    """Q(a, x) = Gamma(a, x) / Gamma(a), by series (x < a + 1) or continued fraction."""
    if x <= 0:
        return 1.0
    gln = math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        ap = a
        for _ in range(10000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return 1.0 - total * math.exp(-x + a * math.log(x) - gln)
    b, c, d = x + 1 - a, 1e300, 1.0 / (x + 1 - a)
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - gln) * h


def chi_square_p_value(observed: np.ndarray, expected: np.ndarray) -> float:
    """p-value of Pearson's chi-square test with len(observed) - 1 degrees of freedom."""
    stat = float(((observed - expected) ** 2 / expected).sum())
    return _gammaincc((len(observed) - 1) / 2.0, stat / 2.0)
