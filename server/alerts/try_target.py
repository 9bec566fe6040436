"""A rule's "send a test message" (`POST /api/v1/alert-rules/{id}/test-message`): one message to
one of its `notify` targets, at once, through the sender the outbox uses (`OutboxSender.deliver`:
the target's format, the SSRF checks again at send time, the signature) and its per-target send
slot (at most one message per second per target, with the outbox's own messages). Nothing goes
into the outbox: a test that fails is said to the caller, never retried."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from sqlalchemy.orm import Session

from ..models import Run, utcnow
from ..settings import Settings
from .messages import chat_line, webhook_body
from .models import AlertRule
from .outbox import OutboxSender, release_send_slot, take_send_slot
from .targets import RefusedTarget, check_target, redact_target


class NotATarget(LookupError):
    """The entry is not one of the rule's `notify` targets."""


class TargetBusy(Exception):
    """The target's send slot is taken: a message went there less than a second ago."""


def trial_body(
    settings: Settings, rule: AlertRule, run: Run | None, sent_by: str
) -> dict[str, Any]:
    """The §6 body of a firing of ``rule`` with `test` true, no alert (`alert_id` null), no step,
    the threshold as its value, and a `reason` saying who asked; the rule's run when it has one,
    else none (`run_id` null)."""
    shown_run = run or SimpleNamespace(id=None, name="(any run: this is a test)")
    why = f"test message sent by {sent_by}; no alert fired"
    body = webhook_body(settings, shown_run, rule, 0, "firing", None, rule.threshold, why)
    body.update(alert_id=None, test=True)
    if run is None and settings.public_url:
        body["dashboard_url"] = f"{settings.public_url.rstrip('/')}/dashboard/rules"
    elif run is None:
        body["dashboard_url"] = None
    body["text"] = chat_line(body)
    return body


def send_test_message(
    session: Session, settings: Settings, rule: AlertRule, entry: str, sent_by: str
) -> dict[str, Any]:
    """Send a test message to ``entry``, one of ``rule``'s targets, and say how it went:
    ``{target, sent, error}`` (``target`` redacted as read keys see it; ``error`` the target's
    answer or the connection's failure, None when sent). Raises NotATarget, RefusedTarget (the
    target is refused now, e.g. it resolves to a link-local address or VANTAGE_WEBHOOK_ALLOW
    changed) or TargetBusy. Commits the send slot's moves."""
    if entry not in (rule.notify or []):
        shown = ", ".join(redact_target(t) for t in rule.notify or []) or "none"
        raise NotATarget(
            f"'{redact_target(entry)}' is not a notify target of alert rule {rule.id} (its "
            f"targets: {shown}); add it to the rule first"
        )
    check_target(entry, settings.webhook_allow)  # refused: said, not sent (and no slot taken)
    run = session.get(Run, rule.run_id) if rule.run_id else None
    body = trial_body(settings, rule, run, sent_by)
    now = utcnow()
    lease = now + timedelta(seconds=settings.webhook_timeout_s + 5)
    if not take_send_slot(session, entry, now, lease):
        session.rollback()
        raise TargetBusy(
            f"a message went to {redact_target(entry)} less than "
            f"{settings.webhook_min_interval_s:g} s ago, or is being sent; try again shortly"
        )
    session.commit()
    sender = OutboxSender(settings, session_factory=lambda: session)  # `deliver` opens none
    try:
        error, outcome = sender.deliver(entry, body)
    finally:
        sender.close()
        release_send_slot(session, entry, settings)
        session.commit()
    return {"target": redact_target(entry), "sent": outcome == "sent", "error": error}


__all__ = ["NotATarget", "RefusedTarget", "TargetBusy", "send_test_message", "trial_body"]
