"""Ingest's classification of many groups at once: the rules of `vantage.client.acr` (docs/design.md
§3), vectorised with numpy over the groups of a record that share a size, with results equal to
`summarize_rewards` bit for bit (tests/test_classify.py checks it), plus each group's content
hash.

Why equal and not merely close: the same group may arrive alone or in a large batch, on one
server or another, and must be classed and stored the same way. The scalar engine sums with
`math.fsum` (correctly rounded); here a row's sum is numpy's wherever that sum is exact (every
addend an integer multiple of 2^-30 below 2^11, at most 4,096 of them: binary and most graded
rewards), which is then also the correctly rounded one, and `math.fsum` elsewhere. Every other
step is the same IEEE operation in the same order.

Groups with a mask, compact statistics or fewer than 2 rewards take the scalar path.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
from vantage.client.acr import (
    EXACT_SHIFT,
    ACRSettings,
    GroupClass,
    GroupSummary,
    InconsistentStatsError,
    StepAccumulator,
    summarize_rewards,
    summarize_stats,
)
from vantage.client.schema import MAX_GROUPS_PER_REQUEST, NormalGroup

from .group_blocks import SIDES

CLASS_CODES = {
    GroupClass.INVALID: 0,
    GroupClass.DEGENERATE: 1,
    GroupClass.COLLAPSED: 2,
    GroupClass.NEAR_COLLAPSED: 3,
    GroupClass.LIVE: 4,
}
CLASS_BY_CODE = tuple(sorted(CLASS_CODES, key=CLASS_CODES.__getitem__))
INVALID, COLLAPSED, NEAR, LIVE = (
    CLASS_CODES[GroupClass(c)] for c in ("invalid", "collapsed", "near_collapsed", "live")
)

_ALL_PASS, _ALL_FAIL, _CONSTANT = (SIDES.index(s) for s in ("all_pass", "all_fail", "constant"))
_EXACT_SHIFT = 2.0**30  # row sums are exact when every addend * 2^30 is an integer ...
_EXACT_LIMIT = 2.0**41  # ... below 2^11 (2^41 in those units) ...
_EXACT_MAX_TERMS = 4096  # ... and there are at most 2^12 of them: every partial sum fits 53 bits
_NULL_WORD = 0xFFFF_FFFF_FFFF_FFFF  # a null reward; a NaN pattern that parsing never produces
_MASK64 = 0xFFFF_FFFF_FFFF_FFFF
_GOLDEN = 0x9E37_79B9_7F4A_7C15


@dataclass(slots=True)
class GroupColumns:
    """One record's groups, classified, as columns in input order (DB codes for `cls`)."""

    group_ids: list[str] = field(default_factory=list)
    prompt_ids: list[str | None] = field(default_factory=list)
    cls: list[int] = field(default_factory=list)
    side: list[str | None] = field(default_factory=list)
    n: list[int] = field(default_factory=list)
    mean: list[float | None] = field(default_factory=list)
    std: list[float | None] = field(default_factory=list)
    min: list[float | None] = field(default_factory=list)
    max: list[float | None] = field(default_factory=list)
    n_pass: list[int | None] = field(default_factory=list)
    hash: list[int] = field(default_factory=list)
    # Set when one vectorised pass classified the whole record (the common case).
    arrays: _RecordArrays | None = None
    # Whether the columns past ``cls`` are still only in ``arrays`` (`filled` makes the lists).
    unfilled: bool = False

    def classes(self) -> list[GroupClass]:
        return [CLASS_BY_CODE[c] for c in self.cls]

    def filled(self) -> GroupColumns:
        """These columns with every list made (``classify_reward_lists(..., lazy=True)`` leaves
        a whole record's side, n, mean, std, min, max and n_pass in ``arrays`` until asked)."""
        if self.unfilled:
            assert self.arrays is not None
            self.arrays.fill(self)
            self.unfilled = False
        return self

    def add_to(self, acc: StepAccumulator, indices: list[int] | None = None) -> None:
        """Count these groups (or those at ``indices``) into a step's accumulator."""
        if indices is None:
            if self.arrays is not None:
                self.arrays.add_to(acc)
            else:
                acc.add_many(self.classes(), self.side, self.n, self.mean, self.n_pass)
            return
        self.filled()
        acc.add_many(
            [CLASS_BY_CODE[self.cls[i]] for i in indices],
            [self.side[i] for i in indices],
            [self.n[i] for i in indices],
            [self.mean[i] for i in indices],
            [self.n_pass[i] for i in indices],
        )


@dataclass(slots=True)
class _RecordArrays:
    """A record's groups, all of ``g`` rewards, as `_vectorised` classified them: enough to
    count them into a `StepAccumulator` with numpy, with the counts `add_many` gives (tests
    compare the two)."""

    g: int
    code: np.ndarray  # [P] int class codes
    mean: np.ndarray  # [P] float64 mean reward (non-finite: reported as null)
    binary: np.ndarray  # [P] bool
    n_max: np.ndarray  # [P] int rewards equal to reward_max
    all_pass: np.ndarray  # [P] bool: collapsed on the all_pass side
    all_fail: np.ndarray  # [P] bool: collapsed on the all_fail side
    std: np.ndarray  # [P] float64 sample std (non-finite: reported as null)
    lo: np.ndarray  # [P] float64 lowest reward
    hi: np.ndarray  # [P] float64 highest reward
    x: np.ndarray | None = None  # [P, G] the rewards (`vantage.server.reward_shape` counts them)

    def block_values(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The groups' columns as `vantage.server.group_blocks.encode_arrays` takes them:
        the values (a null as 0) and, per nullable column, where it is null. The same block
        as `encode_block` makes of the record's lists (tests compare the two)."""
        invalid = self.code == INVALID
        collapsed = self.code == COLLAPSED
        side = np.where(collapsed, _CONSTANT, 0)
        side = np.where(self.all_pass, _ALL_PASS, np.where(self.all_fail, _ALL_FAIL, side))
        null = {"min": invalid, "max": invalid, "n_pass": invalid | ~self.binary}
        null["mean"] = invalid | ~np.isfinite(self.mean)
        null["std"] = invalid | ~np.isfinite(self.std)
        values = {"cls": self.code, "side": side, "n": np.full(len(self.code), self.g)}
        for name, column in (("mean", self.mean), ("std", self.std), ("min", self.lo)):
            values[name] = np.where(null[name], 0.0, column)
        values["max"] = np.where(null["max"], 0.0, self.hi)
        values["n_pass"] = np.where(null["n_pass"], 0, self.n_max)
        return values, {name: mask for name, mask in null.items() if mask.any()}

    def fill(self, cols: GroupColumns) -> None:
        """Set ``cols``' side, n, mean, std, min, max and n_pass lists from these arrays (every
        group of the record, in order), as the scalar engine reports them: invalid groups have
        only their class and size."""
        finite = self.code != INVALID
        collapsed = self.code == COLLAPSED
        side = np.where(self.all_pass, "all_pass", np.where(self.all_fail, "all_fail", "constant"))
        side = side.astype(object)
        side[~collapsed] = None
        n_pass = self.n_max.astype(object)
        n_pass[~self.binary] = None
        values = {
            "side": side.tolist(),
            "n": [self.g] * len(self.code),
            "mean": _finite_list(self.mean),
            "std": _finite_list(self.std),
            "min": self.lo.tolist(),
            "max": self.hi.tolist(),
            "n_pass": n_pass.tolist(),
        }
        if not finite.all():  # invalid groups: only the class and the size
            for k in np.flatnonzero(~finite).tolist():
                for name in ("side", "mean", "std", "min", "max", "n_pass"):
                    values[name][k] = None
        for name, column in values.items():
            setattr(cols, name, column)

    def add_to(self, acc: StepAccumulator) -> None:
        g, code = self.g, self.code
        counts = np.bincount(code, minlength=len(CLASS_BY_CODE)).tolist()
        acc.n_groups += len(code)
        acc.n_invalid += counts[INVALID]
        acc.n_degenerate += counts[CLASS_CODES[GroupClass.DEGENERATE]]
        acc.n_collapsed += counts[COLLAPSED]
        acc.n_near_collapsed += counts[NEAR]
        valid = code >= COLLAPSED  # collapsed, near-collapsed and live
        n_valid = int(valid.sum())
        if not n_valid:
            return
        acc.n_valid += n_valid
        acc.n_completions += g * n_valid
        acc.group_sizes[g] = acc.group_sizes.get(g, 0) + n_valid
        means = self.mean[valid]
        values, repeats = np.unique(means[np.isfinite(means)], return_counts=True)
        for mean, count in zip(values.tolist(), repeats.tolist(), strict=True):
            num, den = mean.as_integer_ratio()
            acc.reward_sum += (num * g * count) << (EXACT_SHIFT - den.bit_length() + 1)
        binary = self.binary & valid
        acc.n_nonbinary += n_valid - int(binary.sum())
        acc.n_pass += int(self.n_max[binary].sum())
        acc.wasted_rollouts += g * counts[COLLAPSED]
        n_all_pass, n_all_fail = int(self.all_pass.sum()), int(self.all_fail.sum())
        acc.n_all_pass += n_all_pass
        acc.n_all_fail += n_all_fail
        acc.n_constant += counts[COLLAPSED] - n_all_pass - n_all_fail


class BadGroupStats(InconsistentStatsError):
    """Impossible compact statistics of the group at ``index`` of its record (or request)."""

    def __init__(self, index: int, group_id: str, reason: str) -> None:
        super().__init__(f"group {index} ('{group_id}'): {reason}")
        self.index, self.group_id, self.reason = index, group_id, reason

    def detail(self, *where: str | int) -> list[dict]:
        """A 422's ``detail``, as pydantic's errors are: ``where`` is the path to the groups'
        owner (``"body", "records", 3`` for a record of a batch, ``"body"`` for /acr)."""
        loc = [*where, "groups", self.index, "with_stats", "stats"]
        msg = f"group_id '{self.group_id}': {self.reason}"
        return [{"type": "inconsistent_stats", "loc": loc, "msg": msg}]


def classify_groups(groups: list[NormalGroup], settings: ACRSettings) -> GroupColumns:
    """Classify a record's groups (vectorised where possible) and hash their content. Raises
    BadGroupStats (naming the group) for impossible compact statistics."""
    size = len(groups)
    cols = GroupColumns(
        group_ids=[g.group_id for g in groups],
        prompt_ids=[g.prompt_id for g in groups],
        cls=[INVALID] * size,
        side=[None] * size,
        n=[0] * size,
        mean=[None] * size,
        std=[None] * size,
        min=[None] * size,
        max=[None] * size,
        n_pass=[None] * size,
        hash=[0] * size,
    )
    by_size: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        if g.stats is not None:
            _put_stats(cols, i, g, settings)
        else:
            by_size.setdefault(len(g.rewards or ()), []).append(i)
    for g_size, indices in by_size.items():
        _classify_size(cols, groups, indices, g_size, settings)
    if any(p is not None for p in cols.prompt_ids):
        for i, p in enumerate(cols.prompt_ids):
            if p is not None:
                cols.hash[i] = _combine(cols.hash[i], b"p" + p.encode())
    return cols


def classify_reward_lists(
    groups: list[list[float | None]], settings: ACRSettings, lazy: bool = False
) -> GroupColumns:
    """`classify_groups` for a record sent as plain lists of rewards (group ids are their
    indices): when every list has the same size ≥ 2, one vectorised pass without building a
    `NormalGroup` per group; otherwise the general path. ``lazy``: leave the columns past
    ``cls`` of that one pass in ``arrays`` until `GroupColumns.filled` is called (ingest
    stores and counts a whole record from the arrays)."""
    sizes = set(map(len, groups))
    g = sizes.pop() if len(sizes) == 1 else 0
    if g < 2:  # no group, lists of several sizes, or groups too small to classify as arrays
        normal = [NormalGroup(str(i), None, r) for i, r in enumerate(groups)]
        return classify_groups(normal, settings)
    size = len(groups)
    try:  # a third faster than np.array for 500 groups of 8
        x = np.fromiter(chain.from_iterable(groups), np.float64, size * g).reshape(size, g)
    except TypeError:  # a null reward, which numpy's array makes NaN: invalid
        x = np.array(groups, dtype=np.float64)
    cols = GroupColumns(group_ids=index_ids(size), prompt_ids=[None] * size)
    cols.hash = _reward_hashes(x, groups)
    _vectorised(cols, None, x, settings, lazy)
    return cols


_INDEX_IDS = [str(i) for i in range(MAX_GROUPS_PER_REQUEST)]  # made once: 60 µs a record


def index_ids(size: int) -> list[str]:
    """The default group ids of a record's ``size`` groups, ``["0", "1", ...]`` (docs/design.md §3:
    a group sent without an id gets its index), as a new list."""
    if size <= len(_INDEX_IDS):
        return _INDEX_IDS[:size]
    return [str(i) for i in range(size)]


def _classify_size(
    cols: GroupColumns,
    groups: list[NormalGroup],
    indices: list[int],
    g_size: int,
    settings: ACRSettings,
) -> None:
    """Classify and hash the reward-list groups at ``indices``, which all have ``g_size``
    rewards."""
    rows = [groups[i].rewards or [] for i in indices]
    x = np.array(rows, dtype=np.float64).reshape(len(rows), g_size)  # null -> NaN: invalid
    whole = len(indices) == len(cols.hash)  # every group of the record, in order
    hashes = _reward_hashes(x, rows)
    if whole:
        cols.hash = hashes
    else:
        for i, h in zip(indices, hashes, strict=True):
            cols.hash[i] = h
    masked = [k for k, i in enumerate(indices) if groups[i].mask is not None]
    if g_size >= 2 and len(masked) < len(indices):
        if masked:
            plain = [k for k, i in enumerate(indices) if groups[i].mask is None]
            _vectorised(cols, [indices[k] for k in plain], x[plain], settings)
        else:
            _vectorised(cols, None if whole else indices, x, settings)
    scalar = range(len(indices)) if g_size < 2 else masked
    for k in scalar:
        i, g = indices[k], groups[indices[k]]
        _put(cols, i, summarize_rewards(rows[k], g.mask, settings))
        if g.mask is not None and not all(g.mask):  # a mask of ones drops nothing
            cols.hash[i] = _combine(cols.hash[i], b"m" + bytes(g.mask))


def _put_stats(cols: GroupColumns, i: int, g: NormalGroup, settings: ACRSettings) -> None:
    s = g.stats
    assert s is not None
    try:
        summary = summarize_stats(s.n, s.mean, s.std, s.min, s.max, s.n_pass, settings)
    except InconsistentStatsError as exc:
        raise BadGroupStats(i, g.group_id, str(exc)) from exc
    cols.hash[i] = _digest(repr(("s", s.n, s.mean, s.std, s.min, s.max, s.n_pass)).encode())
    _put(cols, i, summary)


def _put(cols: GroupColumns, i: int, s: GroupSummary) -> None:
    cols.cls[i], cols.side[i], cols.n[i] = CLASS_CODES[s.cls], s.side, s.n
    cols.mean[i], cols.std[i], cols.min[i], cols.max[i] = s.mean, s.std, s.min, s.max
    cols.n_pass[i] = s.n_pass


def _vectorised(
    cols: GroupColumns,
    indices: list[int] | None,
    x: np.ndarray,
    settings: ACRSettings,
    lazy: bool = False,
) -> None:
    """Classify P unmasked groups of G ≥ 2 rewards each: x is [P, G] float64; ``indices``
    are their places in ``cols`` (None: all of them, in order, kept in ``cols.arrays``, and
    with ``lazy`` not yet as lists: `GroupColumns.filled`)."""
    g = x.shape[1]
    with np.errstate(all="ignore"):
        finite = np.isfinite(x).all(axis=1)
        lo, hi = x.min(axis=1), x.max(axis=1)
        n_max = (x == settings.reward_max).sum(axis=1)
        binary = n_max + (x == settings.reward_min).sum(axis=1) == g
        collapsed = finite & (lo == hi)
        spread = finite & ~collapsed
        s = np.where(spread, np.maximum(np.abs(lo), np.abs(hi)), 1.0)
        xs = x / s[:, None]
        mean_x = row_fsum(xs, spread) / g
        mean_x = np.minimum(np.maximum(mean_x, lo / s), hi / s)
        dev = xs - mean_x[:, None]
        std_x = np.sqrt(row_fsum(dev * dev, spread) / (g - 1))
        max_dev_x = np.maximum(hi / s - mean_x, mean_x - lo / s)
        near = max_dev_x / (std_x + settings.trainer_eps / s) < settings.tol
        mean = np.where(collapsed, lo, mean_x * s)
        std = np.where(collapsed, 0.0, std_x * s)
    code = np.where(finite, np.where(collapsed, COLLAPSED, np.where(near, NEAR, LIVE)), INVALID)
    all_pass = collapsed & (lo == settings.reward_max)  # the sides of `collapsed_side`
    all_fail = collapsed & ~all_pass & (lo == settings.reward_min)
    arrays = _RecordArrays(g, code, mean, binary, n_max, all_pass, all_fail, std, lo, hi, x)
    if indices is None:
        cols.cls, cols.arrays, cols.unfilled = code.tolist(), arrays, True
        if not lazy:
            cols.filled()
        return
    part = GroupColumns(cls=code.tolist())
    arrays.fill(part)
    for name in ("cls", "side", "n", "mean", "std", "min", "max", "n_pass"):
        target = getattr(cols, name)
        for i, v in zip(indices, getattr(part, name), strict=True):
            target[i] = v


def _finite_list(a: np.ndarray) -> list[float | None]:
    if np.isfinite(a).all():
        return a.tolist()
    return [v if math.isfinite(v) else None for v in a.tolist()]


def row_fsum(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Correctly rounded sums of the selected rows of ``a`` [P, G] (as `math.fsum`), NaN for the
    others: numpy's sum where it is exact (see the module docstring), `math.fsum` elsewhere."""
    out = np.full(a.shape[0], np.nan)
    if not rows.any():
        return out
    scaled = a * _EXACT_SHIFT
    exact = rows & np.all((scaled == np.rint(scaled)) & (np.abs(scaled) < _EXACT_LIMIT), axis=1)
    if a.shape[1] > _EXACT_MAX_TERMS:
        exact[:] = False
    out[exact] = a[exact].sum(axis=1)
    for k in np.flatnonzero(rows & ~exact).tolist():
        out[k] = math.fsum(a[k].tolist())
    return out


# --------------------------------------------------------------------------- content hashes
# A stable 64-bit digest of a group's content tells an identical re-send (duplicate) from a
# different one (conflict). Rewards are hashed as their float64 bit patterns, each mixed with
# its position (splitmix64, Steele et al. 2014) and summed mod 2^64: vectorised for a whole
# record, and the same value from `reward_hash` for one group.


def _mix(z: np.ndarray) -> np.ndarray:
    z = z + np.uint64(_GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58_476D_1CE4_E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D0_49BB_1331_11EB)
    return z ^ (z >> np.uint64(31))


def _hash_words(words: np.ndarray) -> list[int]:
    """[P, G] uint64 words -> P signed 64-bit hashes."""
    with np.errstate(over="ignore"):
        g = words.shape[1]
        positions = np.arange(g, dtype=np.uint64) * np.uint64(_GOLDEN)
        total = _mix(words ^ positions).sum(axis=1, dtype=np.uint64)
        out = _mix(total ^ np.uint64(g))
    return out.view(np.int64).tolist()


def _reward_hashes(x: np.ndarray, rows: list[list[float | None]]) -> list[int]:
    # + 0.0 makes -0.0 +0.0: the same reward, so a re-send is a duplicate, not a conflict
    words = np.ascontiguousarray(x + 0.0, dtype="<f8").view("<u8").astype(np.uint64)
    for k in np.flatnonzero(np.isnan(x).any(axis=1)).tolist():  # tell null from NaN
        words[k] = [_word(v) for v in rows[k]]
    return _hash_words(words)


def _word(value: float | None) -> int:
    if value is None:
        return _NULL_WORD
    return struct.unpack("<Q", struct.pack("<d", value + 0.0))[0]  # -0.0 as 0.0


def reward_hash(rewards: list[float | None]) -> int:
    """The content hash of one list of rewards, in plain Python (equal to the vectorised one;
    tests compare them)."""
    total = 0
    for j, value in enumerate(rewards):
        total = (total + _mix_int(_word(value) ^ ((j * _GOLDEN) & _MASK64))) & _MASK64
    return _signed(_mix_int(total ^ len(rewards)))


def _mix_int(z: int) -> int:
    """`_mix` for one Python integer."""
    z = (z + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB) & _MASK64
    return z ^ (z >> 31)


def _signed(z: int) -> int:
    return z - (1 << 64) if z >> 63 else z


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


def _combine(h: int, extra: bytes) -> int:
    """Fold more content (a mask, a prompt id) into a hash."""
    return _signed(_mix_int((h & _MASK64) ^ (_digest(extra) & _MASK64)))
