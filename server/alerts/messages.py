"""The body of a webhook message (docs/design.md §6): JSON fields for programs and a
Slack-compatible `text` line for people."""

from __future__ import annotations

from typing import Any

from ..settings import Settings


def dashboard_url(settings: Settings, run_id: str) -> str | None:
    if not settings.public_url:
        return None
    return f"{settings.public_url.rstrip('/')}/dashboard/runs/{run_id}"


def webhook_body(
    settings: Settings,
    run: Any,
    rule: Any,
    alert_id: int,
    state: str,
    step: int | None,
    value: float | None,
    why: str | None = None,
) -> dict[str, Any]:
    """The §6 body, plus `alert_id` (the episode: a receiver that retries may de-duplicate on
    it and `state`) and the rule's id and scope (`rule_id`, `rule_project`, `rule_run_id`);
    `text` is a Slack-compatible line that names only the new state, and ``why`` instead of
    the value when no step resolved the alert (its rule was disabled, changed or deleted).
    ``run`` and ``rule``: anything with a run's `id` and `name` and a rule's columns as
    attributes."""
    url = dashboard_url(settings, run.id)
    at = f" at step {step}" if step is not None else ""
    icon = ":rotating_light:" if state == "firing" else ":white_check_mark:"
    verb = "FIRING" if state == "firing" else "RESOLVED"
    shown = _slack(why) if why else f"{_slack(rule.metric)} = {value:.4g}"
    cond = f" ({_slack(rule.op)} {rule.threshold:g})" if state == "firing" else ""
    link = f" <{url}|dashboard>" if url else ""
    return {
        "text": f"{icon} [{_slack(rule.severity)}] {_slack(rule.name)} {verb} on run "
        f"'{_slack(run.name)}'{at}: {shown}{cond}{link}",
        "state": state,
        "rule": rule.name,
        "run_id": run.id,
        "run_name": run.name,
        "value": value,
        "step": step,
        "severity": rule.severity,
        "dashboard_url": url,
        "alert_id": alert_id,
        # which rule: rules of one name in several scopes sent look-alike messages
        "rule_id": rule.id,
        "rule_project": rule.project,
        "rule_run_id": rule.run_id,
    }


def _slack(text: str) -> str:
    """``text`` as plain text in a Slack message: ``&``, ``<`` and ``>`` escaped, as Slack's
    message formatting asks, so that a run named ``<!channel>`` pings no one and
    ``<http://x|y>`` is no disguised link (the other fields carry the names as they are); line
    breaks and other control characters become spaces, so the summary stays one line."""
    one_line = "".join(c if c.isprintable() else " " for c in text)
    return one_line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
