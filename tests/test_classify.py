"""The server's vectorised classification equals the client's scalar engine bit for bit, its
content hashes equal the plain-Python ones, and `StepAccumulator.add_many` equals `add`."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vantage.client.acr import ACRSettings, StepAccumulator, summarize_rewards
from vantage.client.schema import NormalGroup
from vantage.server.classify import (
    CLASS_BY_CODE,
    classify_groups,
    classify_reward_lists,
    reward_hash,
    row_fsum,
)
from vantage.server.group_blocks import encode_arrays, encode_block

NAN, INF = float("nan"), float("inf")
finite = st.floats(allow_nan=False, allow_infinity=False)
graded = st.sampled_from([0.0, 1.0, 0.5, 0.25, 0.95, 0.35, -1.0, 2.0, 3.0])
float32 = st.floats(width=32, allow_nan=False, allow_infinity=False).map(float)
reward = st.one_of(finite, graded, graded, float32, st.none(), st.just(NAN), st.just(INF))
binary = st.sampled_from([0.0, 1.0])
size = st.integers(0, 10)


@st.composite
def record(draw) -> list[NormalGroup]:  # noqa: ANN001
    """Groups of a few sizes (so buckets hold several rows), some masked, some with prompts."""
    out = []
    for i in range(draw(st.integers(0, 14))):
        g = draw(st.sampled_from([2, 4, 8, draw(size)]))
        element = draw(st.sampled_from([binary, graded, reward]))
        rewards = draw(st.lists(element, min_size=g, max_size=g))
        mask = draw(st.none() | st.lists(st.sampled_from([0, 1]), min_size=g, max_size=g))
        prompt = draw(st.none() | st.sampled_from(["p1", "p2"]))
        out.append(NormalGroup(str(i), prompt, rewards, mask))
    return out


def _same(a: float | None, b: float | None) -> bool:
    return a is None and b is None or (a is not None and b is not None and a == b)


@settings(max_examples=400, deadline=None)
@given(record(), st.sampled_from([ACRSettings(), ACRSettings(reward_min=-1.0, reward_max=3.0)]))
def test_vectorised_classification_equals_the_scalar_engine(groups, acr_settings):
    cols = classify_groups(groups, acr_settings)
    for i, g in enumerate(groups):
        s = summarize_rewards(g.rewards or [], g.mask, acr_settings)
        assert CLASS_BY_CODE[cols.cls[i]] is s.cls, (g, s)
        assert (cols.side[i], cols.n[i], cols.n_pass[i]) == (s.side, s.n, s.n_pass)
        for name in ("mean", "std", "min", "max"):
            assert _same(getattr(cols, name)[i], getattr(s, name)), (name, g, s)


def test_float32_rounded_example_of_design():
    # docs/design.md §3: [0, .95 × 7] and [.35] × 8 → acr 0.5, also when the .35 values are float32
    x35 = float(np.float32(0.35))
    groups = [NormalGroup("0", None, [0] + [0.95] * 7), NormalGroup("1", None, [x35] * 8)]
    cols = classify_groups(groups, ACRSettings())
    assert [CLASS_BY_CODE[c].value for c in cols.cls] == ["live", "collapsed"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(reward, min_size=3, max_size=3), min_size=1, max_size=8))
def test_vectorised_hashes_equal_plain_python(rows):
    cols = classify_groups(
        [NormalGroup(str(i), None, r) for i, r in enumerate(rows)], ACRSettings()
    )
    assert cols.hash == [reward_hash(r) for r in rows]


def test_hashes_tell_content_apart():
    base = classify_groups([NormalGroup("0", None, [1.0, 0.0, None])], ACRSettings()).hash[0]
    others = [
        NormalGroup("0", None, [1.0, 0.0, NAN]),  # null is not NaN
        NormalGroup("0", None, [0.0, 1.0, None]),  # order matters
        NormalGroup("0", "p", [1.0, 0.0, None]),  # so does the prompt
        NormalGroup("0", None, [1.0, 0.0, None], [1, 1, 0]),  # and the mask
    ]
    hashes = {classify_groups([g], ACRSettings()).hash[0] for g in others}
    assert base not in hashes and len(hashes) == len(others)
    assert all(-(2**63) <= h < 2**63 for h in hashes)  # fits a BIGINT


def test_row_fsum_is_correctly_rounded():
    a = np.array([[1e16, 1.0, -1e16, 0.1], [0.5, 0.25, 1.0, 0.0], [0.1, 0.2, 0.3, 0.4]])
    got = row_fsum(a, np.array([True, True, True]))
    assert got.tolist() == [math.fsum(r) for r in a.tolist()]


@settings(max_examples=200, deadline=None)
@given(record())
def test_add_many_equals_add(groups):
    cols = classify_groups(groups, ACRSettings())
    one, many = StepAccumulator(), StepAccumulator()
    for g in groups:
        one.add(summarize_rewards(g.rewards or [], g.mask))
    many.add_many(cols.classes(), cols.side, cols.n, cols.mean, cols.n_pass)
    assert one == many


@st.composite
def uniform_record(draw) -> list[NormalGroup]:  # noqa: ANN001
    """Groups of one size, unmasked: a record that one vectorised pass classifies."""
    g = draw(st.sampled_from([2, 4, 8]))
    element = draw(st.sampled_from([binary, graded, reward]))
    groups = st.lists(st.lists(element, min_size=g, max_size=g), min_size=1, max_size=14)
    return [NormalGroup(str(i), None, r) for i, r in enumerate(draw(groups))]


BOUNDS = st.sampled_from([ACRSettings(), ACRSettings(reward_min=-1.0, reward_max=3.0)])


def _whole(groups: list[NormalGroup], acr_settings: ACRSettings):  # noqa: ANN202
    """A uniform record's columns, classified in one vectorised pass (the path under test)."""
    cols = classify_groups(groups, acr_settings)
    assert cols.arrays is not None
    return cols


def _same_columns(a, b, exact: tuple[str, ...]) -> None:  # noqa: ANN001
    """Columns ``exact`` are equal, and the float columns equal where not both null."""
    for name in exact:
        assert getattr(a, name) == getattr(b, name), name
    for name in ("mean", "std", "min", "max"):
        pairs = zip(getattr(a, name), getattr(b, name), strict=True)
        assert all(_same(x, y) for x, y in pairs), name


@settings(max_examples=300, deadline=None)
@given(uniform_record(), BOUNDS)
def test_whole_record_counts_equal_add_many(groups, acr_settings):
    cols = _whole(groups, acr_settings)
    fast, many = StepAccumulator(), StepAccumulator()
    cols.add_to(fast)
    many.add_many(cols.classes(), cols.side, cols.n, cols.mean, cols.n_pass)
    assert fast == many


@settings(max_examples=300, deadline=None)
@given(st.one_of(uniform_record(), record()))
def test_plain_reward_lists_classify_as_groups_do(groups):
    lists = [g.rewards for g in groups]
    fast = classify_reward_lists(lists, ACRSettings())
    normal = [NormalGroup(str(i), None, r) for i, r in enumerate(lists)]
    general = classify_groups(normal, ACRSettings())
    _same_columns(fast, general, ("group_ids", "prompt_ids", "cls", "side", "n", "n_pass", "hash"))


@pytest.mark.parametrize("bad", [[1.0, 0.5, None], [INF, 1.0, 1.0]])
def test_non_finite_rows_are_invalid(bad):
    cols = classify_groups([NormalGroup("0", None, bad)], ACRSettings())
    assert CLASS_BY_CODE[cols.cls[0]].value == "invalid" and cols.mean[0] is None


@settings(max_examples=300, deadline=None)
@given(uniform_record(), BOUNDS)
def test_a_whole_record_packs_from_its_arrays_as_from_its_lists(groups, acr_settings):
    cols = _whole(groups, acr_settings)
    lists = [cols.group_ids, cols.prompt_ids, cols.cls, cols.side, cols.n, cols.mean, cols.std]
    lists += [cols.min, cols.max, cols.n_pass, cols.hash]
    fast = encode_arrays(cols.group_ids, cols.prompt_ids, cols.hash, *cols.arrays.block_values())
    assert fast == encode_block(*lists)


@settings(max_examples=200, deadline=None)
@given(st.one_of(uniform_record(), record()))
def test_lazy_columns_fill_as_eager_ones(groups):
    lists = [g.rewards for g in groups]
    lazy = classify_reward_lists(lists, ACRSettings(), lazy=True)
    eager = classify_reward_lists(lists, ACRSettings())
    assert lazy.cls == eager.cls and lazy.hash == eager.hash
    _same_columns(lazy.filled(), eager, ("side", "n", "n_pass"))
