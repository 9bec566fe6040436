"""/api/v1/alert-rules, /api/v1/alerts and /api/v1/silences (docs/design.md §6)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from ..alerts.listing import DEFAULT_PAGE, MAX_PAGE, BadCursor, alert_page
from ..alerts.metrics import condition_warning
from ..alerts.models import AlertRule, Silence
from ..alerts.rule_bodies import RuleCreate, RulePatch
from ..alerts.rules import (
    RuleExists,
    RuleFieldError,
    change_lock,
    create_rule,
    delete_rule,
    in_key_project,
    list_rules,
    rule_as_seen,
    update_rule,
    visible_to,
)
from ..alerts.silences import (
    SilenceCreate,
    SilenceMatchers,
    create_silence,
    list_silences,
    no_matchers_warning,
    silence_project,
    silence_visible,
    unknown_rule_warning,
)
from ..alerts.targets import RefusedTarget
from ..alerts.try_target import NotATarget, TargetBusy, send_test_message
from ..db import redo_on_lock_conflict
from ..deps import ControlKey, ReadKey, SessionDep, SettingsDep, check_key, load_run
from ..errors import field_error
from ..keys import KeyInfo
from ..locks import rule_writes_lock
from ..models import Run, as_utc
from ..settings import Settings

router = APIRouter(prefix="/api/v1", tags=["alerts"])


def _read_or_control(request: Request, session: SessionDep) -> KeyInfo:
    try:
        return check_key(request, session, "control")
    except HTTPException as exc:
        if exc.status_code != 403:
            raise
    return check_key(request, session, "read")


RulesReader = Annotated[KeyInfo, Depends(_read_or_control)]
# Ids are 32-bit integers in the database: larger ones are a 422, not a database error.
RuleId = Annotated[int, Path(ge=1, le=2**31 - 1)]
SilenceId = Annotated[int, Path(ge=1, le=2**31 - 1)]


def _rule(session: SessionDep, rule_id: int, key: KeyInfo) -> AlertRule:
    """The rule, if the key sees it (`visible_to`); else a 404."""
    rule = session.scalar(select(AlertRule).where(AlertRule.id == rule_id, visible_to(key.project)))
    if rule is None:
        raise HTTPException(404, f"alert rule {rule_id} not found")
    return rule


def _own_rule(session: SessionDep, rule_id: int, key: KeyInfo) -> AlertRule:
    """A rule the key may change or delete: any, or, for a key limited to a project, one of
    that project's rules (403 for another it can read, such as a rule of every run)."""
    rule = _rule(session, rule_id, key)
    if not in_key_project(session, rule, key):
        raise HTTPException(
            403,
            f"alert rule {rule_id} is not a rule of project '{key.project}' (it applies to "
            f"{'every run' if rule.run_id is None else f'run {rule.run_id}'}); this key changes "
            "only that project's rules",
        )
    return rule


def _scoped(scope: RulePatch | SilenceMatchers, key: KeyInfo, session: SessionDep) -> None:
    """A project key writes rules and silences of its project only: ``scope`` (a rule's body
    or a silence's matchers) gets the key's project; another project is a 403, a run of
    another project a 404. A run and a project that disagree are a 422 (the project was
    ignored and the rule applied to the run)."""
    run = load_run(session, scope.run_id, key) if scope.run_id is not None else None
    if key.project is not None:
        if scope.project not in (None, key.project):
            raise HTTPException(403, f"this key is limited to project '{key.project}'")
        scope.project = key.project
    _same_project(run, scope.project)


def _same_project(run: Run | None, project: str | None) -> None:
    """A rule or silence that names a run and a project: they must agree (422)."""
    if run is not None and project is not None and run.project != project:
        raise HTTPException(
            422,
            f"run {run.id} is in project {run.project or '(none)'}, not '{project}': "
            "name the run alone, or the project alone",
        )


@router.get("/alert-rules")
def rules_index(key: RulesReader, session: SessionDep) -> dict:
    rules = list_rules(session, project=key.project)
    return {"rules": [rule_as_seen(session, r, key) for r in rules]}


@router.post("/alert-rules", status_code=201)
def rules_create(
    body: RuleCreate, key: ControlKey, session: SessionDep, settings: SettingsDep
) -> dict:
    """Create a rule; answers 201 with the rule and its `id`."""
    _scoped(body, key, session)
    with rule_writes_lock(session):  # until the commit: a name another request is storing
        return _written(session, lambda: create_rule(session, body, settings))


def _written(session: Session, write: Callable[[], dict]) -> dict:
    """``write()``'s rule, committed, as answered: with a `warning` when its metric's range
    decides its condition (`condition_warning`). A refused value is a 422, a taken name 409."""
    try:
        rule = write()
    except RuleFieldError as exc:
        raise HTTPException(422, [field_error(str(exc), ["body", exc.field])]) from exc
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc
    except RuleExists as exc:
        raise HTTPException(409, str(exc)) from exc
    session.commit()
    warning = condition_warning(
        rule["metric"], rule["op"], rule["threshold"], rule.get("comparison", "absolute")
    )
    return {**rule, "warning": warning} if warning else rule


@router.get("/alert-rules/{rule_id}")
def rules_read(rule_id: RuleId, key: RulesReader, session: SessionDep) -> dict:
    return rule_as_seen(session, _rule(session, rule_id, key), key)


@router.put("/alert-rules/{rule_id}")
def rules_update(
    rule_id: RuleId, body: RulePatch, key: ControlKey, session: SessionDep, settings: SettingsDep
) -> dict:
    """Change a rule (built-in ones too); fields left out keep their value."""
    return redo_on_lock_conflict(session, lambda: _update(rule_id, body, key, session, settings))


def _update(
    rule_id: int, body: RulePatch, key: KeyInfo, session: Session, settings: Settings
) -> dict:
    # the lock first, then the rule: a rule read before it may miss a change committed
    # meanwhile, and its stale metric or scope would decide which episodes the change closes
    with rule_writes_lock(session):  # first: then the run locks (never the other way round)
        rule = _own_rule(session, rule_id, key)
        changed = body.model_fields_set
        if "project" in changed or "run_id" in changed:
            _scoped(body, key, session)
            # the rule's own run or project with the other one changed (a PUT of one of them
            # made a rule of run R in another project, and a second rule of the same name)
            run_id = body.run_id if "run_id" in changed else rule.run_id
            project = body.project if "project" in changed else rule.project
            _same_project(session.get(Run, run_id) if run_id else None, project)
        with change_lock(session, rule, body.run_id if "run_id" in changed else None):
            return _written(session, lambda: update_rule(session, rule, body, settings))


@router.delete("/alert-rules/{rule_id}", status_code=204)
def rules_delete(
    rule_id: RuleId, key: ControlKey, session: SessionDep, settings: SettingsDep
) -> Response:
    """Delete a rule and its episodes (its firing alerts that were told resolve first)."""

    def delete() -> None:
        # no evaluation holds a run meanwhile (`run_lock`): none fires the rule being deleted
        with rule_writes_lock(session):
            rule = _own_rule(session, rule_id, key)
            with change_lock(session, rule):
                delete_rule(session, rule, settings)
                session.commit()

    redo_on_lock_conflict(session, delete)
    return Response(status_code=204)


class TestMessage(BaseModel):
    """Body of `POST /api/v1/alert-rules/{id}/test-message`."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
    target: Annotated[str, Field(min_length=1, max_length=2000)]
    """One of the rule's `notify` entries, as the rule lists it."""


@router.post("/alert-rules/{rule_id}/test-message")
def rules_test_message(
    rule_id: RuleId, body: TestMessage, key: ControlKey, session: SessionDep, settings: SettingsDep
) -> dict:
    """Send a test message (`test: true`, no alert) to one of the rule's targets now, through
    the notifications' sender: `{target, sent, error}`. A target refused now (SSRF checks,
    VANTAGE_WEBHOOK_ALLOW) is a 422; one that got a message within the last second a 429."""
    rule = _own_rule(session, rule_id, key)
    try:
        return send_test_message(session, settings, rule, body.target, key.name)
    except (NotATarget, RefusedTarget) as exc:
        raise HTTPException(422, [field_error(str(exc), ["body", "target"])]) from exc
    except TargetBusy as exc:
        raise HTTPException(429, str(exc), headers={"Retry-After": "1"}) from exc


class AlertFilters(BaseModel):
    """`GET /alerts`'s query: an unknown parameter is a 422, not a filter silently dropped."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
    # an empty value is refused, not looked up (`?run_id=` answered "run  not found")
    run_id: Annotated[str, Field(min_length=1)] | None = None
    rule: Annotated[str, Field(min_length=1)] | None = None
    """A rule's name or id."""
    state: Literal["pending", "firing", "resolved"] | None = None
    severity: Annotated[str, Field(min_length=1, max_length=32)] | None = None
    project: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    """The run's project."""
    since: datetime | None = None
    """Episodes changed at or after this time."""
    order: Literal["newest", "firing_first"] = "newest"
    """newest: newest first; firing_first: firing episodes first, then the others."""
    limit: int = Field(DEFAULT_PAGE, ge=1, le=MAX_PAGE)
    """Alerts per page."""
    cursor: Annotated[str, Field(min_length=1, max_length=500)] | None = None
    """The `next_cursor` of the page before (same filters and order)."""


@router.get("/alerts")
def alerts_index(
    key: ReadKey, session: SessionDep, query: Annotated[AlertFilters, Query()]
) -> dict:
    """Alert episodes newest first (or firing first), resolved ones included unless `state`
    filters them, `limit` a page: `{alerts, next_cursor}`; pass `next_cursor` as `cursor` for
    the next page (null: this was the last)."""
    run_id, since, project = query.run_id, query.since, query.project
    if run_id is not None:
        load_run(session, run_id, key)
    if since is not None:
        if not 1970 <= since.year <= 9000:  # the database cannot compare far-off dates
            msg = "since must be a date between 1970 and 9000"
            raise HTTPException(422, [field_error(msg, ["query", "since"])])
        since = as_utc(since)
    if key.project is not None and project not in (None, key.project):
        return {"alerts": [], "next_cursor": None}  # another project's runs: none it may see
    filters = query.model_dump(include={"rule", "state", "severity", "order", "limit", "cursor"})
    try:
        page = alert_page(
            session, run_id=run_id, since=since, project=key.project or project, **filters
        )
    except BadCursor as exc:
        raise HTTPException(422, [field_error(str(exc), ["query", "cursor"])]) from exc
    return {"alerts": page.alerts, "next_cursor": page.next_cursor}


@router.post("/silences", status_code=201)
def silences_create(body: SilenceCreate, key: ControlKey, session: SessionDep) -> dict:
    """Mute notifications (not evaluation) of alerts matching every given matcher. A key
    limited to a project mutes that project's alerts only (its project is the matcher)."""
    _scoped(body.matchers, key, session)
    warning = no_matchers_warning(body.matchers) or unknown_rule_warning(
        session, body.matchers, key
    )
    out = create_silence(session, body, created_by=key.name)
    session.commit()
    return {**out, "warning": warning} if warning else out


@router.get("/silences")
def silences_index(
    key: RulesReader,
    session: SessionDep,
    active: Annotated[
        bool,
        Query(
            description="true: only silences still in force; false (the default): expired ones too"
        ),
    ] = False,
) -> dict:
    """Silences the key may see, newest first (expired ones too unless `active=true`)."""
    silences = list_silences(session, active_only=active)
    return {"silences": [s for s in silences if silence_visible(session, s["matchers"], key)]}


@router.delete("/silences/{silence_id}", status_code=204)
def silences_delete(silence_id: SilenceId, key: ControlKey, session: SessionDep) -> Response:
    silence = session.get(Silence, silence_id)
    if silence is None or not silence_visible(session, silence.matchers or {}, key):
        raise HTTPException(404, f"silence {silence_id} not found")
    if key.project not in (None, silence_project(session, silence.matchers or {})):
        raise HTTPException(
            403,
            f"silence {silence_id} is not limited to project '{key.project}', which this key is",
        )
    session.delete(silence)
    session.commit()
    return Response(status_code=204)
