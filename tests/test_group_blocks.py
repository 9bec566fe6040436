"""The packing of a record's groups into one stored block (`vantage.server.group_blocks`):
every column comes back as it went in, nulls included, and a blob that does not fit is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vantage.server.group_blocks import SIDES, decode_block, decode_hashes, encode_block

finite = st.floats(allow_nan=False, allow_infinity=False)
group = st.tuples(
    st.text(max_size=128),  # group_id
    st.none() | st.text(max_size=128),  # prompt_id
    st.integers(0, 4),  # cls
    st.sampled_from(SIDES),
    st.integers(0, 65_536),  # n
    *(st.none() | finite for _ in range(4)),  # mean, std, min, max
    st.none() | st.integers(0, 65_536),  # n_pass
    st.integers(-(2**63), 2**63 - 1),  # content hash
)
NAMES = ("cls", "side", "n", "mean", "std", "min", "max", "n_pass")


@given(st.lists(group, max_size=50))
def test_a_block_gives_back_every_column(groups):
    columns = [list(c) for c in zip(*groups, strict=True)] if groups else [[] for _ in range(11)]
    row = encode_block(*columns)
    assert row["n_groups"] == len(groups)
    block = decode_block(row["n_groups"], row["data"])
    for name, sent in zip(NAMES, columns[2:10], strict=True):
        got = block.column(name)
        assert got == sent, name
        assert [type(v) for v in got] == [type(v) for v in sent], name  # ints stay ints
    assert decode_hashes(row["hashes"]) == columns[10]
    named = any(p is not None for p in columns[1])
    assert (row["prompt_ids"] is not None) == named


def test_a_blob_that_does_not_fit_is_refused():
    row = encode_block(["a"], [None], [2], ["all_pass"], [4], [1.0], [0.0], [1.0], [1.0], [4], [7])
    with pytest.raises(ValueError, match="does not hold 2 groups"):
        decode_block(2, row["data"])
    with pytest.raises(ValueError, match="version"):
        decode_block(1, b"\x02" + row["data"][1:])
    with pytest.raises(ValueError, match="differ in length"):
        encode_block(["a"], [None], [2], ["all_pass"], [4], [1.0], [0.0], [1.0], [1.0], [4], [])
