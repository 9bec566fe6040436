"""Silences: they mute the notifications (not the evaluation) of matching alerts until a time
(docs/design.md §6). Request bodies, create and list, and which silences a key sees."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import select
from sqlalchemy.orm import Session
from vantage.client.schema import label, prose, text

from ..keys import KeyInfo
from ..models import Run, as_utc, iso, utcnow
from .models import AlertRule, Silence
from .rule_bodies import RuleName
from .rules import visible_to


class SilenceMatchers(BaseModel):
    """Which alerts a silence mutes: all of the given matchers must hold (none: every alert)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    # as rules and runs take them: a name no rule can have ("", " x ") matched nothing, and
    # the silence was taken with at most a "no rule named" warning
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
        # in UTC: SQLite keeps no offset, so 06:31-05:00 was stored as 06:31 UTC
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


def no_matchers_warning(matchers: SilenceMatchers) -> str | None:
    """What to say of a silence without matchers: it mutes every alert of every run, which a
    forgotten matcher does as well as a wish."""
    if matchers.rule is None and matchers.run_id is None and matchers.project is None:
        return "this silence has no matchers: it mutes the notifications of every alert"
    return None


def unknown_rule_warning(session: Session, matchers: SilenceMatchers, key: KeyInfo) -> str | None:
    """What to say when a silence names a rule that does not exist (yet): it mutes nothing
    until one of that name does, which is how a rule is silenced before it is created, but is
    more often a typo. Only rules the key sees count (another project's names stay unknown)."""
    if matchers.rule is None:
        return None
    named = select(AlertRule.id).where(AlertRule.name == matchers.rule, visible_to(key.project))
    if session.scalar(named.limit(1)) is not None:
        return None
    return f"no alert rule is named {matchers.rule!r} yet: this silence mutes nothing until one is"


def silence_visible(session: Session, matchers: dict[str, Any], key: KeyInfo) -> bool:
    """Whether a key sees a silence: one for its project, or one that may mute its runs'
    alerts (no project matcher, and no run matcher or one of its runs)."""
    if key.project is None:
        return True
    project = silence_project(session, matchers)
    return project == key.project or (project is None and "run_id" not in matchers)


def silence_project(session: Session, matchers: dict[str, Any]) -> str | None:
    """The project a silence mutes alerts of only: its project matcher's, else its run
    matcher's run's (one an admin key made for a run of project P is P's to end, as for
    rules), else none."""
    if matchers.get("project") is not None or "run_id" not in matchers:
        return matchers.get("project")
    return session.scalar(select(Run.project).where(Run.id == matchers["run_id"]))
