"""Turning a trainer's [P, G] rewards (tensor, ndarray, nested or ragged lists) into JSON-ready
rows, split between the training thread (``capture``: one private copy, microseconds, no GIL
held long) and the worker thread (``materialize``/``plain_rewards``: ``tolist`` and clean-up).
Neither torch nor numpy is imported: inputs are recognised by their attributes.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["capture", "float_rewards", "grouped", "mask_row", "materialize", "plain_rewards"]


def grouped(value: Any, group_size: int | None, what: str) -> Any:
    """Flat rewards (or a mask) of P·G values, prompt by prompt as TRL lays them out (a 1-D
    tensor, array or list of numbers), as [P, G]: a view of a tensor or array, a list of lists
    otherwise. Anything else, or no ``group_size``, is returned as it is. ValueError when the
    values are not whole groups."""
    ndim = getattr(value, "ndim", None)
    if group_size is None or ndim not in (None, 1):
        return value
    if ndim is None:
        if not isinstance(value, list | tuple) or not value:
            return value
        first = value[0]
        if isinstance(first, list | tuple | dict) or getattr(first, "ndim", 0):  # rows
            return value
    elif getattr(getattr(value, "dtype", None), "kind", None) == "O":  # an array of rows
        return value
    n = len(value)
    if n % group_size:
        raise ValueError(
            f"{what} has {n} values, not whole groups of group_size {group_size}: give [P, G], "
            "or P·G values prompt by prompt"
        )
    if ndim == 1:
        return value.reshape(-1, group_size)
    return [list(value[i : i + group_size]) for i in range(0, n, group_size)]


def capture(value: Any, what: str) -> tuple[Any, int]:
    """Take a private copy of a [P, G] input on the training thread, as cheaply as possible:
    a 2-D tensor or array is copied whole (one C call; ``tolist`` happens on the worker
    thread), anything else becomes a fresh list of lists. Returns (copy, P). Later in-place
    edits by the trainer never change what is sent."""
    one_d = (
        f"{what} must be [P, G], got a 1-D input; wrap one group as [[...]], or give "
        "group_size to send P·G flat values prompt by prompt"
    )
    ndim = getattr(value, "ndim", None)
    if hasattr(value, "detach"):  # torch.Tensor, without importing torch
        if ndim == 1:
            raise TypeError(one_d)
        if ndim != 2:
            raise TypeError(f"{what} must be [P, G], got a tensor with {ndim} dimensions")
        value = value.detach()
        on_cpu = getattr(value.device, "type", "cpu") == "cpu"
        return (value.clone() if on_cpu else value.to("cpu")), int(value.shape[0])
    if ndim is not None and hasattr(value, "dtype") and hasattr(value, "copy"):  # numpy
        if value.dtype.kind != "O":
            if ndim == 1:
                raise TypeError(one_d)
            if ndim != 2:
                raise TypeError(f"{what} must be [P, G], got an array with {ndim} dimensions")
            return value.copy(), int(value.shape[0])
        value = value.tolist()  # an object array of ragged rows
    if not isinstance(value, list | tuple):
        raise TypeError(f"{what} must be [P, G]: a tensor, an array or a list of lists")
    out = []
    for row in value:
        if isinstance(row, list):
            if row and isinstance(row[0], list | tuple):
                raise TypeError(f"{what} must be [P, G]: one list of numbers per group, not deeper")
            out.append(row.copy())
        elif isinstance(row, tuple):
            out.append(list(row))
        elif isinstance(row, dict):
            raise TypeError(
                f"{what} must be [P, G] numbers; compact stats ({{n, mean, std, min, max}}) are "
                "sent through the HTTP API's `stats` group form, not log_groups"
            )
        elif hasattr(row, "tolist"):  # ragged input: a list of tensors or arrays
            r = row.detach().cpu().tolist() if hasattr(row, "detach") else row.tolist()
            if not isinstance(r, list):
                raise TypeError(one_d)
            out.append(r)
        else:
            raise TypeError(one_d)
    return out, len(out)


def row_widths(rows: Any) -> list[int]:
    """The group sizes of a captured [P, G] input (`capture`'s copy), group by group."""
    shape = getattr(rows, "shape", None)
    if shape is not None:
        return [int(shape[1])] * int(shape[0])
    return [len(row) for row in rows]


def check_width(rows: Any, group_size: int, what: str) -> None:
    """ValueError when a captured [P, G] input (`capture`'s copy) has a group that is not
    ``group_size`` completions: a call's group_size that its rows contradict was ignored."""
    wrong = sorted(set(row_widths(rows)) - {group_size})
    if wrong:
        raise ValueError(
            f"{what} has groups of {wrong[0]} completions, but group_size is {group_size}: "
            "leave group_size out for [P, G] rows (ragged rows are allowed), or give P·G flat "
            "values"
        )


def check_mask_width(rows: Any, masks: Any) -> None:
    """ValueError when a captured mask's group has another size than its rewards' group, in
    the caller, rather than on the worker thread, where the call's groups would be dropped."""
    for i, (n_rewards, n_mask) in enumerate(zip(row_widths(rows), row_widths(masks), strict=True)):
        if n_rewards != n_mask:
            raise ValueError(f"group {i}: mask has {n_mask} entries for {n_rewards} rewards")


def materialize(value: Any) -> tuple[list[list[Any]], bool]:
    """On the worker thread: a captured input → (rows, whether every value is already a plain
    float or int). Bool and integer tensors become floats."""
    if isinstance(value, list):
        return value, False
    if hasattr(value, "detach"):
        if not value.is_floating_point():
            value = value.double()
        return value.tolist(), True
    if value.dtype.kind == "b":
        value = value.astype("float64")
    return value.tolist(), value.dtype.kind in "fiu"


def plain_rewards(row: list[Any]) -> list[Any]:
    """Make a row JSON-ready: numbers stay, bools and numpy/torch scalars become floats.
    (orjson writes NaN and ±Infinity as null, which the server also classes non-finite.)
    TypeError for a string, which the server refuses too ("1" is no reward)."""
    for v in row:
        t = type(v)
        if t is not float and t is not int and v is not None:
            break
    else:
        return row
    return float_rewards(row)


def float_rewards(row: list[Any]) -> list[float | None]:
    """A row's rewards as floats or None: an integer beyond 64 bits as the float the server
    would read it as, and one past float64 as ±Infinity, which the server classes non-finite,
    as it does the JSON number 1e400 (orjson writes neither, and they would cost the call).
    TypeError for a string."""
    return [_reward(v) for v in row]


def _reward(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, str | bytes):
        raise TypeError(f"rewards are numbers or None, not the string {value!r}")
    return as_float(value)


def as_float(value: Any) -> float:
    """``float(value)``, with an integer past float64 as ±Infinity, which is what the server
    makes of the JSON number 1e400: a reward or a scalar that large is sent as non-finite, never
    dropped (the call's groups, or the scalar, were once lost to the OverflowError)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def mask_row(row: list[Any]) -> list[int]:
    """One group's mask as the server takes it: 1 keeps a completion, 0 drops it (bools too).
    ValueError for another value: a loss weight of 0.5 is not a mask."""
    out = []
    for m in row:
        if m in (0, 1) and not isinstance(m, str | bytes):  # 0.0, 1.0, True and False too
            out.append(int(m))
        else:
            raise ValueError(f"mask values are 1 (keep) or 0 (drop), not {m!r}")
    return out
