"""The ingest route's fast parse of a step batch (`parse_steps`: orjson, then validation of
Python objects) answers as `parse_body` (``model_validate_json``) does, errors included.
Checked on hand-picked edge cases and on bodies that hypothesis builds from the step batch's
fields, with values of every JSON type."""

from __future__ import annotations

import json

import pytest
from fastapi import HTTPException
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vantage.client.schema import StepsBatch
from vantage.server.routes import parse_body
from vantage.server.routes.ingest import parse_steps


def _answer(raw: bytes, fast: bool) -> tuple[str, object]:
    try:
        return "ok", repr(parse_steps(raw) if fast else parse_body(StepsBatch, raw))
    except HTTPException as exc:
        return "error", (exc.status_code, exc.detail)


EDGE_CASES = [
    '{"attempt":1,"records":[{"step":1,"groups":[[1,0],[1.5,2]]}]}',
    '{"attempt":1,"records":[{"step":1,"groups":[[true,0]]}]}',
    '{"attempt":true,"records":[]}',
    '{"attempt":1.0,"records":[]}',
    '{"attempt":1,"records":[{"step":1,"time":true,"groups":[[1,0]]}]}',
    '{"attempt":1,"records":[{"step":1,"time":"12.5","groups":[[1,0]]}]}',
    '{"attempt":1,"records":[{"step":1,"groups":[{"group_id":7,"rewards":[1,0],"mask":[1,1]}]}]}',
    '{"attempt":1,"records":[{"step":1,"groups":[{"group_id":true,"rewards":[1,0]}]}]}',
    '{"attempt":1,"records":[{"step":1,"groups":[{"group_id":"a","stats":'
    '{"n":2,"mean":0.5,"std":0.7,"min":0,"max":1,"n_pass":1}}]}]}',
    '{"attempt":1,"records":[{"step":1,"scalars":{"loss":1,"kl":"NaN","x":null}}]}',
    '{"attempt":1,"records":[{"step":1,"scalars":{"loss":true}}]}',
    '{"attempt":1,"records":[{"step":1,"mitigation":{"mode":"avspo","k":[1,{"a":null}]}}]}',
    '{"attempt":1,"records":[{"step":1,"rewards":[1,0,1,1],"group_ids":["a","a",3,3]}]}',
    '{"attempt":1,"records":[{"step":1,"groups":[[1e400,0],[NaN,Infinity],[-Infinity,1]]}]}',
    '{"attempt":1,"records":[{"step":1,"groups":[[0.1,0.30000000000000004,1e-320]]}]}',
    '{"attempt":1,"records":[{"step":1,"mitigation":{"k":100000000000000000000000}}]}',
    # orjson reads integers beyond 64 bits as floats, which a mitigation would take
    '{"attempt":1,"records":[{"step":1,"mitigation":{"mode":"a","k":[18446744073709551616]}}]}',
    '{"attempt":1,"records":[{"step":1,"mitigation":{"mode":"a","k":-9223372036854775809}}]}',
    '{"attempt":1,"records":[{"step":1,"mitigation":{"mode":"a","k":18446744073709551615}}]}',
    '{"attempt":1,"records":[{"step":1,"mitigation":{"mode":"a","k":1e19}}]}',
    '{"attempt":1,"records":[{"step":100000000000000000000,"groups":[[1,0]]}]}',
    '{"attempt":1,"records":[{"step":1,"groups":[[100000000000000000000000000001,0]]}]}',
    '{"attempt":1,"records":[{"step":1,"groups":[{"group_id":100000000000000000000,'
    '"rewards":[1,0]}]}]}',
    '{"attempt":1,"records":[{"step":1,"scalars":{"n":100000000000000000000000000001}}]}',
    '{"attempt":1,"records":[{"step":1,"mitigation":{"k":' + "[" * 600 + "]" * 600 + "}}]}",
    '{"attempt":1,"records":[{"step":1,"groups":[{"group_id":"a\\ud800","rewards":[1,0]}]}]}',
    '{"attempt":1,"records":[{"step":1,"groups":[{"group_id":"a\\u0000","rewards":[1,0]}]}]}',
    '{"attempt":1,"attempt":2,"records":[]}',
    '\ufeff{"attempt":1,"records":[]}',
    '{"attempt":1,"records":[{"step":1,"groups":[[1,0]],"extra":1}]}',
    '{"attempt":1,"records":[{"step":-1,"groups":[[1,0]]}]}',
    "[]",
    "",
]


@pytest.mark.parametrize("body", EDGE_CASES)
def test_the_fast_parse_answers_as_the_json_parse(body):
    raw = body.encode("utf-8", "surrogatepass")
    assert _answer(raw, fast=True) == _answer(raw, fast=False)


def test_bodies_orjson_refuses_still_parse():
    """The NaN and Infinity tokens (Python's json writes them) are rewards, classed invalid."""
    raw = json.dumps({"attempt": 1, "records": [{"step": 1, "groups": [[float("nan"), 1]]}]})
    batch = parse_steps(raw.encode())
    assert str(batch.records[0].groups[0][0]) == "nan"


LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.sampled_from(["NaN", "Infinity", "train", "a", "12.5", "1"]),
)
VALUE = st.recursive(
    LEAF,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


def _or_junk(valid: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly ``valid`` values (nine in ten), else a value of any JSON type."""
    return st.integers(0, 9).flatmap(lambda k: valid if k else VALUE)


REWARD = st.one_of(st.floats(), st.integers(-3, 3), st.none())
REWARDS = st.lists(_or_junk(REWARD), max_size=4)
STATS = st.fixed_dictionaries(
    {
        "n": _or_junk(st.integers(0, 4)),
        "mean": _or_junk(st.floats(-1, 2)),
        "std": _or_junk(st.floats(0, 1)),
        "min": _or_junk(st.floats(-1, 2)),
        "max": _or_junk(st.floats(-1, 2)),
    },
    optional={"n_pass": _or_junk(st.integers(0, 4))},
)
GROUP_ID = _or_junk(st.one_of(st.text(max_size=4), st.integers(0, 9)))
GROUP = st.one_of(
    REWARDS,
    REWARDS,
    st.fixed_dictionaries(
        {"group_id": GROUP_ID, "rewards": REWARDS},
        optional={
            "mask": st.lists(_or_junk(st.integers(0, 1)), max_size=4),
            "prompt_id": _or_junk(st.text(max_size=4)),
        },
    ),
    st.fixed_dictionaries({"group_id": GROUP_ID, "stats": _or_junk(STATS)}),
    VALUE,
)
RECORD = st.fixed_dictionaries(
    {"step": _or_junk(st.integers(-1, 5))},
    optional={
        "groups": st.lists(GROUP, max_size=4),
        "split": _or_junk(st.sampled_from(["train", "eval", ""])),
        "rank": _or_junk(st.integers(-1, 3)),
        "world_size": _or_junk(st.integers(0, 4)),
        "time": _or_junk(st.floats(-1, 2e9)),
        "effective": _or_junk(
            st.fixed_dictionaries(
                {"n_valid": _or_junk(st.integers(-1, 4)), "n_zero_advantage": VALUE}
            )
        ),
        "scalars": st.dictionaries(st.text(max_size=4), _or_junk(REWARD), max_size=3),
        "mitigation": _or_junk(
            st.fixed_dictionaries(
                {"mode": _or_junk(st.text(min_size=1, max_size=4))},
                optional={"k": VALUE, "x": VALUE},
            )
        ),
    },
)
FLAT = st.fixed_dictionaries(
    {"step": st.integers(0, 3), "rewards": REWARDS},
    optional={
        "group_size": _or_junk(st.integers(0, 3)),
        "group_ids": st.lists(GROUP_ID, max_size=4),
        "groups": st.lists(GROUP, max_size=2),
    },
)
BATCH = st.fixed_dictionaries(
    {
        "attempt": _or_junk(st.integers(1, 3)),
        "records": _or_junk(st.lists(st.one_of(RECORD, RECORD, FLAT), max_size=3)),
    }
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BATCH)
def test_the_fast_parse_answers_as_the_json_parse_whatever_the_body(body):
    raw = json.dumps(body).encode()  # NaN and Infinity as Python's json writes them
    assert _answer(raw, fast=True) == _answer(raw, fast=False)
