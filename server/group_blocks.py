"""How per-group data is stored: the groups one record stored for a (step, split, rank) are kept
together as one *block* row of `group_blocks` (`vantage.server.models.GroupBlock`), append-only.

Why blocks and not a row per group: ingest stored 500 groups as 500 rows and 500 entries of a
six-column primary key, which cost PostgreSQL about three times the CPU and seven times the WAL
(113 KiB against 17 KiB per 500 groups, all of it flushed at each commit) of one row holding the
same columns packed. Nothing reads single groups by key: duplicates are found per (step, split,
rank), and the prompts view reads every group of a run.

A block holds P groups, in the order the record sent them:
- ``group_ids``: JSON array of P strings; ``prompt_ids``: JSON array of P strings or nulls, or
  SQL NULL when no group has one.
- ``hashes``: P little-endian int64 content hashes (`vantage.server.classify`), read to tell a
  duplicate (same hash) from a conflict.
- ``data``: version byte 1, then in this order: ``cls`` int8[P] (`classify.CLASS_CODES`),
  ``side`` int8[P] (index into `SIDES`), ``nulls`` uint8[P] (bit k set: the k-th of `NULLABLE`
  is null, its stored value 0), ``n`` int32[P], ``n_pass`` int32[P], then ``mean``, ``std``,
  ``min``, ``max`` float64[P] each, all little-endian. No NaN is ever stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

VERSION = 1
SIDES = (None, "all_pass", "all_fail", "constant")
_SIDE_CODES = {side: code for code, side in enumerate(SIDES)}
NULLABLE = ("mean", "std", "min", "max", "n_pass")
_FLOATS = ("mean", "std", "min", "max")
_LAYOUT = (("cls", "<i1"), ("side", "<i1"), ("nulls", "<u1"), ("n", "<i4"), ("n_pass", "<i4"))
_LAYOUT += tuple((name, "<f8") for name in _FLOATS)
_BYTES_PER_GROUP = sum(np.dtype(dtype).itemsize for _, dtype in _LAYOUT)


@dataclass(slots=True)
class BlockData:
    """The ``data`` of a block of P groups: arrays of shape [P]. Bit k of ``nulls[i]`` set
    means column ``NULLABLE[k]`` of group i is null."""

    cls: np.ndarray  # int8, `vantage.server.classify.CLASS_CODES`
    side: np.ndarray  # int8, index into SIDES
    nulls: np.ndarray  # uint8
    n: np.ndarray  # int32
    n_pass: np.ndarray  # int32
    mean: np.ndarray  # float64
    std: np.ndarray
    min: np.ndarray
    max: np.ndarray

    def column(self, name: str) -> list:
        """A column as Python values, None where null (``side`` as names)."""
        values = getattr(self, name).tolist()
        if name == "side":
            return [SIDES[code] for code in values]
        if name not in NULLABLE:
            return values
        bit = 1 << NULLABLE.index(name)
        return [None if m & bit else v for v, m in zip(values, self.nulls.tolist(), strict=True)]


def encode_block(
    group_ids: Sequence[str],
    prompt_ids: Sequence[str | None],
    cls: Sequence[int],
    side: Sequence[str | None],
    n: Sequence[int],
    mean: Sequence[float | None],
    std: Sequence[float | None],
    min_: Sequence[float | None],
    max_: Sequence[float | None],
    n_pass: Sequence[int | None],
    hashes: Sequence[int],
) -> dict:
    """A block row's data columns (``n_groups, group_ids, prompt_ids, hashes, data``) for
    groups given as equally long columns. Floats must be finite or None (classification
    reports anything else as None). Raises ValueError for columns of unequal length."""
    size = len(group_ids)
    columns = (prompt_ids, cls, side, n, mean, std, min_, max_, n_pass, hashes)
    if any(len(c) != size for c in columns):
        raise ValueError("block columns differ in length")
    values: dict[str, Any] = {}
    null: dict[str, Any] = {}
    for name, column in zip(NULLABLE, (mean, std, min_, max_, n_pass), strict=True):
        if None in column:  # a scan in C; most blocks have no null
            null[name] = np.array([v is None for v in column], bool)
            column = [0 if v is None else v for v in column]
        values[name] = column
    values |= {"cls": cls, "side": list(map(_SIDE_CODES.__getitem__, side)), "n": n}
    return encode_arrays(group_ids, prompt_ids, hashes, values, null)


def encode_arrays(
    group_ids: Sequence[str],
    prompt_ids: Sequence[str | None],
    hashes: Sequence[int] | np.ndarray,
    values: dict[str, Any],
    null: dict[str, np.ndarray],
) -> dict:
    """`encode_block` for columns already in numbers: ``values`` holds each column of the
    layout but ``nulls`` (numpy arrays or sequences of P numbers; ``side`` as indices into
    `SIDES`, a null stored as 0), and ``null`` a bool array [P] for each column of `NULLABLE`
    that has nulls (True: null)."""
    size = len(group_ids)
    nulls = np.zeros(size, np.uint8)
    for k, name in enumerate(NULLABLE):
        if name in null:
            nulls |= null[name].astype(np.uint8) << k
    parts = [bytes([VERSION])]
    for name, dtype in _LAYOUT:
        column = nulls if name == "nulls" else values[name]
        parts.append(np.asarray(column, dtype).tobytes())
    named = prompt_ids.count(None) != size  # type: ignore[union-attr]
    return {
        "n_groups": size,
        "group_ids": orjson.dumps(list(group_ids)).decode(),
        "prompt_ids": orjson.dumps(list(prompt_ids)).decode() if named else None,
        "hashes": np.asarray(hashes, "<i8").tobytes(),
        "data": b"".join(parts),
    }


def decode_hashes(hashes: bytes) -> list[int]:
    """A block's content hashes as Python ints."""
    return np.frombuffer(hashes, "<i8").tolist()


def decode_block(n_groups: int, data: bytes) -> BlockData:
    """The `BlockData` that `encode_block` packed for ``n_groups`` groups. Raises ValueError
    for an unknown version or a blob whose length does not fit ``n_groups``."""
    if not data or data[0] != VERSION:
        raise ValueError(f"unknown group block version {data[:1]!r}")
    if len(data) != 1 + n_groups * _BYTES_PER_GROUP:
        raise ValueError(f"group block of {len(data)} bytes does not hold {n_groups} groups")
    arrays, offset = {}, 1
    for name, dtype in _LAYOUT:
        arrays[name] = np.frombuffer(data, dtype, count=n_groups, offset=offset)
        offset += n_groups * np.dtype(dtype).itemsize
    return BlockData(**arrays)
