"""`GET /metrics` downsampling (`vantage.server.queries._downsample`) against a plain-Python
statement of its rule: bucket b of n steps holds positions [b·n // B, (b+1)·n // B) for
B = max_points // 2 buckets; each keeps its lowest and highest acr (null never chosen over a
number, ties to the earliest step for the lowest and the latest for the highest); from 3 points
on the newest step is kept on top."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st
from vantage.server.queries import _downsample

from tests.helpers.api import new_run, post_steps


def reference(steps: list[int], acrs: list[float | None], max_points: int) -> list[int]:
    if len(steps) <= max_points:
        return list(steps)
    if max_points >= 3:
        return [*extremes(steps[:-1], acrs[:-1], max_points - 1), steps[-1]]
    return extremes(steps, acrs, max_points)


def extremes(steps: list[int], acrs: list[float | None], max_points: int) -> list[int]:
    n = len(steps)
    if n <= max_points:
        return list(steps)
    low = [math.inf if a is None else a for a in acrs]
    high = [-math.inf if a is None else a for a in acrs]
    if max_points == 1:
        return [steps[high.index(max(high))]]
    buckets = max_points // 2
    kept: list[int] = []
    for b in range(buckets):
        i, j = b * n // buckets, (b + 1) * n // buckets
        lo = i + low[i:j].index(min(low[i:j]))
        hi = j - 1 - high[i:j][::-1].index(max(high[i:j]))
        kept.extend(sorted({steps[lo], steps[hi]}))
    return kept


# few distinct values, so that ties and all-null buckets are common
ACR = st.one_of(st.none(), st.sampled_from([0.0, 0.25, 0.5, 1.0]), st.floats(0, 1))


@settings(max_examples=300, deadline=None)
@given(
    acrs=st.lists(ACR, max_size=400),
    max_points=st.integers(1, 60),
    gaps=st.lists(st.integers(1, 5), min_size=400, max_size=400),
)
def test_downsampling_equals_its_plain_statement(acrs, max_points, gaps):
    steps = [sum(gaps[: k + 1]) for k in range(len(acrs))]  # ascending, with gaps
    kept = _downsample(steps, acrs, max_points)
    assert kept == reference(steps, acrs, max_points)
    assert all(type(s) is int for s in kept)
    assert len(kept) <= max(max_points, 1) and kept == sorted(set(kept))
    if steps and max_points >= 3:
        assert kept[-1] == steps[-1]


def test_a_long_run_keeps_each_buckets_spikes():
    steps = list(range(20_000))
    acrs = [0.5] * 20_000
    acrs[777], acrs[12_345], acrs[100] = 1.0, 0.0, None
    kept = _downsample(steps, acrs, 5000)
    assert kept == reference(steps, acrs, 5000)
    assert {777, 12_345, 19_999} <= set(kept) and len(kept) <= 5000
    # a flat ACR still gets the points asked for: each bucket's two ends (it got half: a trial)
    flat = _downsample(steps, [0.5] * 20_000, 5000)
    assert len(flat) == 4999 and flat[:4] == [0, 7, 8, 15]


def _groups(rng: random.Random) -> list[list[float]]:
    return [[float(rng.random() < p) for _ in range(4)] for p in (rng.random() for _ in range(6))]


def test_the_served_downsampling_follows_the_stored_steps(api) -> None:  # noqa: ANN001
    """End to end, both databases: `GET /metrics` chooses its points from the acr of the steps
    as stored (on PostgreSQL read from `step_series`, packed 64 steps a row by a trigger), over
    gaps, far steps, windows from negative steps, steps without an acr, an eval split, and
    steps a resumed attempt took over with other groups; compared with the plain statement
    over the full answer."""
    rng = random.Random(7)
    run = new_run(api, launch_id="first")
    steps = sorted(rng.sample(range(550), 220)) + [10**12, 10**12 + 64]
    records = [{"step": s, "groups": [] if s % 9 == 0 else _groups(rng)} for s in steps]
    records.append({"step": 5, "split": "eval", "groups": _groups(rng)})
    post_steps(api, run, records)
    resumed = new_run(api, run_id=run["run_id"], launch_id="second")
    taken = [{"step": s, "groups": _groups(rng)} for s in steps[100:160]]
    post_steps(api, resumed, taken)
    url = f"/api/v1/runs/{run['run_id']}/metrics"
    for window in (
        {},
        {"from_step": -64, "to_step": 127},
        {"from_step": 65, "to_step": 300},
        {"from_step": -1, "to_step": 10**12},
    ):
        full = api.get(url, params={**window, "max_points": 10**6}).json()["points"]
        full_steps, full_acrs = [p["step"] for p in full], [p["acr"] for p in full]
        assert full_steps == [s for s in steps if _within(s, window)]
        for max_points in (1, 2, 7, 40, 101):
            got = api.get(url, params={**window, "max_points": max_points}).json()["points"]
            want = reference(full_steps, full_acrs, max_points)
            assert [p["step"] for p in got] == want, (window, max_points)
    evaluation = api.get(url, params={"split": "eval", "max_points": 1}).json()["points"]
    assert [p["step"] for p in evaluation] == [5]


def _within(step: int, window: dict) -> bool:
    return window.get("from_step", -(10**18)) <= step <= window.get("to_step", 10**18)
