"""Alert rules: create, change, delete and list them, and what a key may see and change of
them (docs/design.md §6). Functions take a session and return JSON-able dicts or rows; the caller
commits."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from sqlalchemy import ColumnElement, and_, or_, select, true
from sqlalchemy.orm import Session

from ..keys import KeyInfo
from ..locks import lock_runs
from ..models import Run, iso, run_not_found, utcnow
from ..settings import Settings
from .detectors import MIN_BASELINE
from .episodes import end_rule_episodes
from .models import AlertRule, AlertState
from .rule_bodies import RULE_FIELDS, RuleCreate, RulePatch
from .targets import RefusedTarget, check_target, redact_target, smtp_missing


def rule_dict(r: AlertRule) -> dict[str, Any]:
    out = {"id": r.id, **{f: getattr(r, f) for f in RULE_FIELDS}}
    out["notify"] = list(r.notify or [])
    out["builtin"] = r.builtin
    out["created_at"] = iso(r.created_at)
    out["updated_at"] = iso(r.updated_at)
    return out


def check_notify(targets: list[str], settings: Settings) -> list[str]:
    """The targets (a rule body's, which `_once` made one per target), each checked and as
    stored (an e-mail address as ``mailto:ADDRESS``); raises ValueError naming a refused
    target, an e-mail one too while the server has no SMTP settings."""
    missing = smtp_missing(settings)
    try:
        checked = [check_target(t, settings.webhook_allow, smtp_missing=missing) for t in targets]
    except RefusedTarget as exc:
        raise ValueError(str(exc)) from exc
    return list(dict.fromkeys(checked))  # "ops@x.org" and "mailto:ops@x.org" are one target


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
    of one name both fired for the same run)."""
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


def _apply(session: Session, rule: AlertRule, fields: dict[str, Any], settings: Settings) -> None:
    if "notify" in fields and fields["notify"] is not None:
        fields["notify"] = check_notify(fields["notify"], settings)
    if fields.get("run_id") is not None and session.get(Run, fields["run_id"]) is None:
        raise LookupError(run_not_found(fields["run_id"]))
    for name, value in fields.items():
        if name in ("mitigation", "suggested_command") and value is not None:
            value = {"type": value["type"], "params": value.get("params") or {}}
        setattr(rule, name, value)
    _check_clear_side(rule)
    _check_comparison(rule)
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


def _check_comparison(rule: AlertRule) -> None:
    """A detector comparison the rule could never evaluate (docs/detectors.md): a z-score with
    fewer baseline values than one needs, or a comparison or warmup on `stale`, which the
    clock evaluates (seconds since the run's last data), not its steps."""
    if rule.metric == "stale" and rule.comparison != "absolute":
        raise RuleFieldError(
            "comparison",
            f"comparison '{rule.comparison}' cannot watch stale: stale is the seconds since the "
            "run's last data, evaluated by the clock rather than step by step, so it has no "
            "baseline; use comparison 'absolute'",
        )
    if rule.metric == "stale" and rule.warmup_steps:
        raise RuleFieldError(
            "warmup_steps",
            "stale is evaluated by the clock rather than step by step: warmup_steps must be 0",
        )
    if rule.comparison == "zscore" and (rule.baseline_steps or 0) < MIN_BASELINE:
        raise RuleFieldError(
            "baseline_steps",
            f"a zscore rule needs baseline_steps {MIN_BASELINE} or more (a z-score needs "
            f"{MIN_BASELINE} baseline values); with {rule.baseline_steps} it could never fire",
        )


def create_rule(session: Session, body: RuleCreate, settings: Settings) -> dict[str, Any]:
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
        comparison="absolute",
        baseline_steps=20,
        warmup_steps=0,
        alert_cooldown_steps=0,
        created_at=utcnow(),
    )
    fields = body.model_dump(exclude_unset=True)
    fields = {
        k: v
        for k, v in fields.items()
        if v is not None
        or k
        in (
            "run_id",
            "project",
            "clear_threshold",
            "mitigation",
            "description",
            "recommended_action",
            "suggested_command",
        )
    }
    _apply(session, rule, fields, settings)
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
        "comparison",
        "baseline_steps",
        "warmup_steps",
        "alert_cooldown_steps",
    ):
        if required in fields and fields[required] is None:
            raise RuleFieldError(required, f"'{required}' cannot be null")
    _apply(session, rule, fields, settings)
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
    another project's run was shown to every project key, run id and all."""
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


def in_key_project(session: Session, rule: AlertRule, key: KeyInfo) -> bool:
    """Whether the rule is the key's to change, scope aside: the key is of every project, or of
    the rule's (`rule_project`: a rule an admin key made for a run of project P without naming
    P is P's, and P's key could not change it)."""
    return key.project is None or key.project == rule_project(session, rule)


def rule_as_seen(session: Session, rule: AlertRule, key: KeyInfo) -> dict[str, Any]:
    """The rule as the key may see it: its targets (webhook URLs often carry a token in their
    path, as Slack's do) in full only to a key that may change the rule (control scope, and
    `in_key_project`); to others, their scheme and host (an e-mail's domain), so that read
    keys (the dashboard's included) never read the tokens."""
    out = rule_dict(rule)
    if not ("control" in key.scopes and in_key_project(session, rule, key)):
        out["notify"] = [redact_target(u) for u in out["notify"]]
    return out
