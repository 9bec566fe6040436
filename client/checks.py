"""What one ``Monitor.log_*`` call sends, checked in the call against the server's rules
(``schema.py``, docs/design.md §3-§4).

The server validates a whole record (one rank's (step, split)) at once, and refuses it whole. A
client batches several calls into one record, so a single bad value that only the server caught
(a 200-character scalar name, say) cost every other call of that step. Each check here raises
ValueError or TypeError naming the value, so that the call alone is skipped (or raised, with
``strict``). They run on the training thread: each is a few string or integer tests.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from .inputs import as_float
from .schema import (
    BIDI_CONTROLS,
    MAX_ID_CHARS,
    MAX_RANK,
    MAX_SCALARS_PER_RECORD,
    MAX_SPLIT_CHARS,
    MAX_STEP,
    SPLIT_PATTERN,
    check_storable,
    non_finite_as_text,
    small_config,
    small_mitigation,
    storable_text,
)

_SPLIT = re.compile(SPLIT_PATTERN)
_UNSENDABLE = BIDI_CONTROLS | {"\x00"}  # characters an ack's detail may not carry


def count(name: str, value: Any, top: int = MAX_STEP, low: int = 0) -> int:
    """A step, rank or count as the server takes it: an integer in [low, top] (a whole float
    such as 7.0 is 7)."""
    if isinstance(value, bool | str | bytes) or value is None:
        raise TypeError(f"{name} must be an integer, not {type(value).__name__} {value!r}")
    number = int(value)
    if number != value:
        raise ValueError(f"{name} must be a whole number, not {value!r}")
    if not low <= number <= top:
        raise ValueError(f"{name} {number} is outside [{low}, {top}]")
    return number


def config_json(config: Any) -> dict[str, Any]:
    """A run's config as plain JSON: a mapping, whose values that are not JSON become their
    text, as do integers beyond 64 bits (the server stores none, and one such value would cost
    the whole config), and whose non-finite numbers their strings ("NaN"); keys become
    text. TypeError when it is no mapping; ValueError when the server would refuse it (over 64
    KiB as JSON, nested over 32 levels)."""
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping of name to value, not {type(config).__name__}")
    try:
        text = orjson.dumps(non_finite_as_text(dict(config), wide_ints=True), default=str)
    except orjson.JSONEncodeError as exc:
        raise ValueError(f"cannot be JSON ({exc})") from None
    return small_config(check_storable(orjson.loads(text)))


def rank_in(value: Any, world_size: int) -> int:
    """A rank below ``world_size`` (the server refuses a record from rank ≥ world_size)."""
    rank = count("rank", value, MAX_RANK)
    if rank >= world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size} (0 to {world_size - 1})")
    return rank


def split_name(value: Any) -> str:
    """A split: 1 to 64 letters, digits, '_', '.' or '-' (``train``, ``eval``, ``eval.gsm8k``)."""
    if not isinstance(value, str) or len(value) > MAX_SPLIT_CHARS or not _SPLIT.fullmatch(value):
        raise ValueError(
            f"split {value!r} is not a split name: 1 to {MAX_SPLIT_CHARS} letters, digits, "
            "'_', '.' or '-'"
        )
    return value


def _text(kind: str, text: str, limit: int, least: int = 1) -> str:
    if not least <= len(text) <= limit:
        allowed = f"{least} to {limit}" if least else f"at most {limit}"
        raise ValueError(f"{kind} {text[:40]!r} has {len(text)} characters; {allowed} are allowed")
    return storable_text(text, f"{kind} {text[:40]!r}")


def identifiers(kind: str, values: Iterable[Any], p: int) -> list[str | None]:
    """One group_id or prompt_id per group, as text of at most 128 characters (numbers are
    converted); a prompt_id of None is none for its group (not the prompt "None"). ValueError
    naming the first bad one (a group_id of None), or a wrong count; TypeError for one string
    (it would be read as one id per character)."""
    if isinstance(values, str | bytes):
        raise TypeError(f"{kind}s must be a list with one id per group, not the string {values!r}")
    ids = [None if v is None else str(v) for v in values]
    if len(ids) != p:
        raise ValueError(f"{len(ids)} {kind}s for {p} groups; send one per group")
    if kind == "group_id" and None in ids:
        raise ValueError(f"group_ids[{ids.index(None)}] is None; give every group an id, or none")
    if kind == "group_id" and len(set(ids)) != p:  # the server would keep the first of each
        raise ValueError("group_ids repeat within the call; give each group its own id")
    for i, text in enumerate(ids):
        if text is None:
            continue
        if len(text) > MAX_ID_CHARS or not text.isprintable():  # the common case: neither
            _text(f"{kind}s[{i}]", text, MAX_ID_CHARS, least=0)
    return ids


def scalar_name(name: Any) -> str:
    """A scalar's name as sent: its text, 1 to 128 characters."""
    return _text("scalar name", str(name), MAX_ID_CHARS)


def scalar_value(name: str, value: Any) -> float:
    """A scalar's value as a float (a tensor is read, so only ``strict`` calls this in the
    call); TypeError naming the scalar when it is no number."""
    refuse_text(name, value)
    try:
        return as_float(value)
    except (TypeError, ValueError):
        raise TypeError(f"scalar {name!r} is {value!r}, not a number") from None


def refuse_text(name: str, value: Any) -> None:
    """TypeError naming the scalar when its value is text: ``float("1.5")`` would read it, but a
    scalar is a number the training loop computed, and text there is a mistake."""
    if isinstance(value, str | bytes | bytearray):
        raise TypeError(f"scalar {name!r} is the text {reprlib.repr(value)}, not a number")


def scalars_map(scalars: Any) -> dict[Any, Any]:
    """The call's scalars as a fresh dict; at most MAX_SCALARS_PER_RECORD of them."""
    if not isinstance(scalars, Mapping):
        kind = type(scalars).__name__
        raise TypeError(f"scalars must be a mapping of name to number, not {kind}")
    if len(scalars) > MAX_SCALARS_PER_RECORD:
        limit = MAX_SCALARS_PER_RECORD
        raise ValueError(f"{len(scalars):,} scalars in one call; at most {limit:,}")
    return dict(scalars)


def mitigation_json(mitigation: Mapping[str, Any]) -> dict[str, Any]:
    """The mitigation in effect as the server stores it: plain JSON (other values become
    their text, as do integers beyond 64 bits; non-finite numbers their strings), at most 32
    levels, no NUL, at most 4 KiB as JSON. TypeError when it is no mapping, ValueError naming the
    problem (both begin "mitigation")."""
    if not isinstance(mitigation, Mapping):  # dict("avspo") said "dictionary update sequence…"
        raise TypeError(
            f"mitigation must be a mapping such as {{'mode': 'avspo'}}, not {mitigation!r:.80}"
        )
    try:
        text = orjson.dumps(non_finite_as_text(dict(mitigation), wide_ints=True), default=str)
        return small_mitigation(check_storable(orjson.loads(text)))
    except ValueError as exc:  # "is 5,023 bytes as JSON" alone would not say of what
        raise ValueError(f"mitigation {exc}") from None


def ack_detail(detail: Any) -> str:
    """An ack's detail as the server takes it: text of at most 2,000 characters, without what
    the server refuses or JSON cannot carry (NUL, bidirectional controls, lone surrogates)."""
    return "".join(c for c in str(detail) if _sendable(c))[:2000]


def _sendable(c: str) -> bool:
    return c not in _UNSENDABLE and not "\ud800" <= c <= "\udfff"
