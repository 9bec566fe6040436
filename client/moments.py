"""Mergeable central moments of a set of rewards (a step's `reward_std` and `reward_bimodality`,
docs/detectors.md), scaled so that no finite input overflows (docs/design.md §3 "Numerics").

A `Moments` is ``(n, scale, mean, m2, m3, m4)``: ``n`` values, ``scale`` a power of two at least
their largest magnitude (0.0 when every value is 0 or there are none), and, in units of
``scale``, their mean and the sums of the 2nd, 3rd and 4th powers of their deviations from it.
Scaled values lie in [-1, 1], so a sum of powers is at most 16·n. Two parts merge with Chan et
al.'s pairwise update (Pébay 2008 for the 3rd and 4th moments): the result does not depend on
where the values lie (no cancellation against a fixed origin such as the run's reward_min),
and depends on the order of merging only in the last bits. Pure Python.
"""

from __future__ import annotations

import math

Moments = tuple[int, float, float, float, float, float]
EMPTY: Moments = (0, 0.0, 0.0, 0.0, 0.0, 0.0)


def scale_for(largest: float) -> float:
    """The power of two a set of values whose largest magnitude is ``largest`` is kept in:
    ``2**e`` with ``largest < 2**e`` (0.0 for 0; 2**1023 above it, as 2**1024 is no float)."""
    if not largest > 0:
        return 0.0
    e = math.frexp(largest)[1]
    return math.ldexp(1.0, min(e, 1023))


def rescale(m: Moments, scale: float) -> Moments:
    """``m`` in units of ``scale`` (a power of two at least ``m``'s own scale)."""
    n, own, mean, m2, m3, m4 = m
    if own == scale or n == 0:
        return (n, scale, mean, m2, m3, m4)
    r = own / scale  # a power of two at most 1: exact unless it underflows
    return (n, scale, mean * r, m2 * r * r, m3 * r**3, m4 * r**4)


def merge(a: Moments, b: Moments) -> Moments:
    """The moments of the union of two disjoint sets of values."""
    if a[0] == 0:
        return b
    if b[0] == 0:
        return a
    scale = max(a[1], b[1])
    na, _, ma, a2, a3, a4 = rescale(a, scale)
    nb, _, mb, b2, b3, b4 = rescale(b, scale)
    n = na + nb
    fa, fb = na / n, nb / n
    d = mb - ma  # in [-2, 2]
    mean = ma + d * fb
    m2 = a2 + b2 + d * d * na * fb
    m3 = a3 + b3 + d**3 * na * fb * (fa - fb) + 3 * d * (fa * b2 - fb * a2)
    m4 = (
        a4
        + b4
        + d**4 * na * fb * (fa * fa - fa * fb + fb * fb)
        + 6 * d * d * (fa * fa * b2 + fb * fb * a2)
        + 4 * d * (fa * b3 - fb * a3)
    )
    return (n, scale, mean, m2, m3, m4)


def from_values(values: list[float]) -> Moments:
    """The moments of finite ``values``, two-pass (`vantage.server.reward_shape` does the same
    with numpy for a block)."""
    if not values:
        return EMPTY
    scale = scale_for(max(abs(v) for v in values))
    if scale == 0.0:
        return (len(values), 0.0, 0.0, 0.0, 0.0, 0.0)
    u = [v / scale for v in values]
    if min(u) == max(u):  # exactly no spread, not the round-off of a mean
        return (len(u), scale, u[0], 0.0, 0.0, 0.0)
    mean = math.fsum(u) / len(u)
    d = [x - mean for x in u]
    return (
        len(u),
        scale,
        mean,
        math.fsum(x * x for x in d),
        math.fsum(x**3 for x in d),
        math.fsum(x**4 for x in d),
    )
