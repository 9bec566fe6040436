"""Alert rules and silences: request bodies, validation, and the functions the routes call
(DESIGN.md §6). Functions take a session and return JSON-able dicts; the caller commits."""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from types import SimpleNamespace
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
from sqlalchemy import ColumnElement, and_, or_, select, true
from sqlalchemy.orm import Session
from vantage.client.schema import (
    Name,
    Split,
    label,
    no_params_as_empty,
    prose,
    text,
    validate_command_params,
)

from .alert_metrics import check_metric
from .alert_models import AlertRule, AlertState, Silence
from .alerts import end_rule_episodes
from .locks import lock_runs
from .models import Run, as_utc, iso, run_not_found, utcnow
from .notify import RefusedTarget, check_target
from .settings import Settings

Op = Literal[">", ">=", "<", "<="]
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
)


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
        ``params``, not at the mitigation as a whole (a trial)."""
        if "type" in info.data:
            validate_command_params(info.data["type"], params)
        return params


def _without_edge_blanks(what: str) -> Callable[[str], str]:
    """A validator refusing ``what`` with a blank at either end: a silence matches rule names
    exactly, and `"x "` beside `"x"` was a second rule that a silence of `x` missed; a
    severity " warning" read "[ warning]" in chat (trials)."""

    def trimmed(value: str) -> str:
        if value != value.strip():
            raise ValueError(f"{what} cannot start or end with a blank")
        return value

    return trimmed


RuleName = Annotated[Name, AfterValidator(_without_edge_blanks("a rule's name"))]
Severity = Annotated[label(32, 1), AfterValidator(_without_edge_blanks("a severity"))]


def _target(url: str) -> str:
    """Where ``url`` sends, spelled one way (RFC 3986 §6.2.2): scheme and host in lower case,
    without the host's trailing dot, a default port, an empty query's ``?`` and the fragment
    (which no request carries); unreserved characters percent-encoded in the path or query
    decoded, other encodings' hex digits in upper case (`/%68ook` is `/hook`, `%2f` is `%2F`,
    never `/`). ``url`` itself if it does not parse."""
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
    """A list of webhook URLs with each target once (`_target`: "HTTP://Chat/x#a" and
    "http://chat/x" posted every message twice, a trial), in order, as first spelled; anything
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
    acr_streak, acr_pooled), n_invalid, reward_drop, stale, or scalars.NAME."""
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
    """Free label sent with notifications (default warning)."""
    notify: list[text(2000, 1)] | None = Field(default=None, max_length=20)
    """Webhook URLs (up to 2,000 characters each) notified on firing and on resolving."""
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
    """Free text."""

    @field_validator("notify", mode="before")
    @classmethod
    def _notify_once(cls, v: Any) -> Any:
        """A URL given twice counts once (100 copies of one URL were "more than 20": a
        trial)."""
        return _once(v)

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str | None) -> str | None:
        return None if v is None else check_metric(v)

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
    acr_streak, acr_pooled), n_invalid, reward_drop, stale, or scalars.NAME."""
    op: Op
    """How the metric is compared with the threshold."""
    threshold: Annotated[float, Strict()]
    """The condition is `metric op threshold`."""


def rule_dict(r: AlertRule) -> dict[str, Any]:
    out = {"id": r.id, **{f: getattr(r, f) for f in RULE_FIELDS}}
    out["notify"] = list(r.notify or [])
    out["builtin"] = r.builtin
    out["created_at"] = iso(r.created_at)
    out["updated_at"] = iso(r.updated_at)
    return out


def check_notify(urls: list[str], allow: str | None) -> list[str]:
    """The URLs (a rule body's, which `_once` made one per target), each checked; raises
    ValueError naming a refused webhook target."""
    try:
        return [check_target(u, allow) for u in urls]
    except RefusedTarget as exc:
        raise ValueError(str(exc)) from exc


class RuleFieldError(ValueError):
    """A rule body's value refused for one ``field`` (a 422 whose `loc` names it)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class RuleExists(Exception):
    """Another rule has this rule's name in the same scope (run_id and project): a 409."""


def _check_unique_name(session: Session, rule: AlertRule) -> None:
    """Two rules of one name and scope would both fire and notify for the same thing (a setup
    script run twice), and `GET /alerts?rule=NAME` could not tell them apart. A rule of the same
    name in another scope (a project's own `acr_stall` beside the global one) is fine. A run's
    rules are one scope whether they name the run's project or not (a project key adds it; two
    of one name both fired for the same run: a trial)."""
    q = select(AlertRule.id).where(
        AlertRule.name == rule.name, AlertRule.run_id.is_not_distinct_from(rule.run_id)
    )
    if rule.run_id is None:
        q = q.where(AlertRule.project.is_not_distinct_from(rule.project))
    if rule.id is not None:
        q = q.where(AlertRule.id != rule.id)
    with session.no_autoflush:
        other = session.scalars(q.limit(1)).first()
    if other is not None:
        scope = "every run"
        if rule.run_id or rule.project:
            scope = f"run {rule.run_id}" if rule.run_id else f"project '{rule.project}'"
        raise RuleExists(
            f"alert rule {other} is already named '{rule.name}' for {scope}; change it with "
            f"PUT /api/v1/alert-rules/{other} or choose another name"
        )


def _apply(session: Session, rule: AlertRule, fields: dict[str, Any], allow: str | None) -> None:
    if "notify" in fields and fields["notify"] is not None:
        fields["notify"] = check_notify(fields["notify"], allow)
    if fields.get("run_id") is not None and session.get(Run, fields["run_id"]) is None:
        raise LookupError(run_not_found(fields["run_id"]))
    for name, value in fields.items():
        if name == "mitigation" and value is not None:
            value = {"type": value["type"], "params": value.get("params") or {}}
        setattr(rule, name, value)
    _check_clear_side(rule)
    _check_unique_name(session, rule)
    rule.updated_at = utcnow()


def _check_clear_side(rule: AlertRule) -> None:
    """A clear threshold on the condition's side would resolve and fire the alert in turns."""
    clear = rule.clear_threshold
    if clear is None:
        return
    if (rule.op in (">", ">=") and clear > rule.threshold) or (
        rule.op in ("<", "<=") and clear < rule.threshold
    ):
        side = "at or below" if rule.op in (">", ">=") else "at or above"
        raise RuleFieldError(
            "clear_threshold",
            f"clear_threshold {clear:g} must be {side} the threshold {rule.threshold:g} for "
            f"op '{rule.op}': the alert resolves once the value is past it",
        )


def create_rule(session: Session, body: RuleCreate, allow: str | None) -> dict[str, Any]:
    """A new rule with §6 defaults. Raises ValueError (refused target), LookupError (run) or
    RuleExists (the name is taken in this scope)."""
    rule = AlertRule(
        for_steps=1,
        clear_steps=1,
        min_valid_groups=1,
        severity="warning",
        notify=[],
        cooldown_steps=0,
        split="train",
        enabled=True,
        builtin=False,
        created_at=utcnow(),
    )
    fields = body.model_dump(exclude_unset=True)
    fields = {
        k: v
        for k, v in fields.items()
        if v is not None
        or k in ("run_id", "project", "clear_threshold", "mitigation", "description")
    }
    _apply(session, rule, fields, allow)
    session.add(rule)
    session.flush()
    return rule_dict(rule)


def update_rule(
    session: Session, rule: AlertRule, body: RulePatch, settings: Settings
) -> dict[str, Any]:
    """Change a rule's given fields (the caller commits). Its open episodes that the change
    leaves behind close (`end_what_it_left`). Raises ValueError for a field set to null or a
    value `_apply` refuses, RuleExists for a name taken in the rule's scope."""
    before = SimpleNamespace(**{c.key: getattr(rule, c.key) for c in AlertRule.__table__.c})
    fields = body.model_dump(exclude_unset=True)
    for required in (
        "name",
        "metric",
        "op",
        "threshold",
        "for_steps",
        "clear_steps",
        "min_valid_groups",
        "severity",
        "notify",
        "cooldown_steps",
        "split",
        "enabled",
    ):
        if required in fields and fields[required] is None:
            raise RuleFieldError(required, f"'{required}' cannot be null")
    _apply(session, rule, fields, settings.webhook_allow)
    session.flush()
    end_what_it_left(session, before, rule, settings)
    return rule_dict(rule)


def end_what_it_left(
    session: Session, before: SimpleNamespace, rule: AlertRule, settings: Settings
) -> None:
    """Close the episodes a changed rule no longer watches: all of them when it was disabled or
    now watches another metric or split; those on runs out of its new scope when its run or
    project changed. A firing alert whose rule stops looking at it would never resolve."""
    if before.enabled and not rule.enabled:
        end_rule_episodes(session, before, settings, "its rule was disabled")
    elif (before.metric, before.split) != (rule.metric, rule.split):
        other = "metric" if before.metric != rule.metric else "split"
        end_rule_episodes(session, before, settings, f"its rule now watches another {other}")
    elif (before.run_id, before.project) != (rule.run_id, rule.project):

        def in_scope(run: Run) -> bool:
            return rule.run_id in (None, run.id) and rule.project in (None, run.project)

        why = "its rule no longer applies to this run"
        end_rule_episodes(session, before, settings, why, keep=in_scope)


@contextmanager
def change_lock(session: Session, rule: AlertRule, run_id: str | None = None) -> Iterator[None]:
    """The run locks a change of ``rule`` takes before it writes (`lock_runs`): the runs where
    it has an open episode, which the change may close, its run, and ``run_id``, a run the
    change points it at (the rule's foreign key locks that run's row). Commit inside."""
    open_on = session.scalars(
        select(AlertState.run_id).where(
            AlertState.rule_id == rule.id, AlertState.episode_id.is_not(None)
        )
    ).all()
    with lock_runs(session, [*open_on, *(r for r in (rule.run_id, run_id) if r)]):
        yield


def delete_rule(session: Session, rule: AlertRule, settings: Settings) -> None:
    """Delete a rule, its states and episodes (the caller commits); its firing alerts that were
    told resolve first, so the chat that heard of them hears of the end."""
    end_rule_episodes(session, rule, settings, "its rule was deleted")
    session.delete(rule)
    session.flush()


def rule_project(session: Session, rule: AlertRule) -> str | None:
    """The project a rule belongs to: its own, else its run's (a rule made for a run without
    naming the run's project), else none (a rule of every run)."""
    if rule.project is not None or rule.run_id is None:
        return rule.project
    return session.scalar(select(Run.project).where(Run.id == rule.run_id))


def visible_to(project: str | None) -> ColumnElement[bool]:
    """SQL condition on `alert_rules`: the rules a key limited to ``project`` sees (None: every
    rule): its project's, those of its project's runs, and those of every run. A rule of
    another project's run was shown to every project key, run id and all (a trial)."""
    if project is None:
        return true()
    of_its_runs = AlertRule.run_id.in_(select(Run.id).where(Run.project == project))
    everyone = AlertRule.run_id.is_(None)
    return or_(
        AlertRule.project == project, and_(AlertRule.project.is_(None), everyone | of_its_runs)
    )


def list_rules(session: Session, project: str | None = None) -> list[AlertRule]:
    """The rules a key limited to ``project`` sees (`visible_to`), by id."""
    return list(
        session.scalars(select(AlertRule).where(visible_to(project)).order_by(AlertRule.id))
    )


# ---------------------------------------------------------------------------------- silences


class SilenceMatchers(BaseModel):
    """Which alerts a silence mutes: all of the given matchers must hold (none: every alert)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    # as rules and runs take them: a name no rule can have ("", " x ") matched nothing, and
    # the silence was taken with at most a "no rule named" warning (a trial)
    rule: RuleName | None = None
    """A rule's name."""
    run_id: text(64, 1) | None = None
    """A run."""
    project: label(200, 1) | None = None
    """A project's runs."""


class SilenceCreate(BaseModel):
    """Body of `POST /api/v1/silences`: mutes notifications of matching alerts until `until`."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    matchers: SilenceMatchers = Field(default_factory=SilenceMatchers)
    """Which alerts are muted."""
    until: datetime
    """When the silence ends (ISO 8601; without a zone: UTC); must be in the future."""
    reason: prose(1000) | None = None
    """Why, shown in the list of silences."""

    @field_validator("until")
    @classmethod
    def _aware(cls, v: datetime) -> datetime:
        if not 1970 <= v.year <= 9000:  # the database cannot store far-off dates everywhere
            raise ValueError("until must be a date between 1970 and 9000")
        # in UTC: SQLite keeps no offset, so 06:31-05:00 was stored as 06:31 UTC (a trial)
        v = as_utc(v)
        now = datetime.now(UTC)
        if v <= now:  # it would mute nothing, and the answer would look like it does
            raise ValueError(
                f"until {v.isoformat()} is not in the future (now is "
                f"{now.isoformat(timespec='seconds')}); a silence mutes until then"
            )
        return v


def silence_dict(s: Silence) -> dict[str, Any]:
    until = iso(s.until)
    active = s.until is not None and as_utc(s.until) > utcnow()
    return {
        "id": s.id,
        "matchers": s.matchers,
        "until": until,
        "reason": s.reason,
        "created_by": s.created_by,
        "created_at": iso(s.created_at),
        "active": active,
    }


def create_silence(session: Session, body: SilenceCreate, created_by: str) -> dict[str, Any]:
    matchers = body.matchers.model_dump(exclude_none=True)
    s = Silence(
        matchers=matchers,
        until=body.until,
        reason=body.reason,
        created_by=created_by,
        created_at=utcnow(),
    )
    session.add(s)
    session.flush()
    return silence_dict(s)


def list_silences(session: Session, active_only: bool = False) -> list[dict[str, Any]]:
    q = select(Silence).order_by(Silence.id.desc())
    if active_only:
        q = q.where(Silence.until > utcnow())
    return [silence_dict(s) for s in session.scalars(q)]
