"""The wire schema (docs/design.md §3–§4): pydantic models shared by the client and the server.

Rewards are JSON numbers or null; ``NaN``/``Infinity``/``-Infinity`` tokens are accepted and later
classed non-finite; booleans and strings are rejected. Validation errors name the record and
group that failed, so a 422 says what to fix.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Strict,
    StringConstraints,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

MAX_GROUPS_PER_REQUEST = 10_000
# Each record of a batch is a step row to write and evaluate (about 0.2 ms each): bounded like
# the groups, so that one request cannot hold a run's lock for tens of seconds.
MAX_RECORDS_PER_REQUEST = 10_000
# Scalar names of one record: far above what a trainer logs per step, and a bound on how wide
# a run's CSV export can grow from one request.
MAX_SCALARS_PER_RECORD = 1_000
MAX_REQUEST_BYTES = 8 * 1024 * 1024
MAX_GROUP_SIZE = 65_536
# Limits shared by the server's schema and the client's per-call checks (`checks.py`).
MAX_STEP = 2**62
MAX_RANK = 65_535
MAX_COUNT = 2**31 - 1  # an attempt; effective statistics of one rank's step
MAX_COUNTER = 2**62  # a client-health counter in a heartbeat (a whole run's groups or batches)
MAX_ID_CHARS = 128  # group_id, prompt_id, a scalar's name
MAX_SPLIT_CHARS = 64
SPLIT_PATTERN = r"^[A-Za-z0-9_.\-]+$"

Reward = Annotated[float, Strict()] | None
"""A reward: a JSON number (NaN and ±Infinity allowed, classed non-finite) or null."""


def storable_text(text: str, kind: str = "text fields") -> str:
    """Text a database can hold: no NUL character and no lone UTF-16 surrogate."""
    if "\x00" in text:
        raise ValueError(f"{kind} cannot contain NUL characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{kind} cannot contain lone surrogates (such as \\ud800)") from None
    return text


def _identifier(kind: str):  # noqa: ANN202
    def check(value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ValueError(f"{kind} must be a string or an integer")
        text = str(value)
        if len(text) > MAX_ID_CHARS:
            raise ValueError(
                f"{kind} has {len(text)} characters; at most {MAX_ID_CHARS} are allowed"
            )
        return storable_text(text, kind)

    return check


def _no_nul(text: str) -> str:
    return storable_text(text)


# One check of the value, so that a bad id gets one error (a str | int union lists one a branch)
GroupId = Annotated[str, BeforeValidator(_identifier("group_id"), json_schema_input_type=str | int)]
PromptId = Annotated[
    str, BeforeValidator(_identifier("prompt_id"), json_schema_input_type=str | int)
]
Text = Annotated[str, AfterValidator(_no_nul)]


def _no_bidi(text: str) -> str:
    if not BIDI_CONTROLS.isdisjoint(text):
        raise ValueError(f"cannot hold {BIDI_NAMED}")
    return text


def prose(max_length: int) -> Any:
    """`text` of at most ``max_length`` characters that people read (notes, a description, a
    reason): line breaks allowed, bidirectional controls not (a note "evil \u202edetaerc" would
    read "evil created" on the run page)."""
    return Annotated[text(max_length), AfterValidator(_no_bidi)]


def _blank_is_none(value: Any) -> Any:
    return None if isinstance(value, str) and not value.strip() else value


def text(max_length: int, min_length: int = 0) -> Any:
    """`Text` of ``min_length`` to ``max_length`` characters. The length is checked on the
    string itself, so that the error says "String should have at most N characters" (a length
    given to the field of a ``Text | None`` is checked after validation, as if of a list:
    "at most N items")."""
    limits = StringConstraints(min_length=min_length or None, max_length=max_length)
    return Annotated[str, limits, AfterValidator(_no_nul)]


# Bidirectional overrides, isolates and marks: "rtl \u202e gnp.exe" would read as "rtl
# exe.png"; the marks (U+200E-F, U+061C) reorder neighbouring text too.
BIDI_CONTROLS = frozenset(
    "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
)
BIDI_NAMED = "bidirectional control characters (U+202A-E, U+2066-9, U+200E-F, U+061C)"


# Characters that show nothing and join nothing: "run\u200b" looks the same as "run" in every
# list, a second run or rule no one can tell apart, and a name of Hangul fillers looks blank.
# The joiners U+200C-D stay, as Persian words and emoji sequences need them; tag
# characters only in an emoji flag sequence (U+1F3F4, tags, U+E007F).
INVISIBLE = frozenset(
    "\u200b\u2060\ufeff\u00ad\u180e\u2061\u2062\u2063\u2064"
    "\u034f\u115f\u1160\u17b4\u17b5\u3164\uffa0"
)
INVISIBLE_NAMED = (
    "invisible characters (U+200B, U+2060-4, U+FEFF, U+00AD, U+180E, U+034F, Hangul fillers, "
    "U+17B4-5, tag characters outside an emoji flag)"
)
_FLAG_TAGS = re.compile("\U0001f3f4[\U000e0020-\U000e007e]+\U000e007f")
_TAGS = re.compile("[\U000e0000-\U000e007f]")
# Marks and format characters draw nothing on their own, nor does the braille blank
_NOT_DRAWN = ("Cf", "Mn", "Me")


def _shown(text: str) -> str:
    """``text`` if it has no `INVISIBLE` character and, when not empty, one that draws
    something (not only blanks, format characters such as a lone joiner, or marks such as a
    lone variation selector). Raises ValueError."""
    if not INVISIBLE.isdisjoint(text) or _TAGS.search(_FLAG_TAGS.sub("", text)):
        raise ValueError(f"cannot hold {INVISIBLE_NAMED}")
    if text and all(
        c.isspace() or c == "\u2800" or unicodedata.category(c) in _NOT_DRAWN for c in text
    ):
        raise ValueError("needs a visible character, not only spaces")
    return text


def check_shown_text(text: str) -> str:
    """``text`` if it can name something people tell apart on one line (a run, a project, a
    key): no control, bidirectional or invisible characters, and a visible one unless empty.
    Raises ValueError saying which rule it breaks."""
    return _plain_label(text)


# Control characters and the Unicode line and paragraph separators: they break a name's one line
# wherever it is shown (keys list, chat messages, the dashboard), and key names refuse them.
_LINE_BREAKING = ("Cc", "Zl", "Zp")


def _one_line(text: str) -> str:
    if any(unicodedata.category(c) in _LINE_BREAKING for c in text):
        raise ValueError("cannot hold control characters (line breaks, tabs, bells)")
    return text


def _plain_name(text: str) -> str:  # never empty: `Name` has a minimum length of 1
    try:
        return _plain_label(text)
    except ValueError as exc:  # control characters, as key names refuse them
        raise ValueError(f"a name {exc}") from None


def _plain_label(text: str) -> str:
    # a severity " " would be "[ ]" in chat
    return _one_line(_no_bidi(_shown(text)))


def label(max_length: int, min_length: int = 0) -> Any:
    """`text` of ``min_length`` to ``max_length`` characters on one line (a project, a tag, an
    alert's severity): no control characters, which a project key's name refuses (a run of
    project "a\tb" could never get one), nor bidirectional controls (a severity
    "\u202elacitirc" would read as "critical" in chat)."""
    return Annotated[text(max_length, min_length), AfterValidator(_plain_label)]


Name = Annotated[text(200, 1), AfterValidator(_plain_name)]
# A run's tags: each once (a repeated tag is dropped), none empty.
Tags = Annotated[
    list[label(100, 1)],
    AfterValidator(lambda tags: list(dict.fromkeys(tags))),
    Field(max_length=50),
]
MaskValue = Literal[0, 1, True, False]
Split = Annotated[str, Field(min_length=1, max_length=MAX_SPLIT_CHARS, pattern=SPLIT_PATTERN)]


NON_FINITE_TOKENS = ("NaN", "Infinity", "-Infinity")


def storable_scalar(value: float | str | None) -> float | str | None:
    """A trainer scalar as Vantage stores and answers it: a finite number as it is; a
    non-finite one as the string "NaN", "Infinity" or "-Infinity" (as protobuf's JSON mapping
    writes them, and as Python's ``float()`` and JavaScript's ``Number()`` read them back), so
    that a loss gone NaN stays visible without a NaN in the database or in JSON; None as None."""
    if value is None or isinstance(value, str) or math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


class _Strict(BaseModel):
    # attribute docstrings become the field descriptions in /docs
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class GroupStats(_Strict):
    """Compact statistics of one group: n completions, mean, sample std (n−1), min, max."""

    n: Annotated[int, Strict(), Field(ge=0, le=MAX_GROUP_SIZE)]
    """Completions in the group (after masking)."""
    # Required (docs/design.md §3: {n, mean, std, min, max, n_pass?}); null means non-finite.
    mean: Reward
    """Mean reward; null when non-finite."""
    std: Reward
    """Sample standard deviation (n−1) of the rewards."""
    min: Reward
    """Lowest reward."""
    max: Reward
    """Highest reward."""
    n_pass: Annotated[int, Strict(), Field(ge=0)] | None = None
    """Completions equal to the run's reward_max; makes the group binary (pass_rate,
    expected_acr)."""


class RawGroup(_Strict):
    """One group as a list of rewards with an optional 0/1 mask."""

    group_id: GroupId | None = None
    """Unique within (step, split, rank); default: the group's index in the record. Integers are
    converted to strings."""
    rewards: Annotated[list[Reward], Field(max_length=MAX_GROUP_SIZE)]
    """One reward per completion: numbers, null, or the tokens NaN/Infinity/-Infinity (classed
    invalid)."""
    mask: list[MaskValue] | None = None
    """One 0/1 per reward; completions with 0 are dropped before classification."""
    prompt_id: PromptId | None = None
    """Names the prompt, so that collapse is tracked per prompt across steps (GET .../prompts)."""

    @model_validator(mode="after")
    def _mask_length(self) -> RawGroup:
        if self.mask is not None and len(self.mask) != len(self.rewards):
            raise ValueError(
                f"mask has {len(self.mask)} entries for {len(self.rewards)} rewards; "
                "send one 0/1 per completion"
            )
        return self


class StatsGroup(_Strict):
    """One group as compact statistics."""

    group_id: GroupId | None = None
    """Unique within (step, split, rank); default: the group's index in the record."""
    stats: GroupStats
    """Compact statistics instead of the rewards."""
    prompt_id: PromptId | None = None
    """Names the prompt, so that collapse is tracked per prompt across steps."""


def _group_form(value: Any) -> str | None:
    """Which form a group is in, from its shape: a mapping with ``stats``, another mapping (with
    rewards), or any other collection (a list of rewards; in Python also a tuple or an array);
    None for a scalar, which is no group. Validating only that form makes a 422 name one form's
    errors, not every form's (about 0.15 µs a group)."""
    if type(value) is list:
        return "list"
    if isinstance(value, Mapping):
        return "with_stats" if "stats" in value else "with_rewards"
    if isinstance(value, StatsGroup):
        return "with_stats"
    if isinstance(value, RawGroup):
        return "with_rewards"
    if value is None or isinstance(value, str | bytes | int | float):
        return None
    return "list"


GroupIn = Annotated[
    Annotated[Annotated[list[Reward], Field(max_length=MAX_GROUP_SIZE)], Tag("list")]
    | Annotated[RawGroup, Tag("with_rewards")]
    | Annotated[StatsGroup, Tag("with_stats")],
    Discriminator(
        _group_form,
        custom_error_type="group_form",
        custom_error_message="a group is a list of rewards, or an object with rewards or stats",
    ),
]
"""One group in any of its forms (docs/design.md §3 'Groups'); an error's location names the form
it was read as: ``list``, ``with_rewards`` or ``with_stats``."""


@dataclass(slots=True)
class NormalGroup:
    """A group after the record's input form has been resolved: always has an id."""

    group_id: str
    prompt_id: str | None = None
    rewards: list[float | None] | None = None
    mask: list[int] | None = None
    stats: GroupStats | None = None


class GroupsForm(_Strict):
    """The three ways a record or an /acr request carries groups (docs/design.md §3 'Groups')."""

    groups: list[GroupIn] | None = None  # the count limit answers 413 at the route
    """Groups, each a list of rewards, {group_id, rewards, mask?, prompt_id?} or {group_id, stats,
    prompt_id?}. Instead: flat rewards with group_ids or group_size."""
    rewards: list[Reward] | None = None
    """Flat rewards of every group, cut into groups by group_ids or group_size."""
    group_ids: list[GroupId] | None = None
    """One group id per flat reward; groups keep their first-appearance order."""
    group_size: Annotated[int, Strict(), Field(ge=1, le=MAX_GROUP_SIZE)] | None = None
    """Completions per group for flat rewards; must divide their count."""

    @model_validator(mode="after")
    def _one_form(self) -> Any:
        if self.groups is not None:
            if self.rewards is not None or self.group_ids is not None or self.group_size:
                raise ValueError(
                    "send either groups or rewards with group_ids/group_size, not both"
                )
            return self
        if self.rewards is None:
            raise ValueError("send groups, or flat rewards with group_ids or group_size")
        if (self.group_ids is None) == (self.group_size is None):
            raise ValueError("flat rewards need exactly one of group_ids or group_size")
        n = len(self.rewards)
        if self.group_ids is not None and len(self.group_ids) != n:
            raise ValueError(
                f"{len(self.group_ids)} group_ids for {n} rewards; send one group_id per reward"
            )
        if self.group_size is not None and n % self.group_size:
            raise ValueError(
                f"{n} rewards do not divide into groups of {self.group_size}; "
                "send group_ids or a group_size that divides the count"
            )
        return self

    def normal_groups(self) -> list[NormalGroup]:
        """The groups in input order (first appearance for group_ids), each with its group_id."""
        if self.groups is not None:
            out = []
            for index, g in enumerate(self.groups):
                if isinstance(g, list):
                    out.append(NormalGroup(str(index), None, g))
                elif isinstance(g, RawGroup):
                    mask = None if g.mask is None else [int(m) for m in g.mask]
                    gid = g.group_id if g.group_id is not None else str(index)
                    out.append(
                        NormalGroup(
                            group_id=gid, prompt_id=g.prompt_id, rewards=g.rewards, mask=mask
                        )
                    )
                else:
                    gid = g.group_id if g.group_id is not None else str(index)
                    out.append(NormalGroup(group_id=gid, prompt_id=g.prompt_id, stats=g.stats))
            return out
        assert self.rewards is not None
        if self.group_size is not None:
            k = self.group_size
            return [
                NormalGroup(group_id=str(i), rewards=self.rewards[i * k : (i + 1) * k])
                for i in range(len(self.rewards) // k)
            ]
        by_id: dict[str, list[float | None]] = {}
        for gid, r in zip(self.group_ids or [], self.rewards, strict=True):
            by_id.setdefault(gid, []).append(r)
        return [NormalGroup(group_id=gid, rewards=rs) for gid, rs in by_id.items()]

    def reward_lists(self) -> list[list[float | None]] | None:
        """The groups when every one is a plain list of rewards (the common form), else None."""
        groups = self.groups
        if groups is None or not all(type(g) is list for g in groups):
            return None
        return groups  # type: ignore[return-value]

    def group_count(self) -> int:
        """Number of groups without building them (for the request limit)."""
        if self.groups is not None:
            return len(self.groups)
        if self.group_size:
            return len(self.rewards or []) // self.group_size
        return len(set(self.group_ids or []))


class Effective(_Strict):
    """The trainer's own statistics after mitigation, for acr_effective (docs/design.md §3)."""

    # Groups of one rank's step: bounded like a request's groups (MAX_GROUPS_PER_REQUEST is per
    # request; a rank may report its whole step's count), far below 64-bit limits.
    n_valid: Annotated[int, Strict(), Field(ge=0, le=MAX_COUNT)]
    """Valid groups the trainer trained on at this step (this rank)."""
    n_zero_advantage: Annotated[int, Strict(), Field(ge=0, le=MAX_COUNT)]
    """Of those, groups whose advantages after mitigation are all below tol in absolute value."""
    n_virtual: Annotated[int, Strict(), Field(ge=0, le=MAX_COUNT)] = 0
    """Virtual reward samples added by AVSPO (0 without it)."""

    @model_validator(mode="after")
    def _bounded(self) -> Effective:
        if self.n_zero_advantage > self.n_valid:
            raise ValueError(
                f"n_zero_advantage {self.n_zero_advantage} exceeds n_valid {self.n_valid}"
            )
        return self


ScalarName = text(MAX_ID_CHARS, 1)
ScalarValue = Annotated[float, Strict()] | Literal["NaN", "Infinity", "-Infinity"] | None
"""A scalar: a JSON number (the tokens NaN and ±Infinity too), one of the strings "NaN",
"Infinity", "-Infinity" (what clients whose JSON has no such numbers send), or null."""
Scalars = Annotated[dict[ScalarName, ScalarValue], Field(max_length=MAX_SCALARS_PER_RECORD)]


MAX_TIME_S = 1e11  # a record's time: seconds since 1970, before the year 5138


class StepRecord(GroupsForm):
    """One rank's data for one (step, split). Groups are optional: a record may carry only
    effective statistics or scalars."""

    step: Annotated[int, Strict(), Field(ge=0, le=MAX_STEP)]
    """Training step (the optimizer step the groups were sampled for)."""
    split: Split = "train"
    """Metrics are computed per (step, split); eval groups never mix into train."""
    rank: Annotated[int, Strict(), Field(ge=0, le=MAX_RANK)] = 0
    """Sending process; a step pools the groups of every rank."""
    world_size: Annotated[int, Strict(), Field(ge=1, le=65_536)] | None = None
    """Ranks that report this step (default: the run's); a step is evaluated for alerts once all
    have."""
    time: float | None = None
    """Unix time in seconds (0 to 1e11) when the rank produced the data; a point without it has
    time null."""
    effective: Effective | None = None
    """The trainer's statistics after mitigation (acr_effective)."""
    scalars: Scalars | None = None
    """Trainer scalars by name (loss, kl, ...); NaN and Infinity are kept as strings."""
    mitigation: MitigationJSON = None
    """The mitigation in effect for this step, e.g. {"mode": "avspo"}."""

    @model_validator(mode="before")
    @classmethod
    def _allow_no_groups(cls, data: Any) -> Any:
        if isinstance(data, dict) and "groups" not in data and "rewards" not in data:
            data = {**data, "groups": []}
        return data

    @model_validator(mode="after")
    def _time_finite(self) -> StepRecord:
        if self.time is not None and not 0 <= self.time < MAX_TIME_S:  # NaN fails too
            hint = " (milliseconds? send seconds)" if MAX_TIME_S <= self.time < 1e14 else ""
            raise ValueError(
                f"time must be a unix timestamp in seconds, from 0 to {MAX_TIME_S:g}; got "
                f"{self.time!r}{hint}"
            )
        if self.time == 0:
            self.time = 0.0  # -0.0 would read back as -0.0
        if self.world_size is not None and self.rank >= self.world_size:
            raise ValueError(
                f"rank {self.rank} is outside world_size {self.world_size}; ranks are 0 to "
                "world_size - 1"
            )
        return self

    def storable_scalars(self) -> dict[str, float | str | None]:
        """The scalars as stored: non-finite values as their strings (`storable_scalar`)."""
        return {k: storable_scalar(v) for k, v in (self.scalars or {}).items()}


class StepsBatch(_Strict):
    """Body of ``POST /api/v1/runs/{run_id}/steps``."""

    attempt: Annotated[int, Strict(), Field(ge=1, le=MAX_COUNT)]
    """The attempt POST /runs answered for this launch."""
    # Parsing stops at 100,000 records; the route answers 413 above MAX_RECORDS_PER_REQUEST,
    # which is the limit the schema documents.
    records: Annotated[
        list[StepRecord],
        Field(max_length=100_000, json_schema_extra={"maxItems": MAX_RECORDS_PER_REQUEST}),
    ]
    """At most 10,000 groups and 8 MiB per request (413 beyond); a batch is atomic: a 422 stores
    nothing."""

    def group_count(self) -> int:
        return sum(r.group_count() for r in self.records)


class _RewardBounds(_Strict):
    """reward_min below reward_max: they name the sides of a collapsed group (docs/design.md §3)."""

    reward_min: Annotated[float, Strict(), Field(allow_inf_nan=False)] = 0.0
    """A collapsed group at this value is all_fail."""
    reward_max: Annotated[float, Strict(), Field(allow_inf_nan=False)] = 1.0
    """A collapsed group at this value is all_pass."""

    @model_validator(mode="after")
    def _bounds(self) -> Any:
        if self.reward_min >= self.reward_max:
            raise ValueError(
                f"reward_min {self.reward_min} must be below reward_max {self.reward_max}"
            )
        return self


class ACRRequest(GroupsForm, _RewardBounds):
    """Body of the stateless ``POST /api/v1/acr``."""

    trainer_eps: Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)] = 1e-4
    """The trainer's epsilon in (r − mean) / (std + eps), for near_collapsed."""
    tol: Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)] = 1e-3
    """A group is near_collapsed when every scaled advantage is below tol."""


class RunCreate(_RewardBounds):
    """Body of ``POST /api/v1/runs``."""

    # A path segment of the API: letters, digits, '_', '-', '.', not starting with '.'.
    run_id: str | None = Field(
        default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]*$"
    )
    """Client-chosen id (a UUID by the client hook); default: one the server assigns."""
    launch_id: text(128, 1) | None = None
    """Names one launch of the job, shared by all its ranks: a known one gets its attempt back, a
    new one the next attempt."""
    started_at: Annotated[float, Strict(), Field(gt=0, le=1e11, allow_inf_nan=False)] | None = None
    """Unix time (s, the client's clock) at which this launch began. A new launch of a known run
    that began more than 300 s (the server's `LAUNCH_CLOCK_SKEW_S`) before the run's newest
    attempt is refused (409): it would become the newest attempt and its old steps would replace
    newer ones (`vantage sync` of a spool from before a relaunch)."""
    name: Name | None = None
    """Display name: required for a new run (docs/design.md §4); a known run keeps its own."""
    project: Annotated[label(200) | None, BeforeValidator(_blank_is_none)] = None
    """Groups runs; keys and alert rules can be limited to a project. A blank one is none (an
    empty `$PROJECT` made a project "" of its own, apart from runs without one)."""
    config: ConfigJSON = None
    """Free-form JSON: the run's hyperparameters, at most 64 KiB as JSON."""
    group_size: Annotated[int, Strict(), Field(ge=1, le=MAX_GROUP_SIZE)] | None = None
    """Completions per prompt (G), shown on the dashboard."""
    trainer_eps: Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)] = 1e-4
    """The trainer's epsilon in (r − mean) / (std + eps), for near_collapsed."""
    world_size: Annotated[int, Strict(), Field(ge=1, le=65_536)] = 1
    """Ranks that send data."""
    # at least 0.1 s: with 1e-9 the run would be "stale" from its start
    heartbeat_s: Annotated[float, Strict(), Field(ge=0.1, le=86_400, allow_inf_nan=False)] = 10.0
    """Seconds between heartbeats; the run is stale after 3 × this without data or heartbeat."""
    tags: Tags = Field(default_factory=list)
    """Free labels."""


class RunPatch(_Strict):
    """Body of ``PATCH /api/v1/runs/{run_id}``."""

    name: Name | None = None
    """Display name."""
    tags: Tags | None = None
    """Free labels (replaces the list)."""
    notes: prose(10_000) | None = None
    """Free text shown on the run page."""
    mitigation_mode: Literal["off", "suggest", "auto"] | None = None
    """What a firing rule's mitigation does: nothing, offer it on the dashboard, or send the
    command."""


class Heartbeat(_Strict):
    """Body of ``POST /api/v1/runs/{run_id}/heartbeat``; counters are the client's totals."""

    attempt: Annotated[int, Strict(), Field(ge=1, le=MAX_COUNT)]
    """The attempt POST /runs answered for this launch."""
    rank: Annotated[int, Strict(), Field(ge=0, le=MAX_RANK)] = 0
    """Sending process; only rank 0 gets commands."""
    spooled_groups: Annotated[int, Strict(), Field(ge=0, le=MAX_COUNTER)] | None = None
    """Groups waiting in the client's on-disk spool."""
    dropped_groups: Annotated[int, Strict(), Field(ge=0, le=MAX_COUNTER)] | None = None
    """Groups dropped because the spool was full (total)."""
    dead_letter_batches: Annotated[int, Strict(), Field(ge=0, le=MAX_COUNTER)] | None = None
    """Batches the server refused with a 4xx, kept in the spool's dead-letter table (total)."""


class Finish(_Strict):
    """Body of ``POST /api/v1/runs/{run_id}/finish``."""

    status: Literal["finished", "failed"]
    """How the run ended; a finished or failed run takes no more commands."""
    attempt: Annotated[int, Strict(), Field(ge=1, le=MAX_COUNT)] | None = None
    """The sender's attempt: a launch that a newer one has superseded cannot end the run."""


COMMAND_TYPES = ("set_mitigation", "set_sampling", "checkpoint", "stop")
MITIGATION_MODES = ("none", "avspo", "aapo", "dapo")


def no_params_as_empty(params: Any) -> Any:
    """A command's params of null are none: ``{}`` (checkpoint and stop take none)."""
    return {} if params is None else params


class CommandCreate(_Strict):
    """Body of ``POST /api/v1/runs/{run_id}/commands`` (docs/design.md §4 'Commands')."""

    type: Literal["set_mitigation", "set_sampling", "checkpoint", "stop"]
    """What the trainer is asked to do at its next step boundary."""
    params: Annotated[dict[str, Any], BeforeValidator(no_params_as_empty)] = Field(
        default_factory=dict, validate_default=True
    )
    """set_mitigation: {mode: none|avspo|aapo|dapo, threshold?, variant?, alpha?, eta?, tau?,
    delta_low?, delta_high?, max_gen_batches?}; set_sampling: {temperature}; checkpoint and
    stop: {} (or null)."""
    reason: prose(1000) | None = None
    """Why, shown in the command log."""

    @field_validator("params")
    @classmethod
    def _params(cls, params: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        # a field check, so that an error's loc names params; with a bad type there is
        # nothing to check them against (that error is reported)
        if "type" in info.data:
            validate_command_params(info.data["type"], params)
        return params


MAX_JSON_DEPTH = 32


def check_storable(value: Any, depth: int = 0) -> Any:
    """Free-form JSON (a run's config, a record's mitigation, command params) that the server
    can store and send back: integers within 64 bits, nesting at most 32 levels, text without NUL
    or lone surrogates. Raises ValueError saying which rule a value breaks; returns it."""
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return value
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise ValueError("an integer beyond 64 bits (send it as a string)")
    elif isinstance(value, str):
        storable_text(value, "JSON strings")
    elif isinstance(value, dict):
        for k, v in value.items():
            storable_text(str(k), "JSON keys")
            check_storable(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            check_storable(v, depth + 1)
    return value


def non_finite_as_text(value: Any, depth: int = 0, wide_ints: bool = False) -> Any:
    """Free-form JSON with each non-finite float as its string ("NaN", "Infinity",
    "-Infinity"), as `storable_scalar` keeps scalars: JSON, and so the database, has no such
    numbers, and null would lose which it was. Dicts, lists and tuples are walked (a tuple
    becomes a list, a key that is not a string its ``str``, as JSON keys are text); anything
    else is returned as it is. ``wide_ints``: an integer beyond 64 bits becomes its text too,
    as `check_storable` asks (the client does this for the config and mitigation it sends).
    Raises ValueError past MAX_JSON_DEPTH levels (a deeper walk would reach Python's
    recursion limit)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else storable_scalar(value)
    if wide_ints and type(value) is int and not -(2**63) <= value < 2**63:
        return str(value)
    if isinstance(value, dict | list | tuple) and depth > MAX_JSON_DEPTH:
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, dict):
        return {
            k if isinstance(k, str) else str(k): non_finite_as_text(v, depth + 1, wide_ints)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [non_finite_as_text(v, depth + 1, wide_ints) for v in value]
    return value


def _storable_json(value: Any) -> Any:
    return value if value is None else check_storable(non_finite_as_text(value))


StorableJSON = Annotated[dict[str, Any] | None, AfterValidator(_storable_json)]

# A record's mitigation is stored with its step: a mode and a few numbers, never a document.
MAX_MITIGATION_BYTES = 4_096
# A run's config is in every answer about the run (the run list too): hyperparameters, not data.
MAX_CONFIG_BYTES = 65_536


def json_size_at_most(limit: int, what: str) -> Any:
    """A check that free-form JSON is at most ``limit`` bytes as JSON: it returns the value, or
    raises ValueError naming the size, the limit and ``what`` the value should be."""

    def check(value: dict[str, Any] | None) -> dict[str, Any] | None:
        size = 0 if value is None else len(orjson.dumps(value))
        if size > limit:
            raise ValueError(f"is {size:,} bytes as JSON; at most {limit:,} ({what})")
        return value

    return check


_mitigation_size = json_size_at_most(MAX_MITIGATION_BYTES, "a mode and its settings")
MAX_MODE_CHARS = 64


def small_mitigation(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A record's mitigation as docs/design.md §4 has it, ``{mode, ...settings}``: ``mode`` a
    non-empty string of at most 64 characters (any name: a trainer may report a mitigation of
    its own), at most 4 KiB as JSON. Returns the value; raises ValueError naming the problem."""
    if value is None:
        return None
    mode = value.get("mode")
    if not isinstance(mode, str) or not 0 < len(mode) <= MAX_MODE_CHARS:
        raise ValueError(
            f"needs mode, the name of the mitigation in effect (a string of 1 to "
            f"{MAX_MODE_CHARS} characters, e.g. 'avspo' or 'none'); got {mode!r:.80}"
        )
    return _mitigation_size(value)


small_config = json_size_at_most(MAX_CONFIG_BYTES, "the run's hyperparameters")
MitigationJSON = Annotated[StorableJSON, AfterValidator(small_mitigation)]
ConfigJSON = Annotated[StorableJSON, AfterValidator(small_config)]


def errors_in_one_line(exc: ValidationError) -> str:
    """Pydantic's errors as ``field: message; ...`` (not its multi-line dump with a link); a
    check of several fields, which has no field of its own, is named ``arguments``."""
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()
    )


# Sampling temperatures a run takes (set_sampling, the trainer's config). Below 0.01 sampling is
# greedy in all but name, so every group collapses; and logits divided by 1e-50 overflow, which
# makes the policy's weights NaN and fails the run.
TEMPERATURE_RANGE = (0.01, 10.0)


def temperature_problem(t: Any) -> str | None:
    """Why ``t`` is no sampling temperature (a number in [0.01, 10]), or None."""
    low, high = TEMPERATURE_RANGE
    if isinstance(t, bool) or not isinstance(t, int | float) or not low <= t <= high:
        return f"the temperature must be a number from {low:g} to {high:g}; got {t!r}"
    return None


def validate_command_params(kind: str, params: dict[str, Any]) -> None:
    """Raise ValueError when a command's params cannot be applied by the trainer. Each type
    takes only its own params, each by name and range, so that what passes is small, storable
    JSON; a value out of range is named with its range (not told to be sent as a string, as an
    integer beyond 64 bits would be, which no number param takes)."""
    if kind == "set_mitigation":
        mode = params.get("mode")
        if mode not in MITIGATION_MODES:
            raise ValueError(f"set_mitigation needs params.mode in {list(MITIGATION_MODES)}")
        _check_mitigation_params(params)
    elif kind == "set_sampling":
        if problem := temperature_problem(params.get("temperature")):
            raise ValueError(f"set_sampling needs params.temperature: {problem}")
        _only(kind, params, ("temperature",))
    elif params:  # checkpoint, stop
        raise ValueError(f"{kind} takes no params; got {sorted(params)}")


# set_mitigation's numbers besides mode (docs/design.md §7; the trainer's Mitigation): name →
# (lowest, highest, whether the lowest itself is refused).
MITIGATION_NUMBERS = {
    "alpha": (0.0, 100.0, True),  # AVSPO: K = max(1, min(G, ⌈G·ACR^α⌉))
    "eta": (0.0, 1.0, False),  # AVSPO adaptive: τ's step size
    "tau": (0.0, 1.0, False),  # AVSPO adaptive: τ now
    "delta_low": (-10.0, 10.0, False),  # AAPO: margin clip, low
    "delta_high": (-10.0, 10.0, False),  # AAPO: margin clip, high
    "max_gen_batches": (1, 100, False),  # DAPO: generation batches a step may sample
}
# Of those, the counts (a whole number, not 2.5 batches).
MITIGATION_WHOLE_NUMBERS = ("max_gen_batches",)
AVSPO_THRESHOLDS = ("fixed", "adaptive", "single")
# set_mitigation's settings when neither the config nor a command gave them (docs/design.md §7):
# AVSPO's threshold, α, adaptive τ_0 and η; AAPO's δ_low and δ_high; DAPO's max_gen_batches.
# The trainer starts from them and the dashboard's forms show them for a run that reported
# nothing else.
MITIGATION_DEFAULTS: dict[str, Any] = {
    "threshold": "fixed",
    "alpha": 0.5,
    "tau": 0.5,
    "eta": 0.01,
    "delta_low": -0.2,
    "delta_high": 0.28,
    "max_gen_batches": 3,
}


def _only(kind: str, params: dict[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"{kind} takes params {list(allowed)}; unknown {unknown}")


def _check_mitigation_params(params: dict[str, Any]) -> None:
    """What the trainer would refuse or silently ignore, refused here with its name."""
    _only("set_mitigation", params, ("mode", "threshold", "variant", *MITIGATION_NUMBERS))
    for key in ("threshold", "variant"):
        if key in params and params[key] not in AVSPO_THRESHOLDS:
            raise ValueError(f"set_mitigation {key} must be one of {list(AVSPO_THRESHOLDS)}")
    if "threshold" in params and "variant" in params and params["threshold"] != params["variant"]:
        # one name for one setting: the trainer applied the threshold and dropped the variant
        raise ValueError(
            "set_mitigation threshold and variant name one setting; they differ "
            f"({params['threshold']!r}, {params['variant']!r}): send one"
        )
    for key, (low, high, above) in MITIGATION_NUMBERS.items():
        v = params.get(key)
        if key not in params:
            continue
        whole = key in MITIGATION_WHOLE_NUMBERS
        number = isinstance(v, int if whole else int | float) and not isinstance(v, bool)
        if not number or not (low < v <= high if above else low <= v <= high):
            bounds = f"above {low:g} and at most {high:g}" if above else f"from {low:g} to {high:g}"
            kind = "whole number" if whole else "number"
            raise ValueError(f"set_mitigation {key} must be a {kind} {bounds}")
    low, high = params.get("delta_low"), params.get("delta_high")
    if low is not None and high is not None and low > high:
        raise ValueError("set_mitigation delta_low must not exceed delta_high")


class CommandAck(_Strict):
    status: Literal["applied", "rejected"]
    """Whether the trainer applied the command."""
    step: Annotated[int, Strict(), Field(ge=0, le=MAX_STEP)] | None = None
    """The step after which it was applied."""
    detail: prose(2000) | None = None
    """Why it was rejected, or what was applied (shown in the command log: no bidi controls)."""
