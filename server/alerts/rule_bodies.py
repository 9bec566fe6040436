"""The bodies of the alert-rule routes and their validation (docs/design.md §6): what a rule
may watch, how it compares, whom it tells and what command it issues."""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable
from typing import Annotated, Any, Literal

import httpx
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
)
from vantage.client.schema import (
    Name,
    Split,
    label,
    no_params_as_empty,
    prose,
    text,
    validate_command_params,
)

from .metrics import check_metric
from .targets import parse_target

Op = Literal[">", ">=", "<", "<="]
# What a recommended action's ``{name}`` may be (`vantage.server.alerts.messages`), and how a
# placeholder looks (a JSON object such as {"temperature": 1.2} is none).
PLACEHOLDERS = ("reward_min", "reward_max")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
RULE_FIELDS = (
    "name",
    "run_id",
    "project",
    "metric",
    "op",
    "threshold",
    "for_steps",
    "clear_threshold",
    "clear_steps",
    "min_valid_groups",
    "severity",
    "notify",
    "mitigation",
    "cooldown_steps",
    "split",
    "enabled",
    "description",
    "comparison",
    "baseline_steps",
    "warmup_steps",
    "alert_cooldown_steps",
    "recommended_action",
    "suggested_command",
)
Comparison = Literal["absolute", "zscore", "relative"]


class Mitigation(BaseModel):
    """The command a firing rule issues (or offers, by the run's mitigation_mode)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    type: Literal["set_mitigation", "set_sampling", "checkpoint", "stop"]
    """The command type, as in POST /runs/{run_id}/commands."""
    params: Annotated[dict[str, Any], BeforeValidator(no_params_as_empty)] = Field(
        default_factory=dict, validate_default=True
    )
    """The command's params, checked as a command's are (null: none)."""

    @field_validator("params")
    @classmethod
    def _params(cls, params: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Checked against the type (when it is valid), so that an error's loc ends in
        ``params``, not at the mitigation as a whole."""
        if "type" in info.data:
            validate_command_params(info.data["type"], params)
        return params


def _without_edge_blanks(what: str) -> Callable[[str], str]:
    """A validator refusing ``what`` with a blank at either end: a silence matches rule names
    exactly, and `"x "` beside `"x"` was a second rule that a silence of `x` missed; a
    severity " warning" read "[ warning]" in chat."""

    def trimmed(value: str) -> str:
        if value != value.strip():
            raise ValueError(f"{what} cannot start or end with a blank")
        return value

    return trimmed


RuleName = Annotated[Name, AfterValidator(_without_edge_blanks("a rule's name"))]
SEVERITIES = ("info", "warning", "critical")


def _known_severity(value: str) -> str:
    """``value`` in lower case when it is one of `SEVERITIES`: a free label ("Critical",
    "extreme") was stored but only exact "critical" changed a run's health verdict."""
    if value.lower() not in SEVERITIES:
        raise ValueError(f"severity must be one of {', '.join(SEVERITIES)} (got {value!r})")
    return value.lower()


Severity = Annotated[
    label(32, 1),
    AfterValidator(_without_edge_blanks("a severity")),
    AfterValidator(_known_severity),
]


def _target(url: str) -> str:
    """Where ``url`` sends, spelled one way (RFC 3986 §6.2.2): scheme and host in lower case,
    without the host's trailing dot, a default port, an empty query's ``?`` and the fragment
    (which no request carries); unreserved characters percent-encoded in the path or query
    decoded, other encodings' hex digits in upper case (`/%68ook` is `/hook`, `%2f` is `%2F`,
    never `/`). An e-mail target as ``mailto:`` and its address, the domain in lower case.
    ``url`` itself if it does not parse."""
    target = parse_target(url)
    if target.kind == "email":
        local, _, domain = target.address.rpartition("@")
        return f"mailto:{local}@{domain.lower()}"
    try:
        u = httpx.URL(url)
        host = u.host.rstrip(".")
    except (httpx.InvalidURL, TypeError, ValueError):
        return url
    host = f"[{host}]" if ":" in host else host  # IPv6
    port = "" if u.port in (None, _DEFAULT_PORTS.get(u.scheme)) else f":{u.port}"
    user = f"{u.userinfo.decode()}@" if u.userinfo else ""
    rest = _PERCENT.sub(_percent_normal, u.raw_path.decode("ascii").removesuffix("?"))
    return f"{u.scheme}://{user}{host}{port}{rest}"


_DEFAULT_PORTS = {"http": 80, "https": 443}
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")


def _percent_normal(match: re.Match[str]) -> str:
    char = chr(int(match[1], 16))
    return char if char in _UNRESERVED else f"%{match[1].upper()}"


def _once(urls: Any) -> Any:
    """A list of notification targets with each target once (`_target`: "HTTP://Chat/x#a" and
    "http://chat/x" posted every message twice), in order, as first spelled; anything
    else as it is."""
    if isinstance(urls, list) and all(isinstance(u, str) for u in urls):
        first: dict[str, str] = {}
        for url in urls:
            first.setdefault(_target(url), url)
        return list(first.values())
    return urls


class RulePatch(BaseModel):
    """Body of `PUT /api/v1/alert-rules/{id}`: the fields to change (others keep their value)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: RuleName | None = None
    """Unique among the rules of the same run_id and project."""
    run_id: text(64) | None = None
    """Only this run (with neither run_id nor project: every run)."""
    project: label(200) | None = None
    """Only this project's runs."""
    metric: text(200, 1) | None = None
    """A step metric (acr, acr_all_pass, ...), a window metric (acr_ema, acr_100, acr_volatility,
    acr_streak, acr_pooled), n_invalid, reward_drop, stale, acr_trained, non_finite_loss,
    reward_spread (docs/detectors.md), or scalars.NAME."""
    op: Op | None = None
    """How the metric is compared with the threshold."""
    threshold: Annotated[float, Strict()] | None = None
    """The condition is `metric op threshold`."""
    for_steps: StrictInt | None = Field(default=None, ge=1, le=1_000_000)
    """Consecutive evaluated steps the condition must hold before the alert fires (default 1)."""
    clear_threshold: Annotated[float, Strict()] | None = None
    """A firing alert resolves at the first step strictly past this value (default: the
    threshold)."""
    clear_steps: StrictInt | None = Field(default=None, ge=1, le=1_000_000)
    """Consecutive clear steps needed to resolve (default 1)."""
    min_valid_groups: StrictInt | None = Field(default=None, ge=0, le=10**9)
    """A step with fewer valid groups neither advances nor resets for_steps (default 1)."""
    severity: Severity | None = None
    """info, warning or critical (any case, stored in lower case; default warning); a firing
    critical alert makes a run's health critical."""
    notify: list[text(2000, 1)] | None = Field(default=None, max_length=20)
    """Targets notified on firing and on resolving (up to 2,000 characters each): webhook URLs
    (Slack's and Discord's get their own format; `slack+https://...` or `discord+https://...`
    gives any URL that format) and e-mail addresses (`mailto:ops@example.com`)."""
    mitigation: Mitigation | None = None
    """A command issued when the alert fires (by the run's mitigation_mode: auto sends it, suggest
    offers it on the dashboard, off does nothing)."""
    cooldown_steps: StrictInt | None = Field(default=None, ge=0, le=10**12)
    """Steps after a rule's command before it issues another (default 0)."""
    split: Split | None = None  # the same rule as a record's split
    """The split whose steps are evaluated (default train)."""
    enabled: StrictBool | None = None
    """A disabled rule is not evaluated."""
    description: prose(2000) | None = None
    """Free text (a notification's recommended action when the rule has none)."""
    comparison: Comparison | None = None
    """What the condition compares (docs/detectors.md): `absolute` the metric itself (default),
    `zscore` its standard deviations above the rolling baseline of its last baseline_steps
    values on the run, `relative` the metric over the mean of its first baseline_steps values
    on the run."""
    baseline_steps: StrictInt | None = Field(default=None, ge=1, le=10_000)
    """Values in a zscore or relative rule's baseline (default 20)."""
    warmup_steps: StrictInt | None = Field(default=None, ge=0, le=1_000_000)
    """A run's first steps (from the first with a value) that feed the baseline and never
    fire (default 0)."""
    alert_cooldown_steps: StrictInt | None = Field(default=None, ge=0, le=10**12)
    """Steps after an episode fired before a new one may fire on the same run (default 0)."""
    recommended_action: prose(500) | None = None
    """One line carried in every notification and alert of the rule; `{reward_min}` and
    `{reward_max}` are replaced by the run's bounds."""
    suggested_command: Mitigation | None = None
    """A command offered with the alert (on the dashboard, in notifications, by `vantage
    diagnose`), never issued automatically; `mitigation` is the one that is."""

    @field_validator("notify", mode="before")
    @classmethod
    def _notify_once(cls, v: Any) -> Any:
        """A URL given twice counts once (100 copies of one URL are not "more than 20")."""
        return _once(v)

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str | None) -> str | None:
        return None if v is None else check_metric(v)

    @field_validator("recommended_action")
    @classmethod
    def _placeholders(cls, v: str | None) -> str | None:
        """A placeholder that is not replaced would reach every notification as typed."""
        unknown = sorted({m for m in _PLACEHOLDER.findall(v or "") if m not in PLACEHOLDERS})
        if unknown:
            raise ValueError(
                f"unknown placeholder(s) {', '.join('{' + m + '}' for m in unknown)}: "
                f"recommended_action may use {', '.join('{' + m + '}' for m in PLACEHOLDERS)}"
            )
        return v

    @field_validator("threshold", "clear_threshold")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("thresholds must be finite numbers")
        return v


class RuleCreate(RulePatch):
    """Body of `POST /api/v1/alert-rules`; §6 defaults for what is left out."""

    name: RuleName
    """Unique among the rules of the same run_id and project."""
    metric: text(200, 1)
    """A step metric (acr, acr_all_pass, ...), a window metric (acr_ema, acr_100, acr_volatility,
    acr_streak, acr_pooled), n_invalid, reward_drop, stale, acr_trained, non_finite_loss,
    reward_spread (docs/detectors.md), or scalars.NAME."""
    op: Op
    """How the metric is compared with the threshold."""
    threshold: Annotated[float, Strict()]
    """The condition is `metric op threshold`."""
