"""The messages of a transition (docs/design.md §6): the JSON body the outbox keeps, which a
webhook gets as it is, and the same message in Slack's, Discord's and e-mail's own format, each
built from that body at send time (pure functions, no I/O)."""

from __future__ import annotations

import hashlib
import hmac
import json
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import Any

from ..settings import Settings

# Slack's limits (Block Kit): a header's text, a section's text and each field's text.
SLACK_HEADER_CHARS = 150
SLACK_SECTION_CHARS = 3000
SLACK_FIELD_CHARS = 2000
# Discord's limits: message content, embed title, description, field value.
DISCORD_CONTENT_CHARS = 2000
DISCORD_TITLE_CHARS = 256
DISCORD_DESCRIPTION_CHARS = 4096
DISCORD_FIELD_CHARS = 1024
# Discord embed colours: red firing a critical rule, amber firing another, green resolved.
DISCORD_COLOURS = {"critical": 0xD93025, "firing": 0xF29900, "resolved": 0x1E8E3E}


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
    it and `state`), the rule's id and scope (`rule_id`, `rule_project`, `rule_run_id`), its
    condition (`metric`, `op`, `threshold`), `reason` (``why`` no step resolved the alert: its
    rule was disabled, changed or deleted), `recommended_action` (`recommended_action`) and
    `suggested_command` (a command offered, never issued by the alert);
    `text` is a Slack-compatible line that names only the new state. ``run`` and ``rule``:
    anything with a run's `id` and `name` and a rule's columns as attributes."""
    body = {
        "state": state,
        "rule": rule.name,
        "run_id": run.id,
        "run_name": run.name,
        "value": value,
        "step": step,
        "severity": rule.severity,
        "dashboard_url": dashboard_url(settings, run.id),
        "alert_id": alert_id,
        # which rule: rules of one name in several scopes sent look-alike messages
        "rule_id": rule.id,
        "rule_project": rule.project,
        "rule_run_id": rule.run_id,
        "metric": rule.metric,
        "op": rule.op,
        "threshold": rule.threshold,
        "comparison": getattr(rule, "comparison", None) or "absolute",
        "reason": why,
        "recommended_action": recommended_action(rule, run),
        "suggested_command": getattr(rule, "suggested_command", None),
    }
    return {"text": summary(body, _slack, slack_link=True), **body}


def recommended_action(rule: Any, run: Any) -> str | None:
    """The rule's one-line recommended action (its description when it has none), with
    ``{reward_min}`` and ``{reward_max}`` replaced by the run's bounds (``run``: anything with
    them, or None to leave them)."""
    text = getattr(rule, "recommended_action", None) or rule.description or None
    if text and run is not None:
        for name in ("reward_min", "reward_max"):
            value = getattr(run, name, None)
            if value is not None:
                text = text.replace(f"{{{name}}}", f"{value:g}")
    return text


def compared(body: dict[str, Any]) -> str:
    """What a rule's value is: its metric, or for a detector's comparison (docs/detectors.md)
    the metric's z-score or its ratio to the early-run level, so that "kl = 8.3" is not read
    as the KL itself."""
    comparison = body.get("comparison")
    if comparison == "zscore":
        return f"z-score of {body['metric']}"
    if comparison == "relative":
        return f"{body['metric']} / early-run level"
    return str(body["metric"])


# The condition in the summary line in words: `text` is Slack-compatible (DESIGN §6), where
# "<" and ">" must be escaped, and a generic receiver showed "acr = 1 (&gt; 0.5)".
_OP_WORDS = {">": "above", ">=": "at or above", "<": "below", "<=": "at or below"}


def summary(body: dict[str, Any], escape: Any = str, slack_link: bool = False) -> str:
    """One line saying what happened, names passed through ``escape``: ``:rotating_light:
    [warning] acr_stall FIRING on run 'qwen' at step 12: acr = 0.5 (above 0.35)``; with
    ``slack_link``, the dashboard link in Slack's ``<url|dashboard>`` form. The recommended
    action stays in its own field: the line names only the new state (DESIGN §6)."""
    firing = body["state"] == "firing"
    at = f" at step {body['step']}" if body.get("step") is not None else ""
    icon = ":rotating_light:" if firing else ":white_check_mark:"
    verb = "FIRING" if firing else "RESOLVED"
    if body.get("reason"):
        shown = escape(body["reason"])
    else:
        value = body.get("value")
        shown = f"{escape(compared(body))} = {'none' if value is None else f'{value:.4g}'}"
    words = _OP_WORDS.get(body.get("op"), escape(str(body.get("op"))))
    cond = f" ({words} {body['threshold']:g})" if firing else ""
    url = body.get("dashboard_url")
    link = f" <{url}|dashboard>" if url and slack_link else ""
    test = "TEST, no alert: " if body.get("test") else ""  # a rule's "send a test message"
    return (
        f"{icon} {test}[{escape(body['severity'])}] {escape(body['rule'])} {verb} on run "
        f"'{escape(body['run_name'])}'{at}: {shown}{cond}{link}"
    )


def chat_line(body: dict[str, Any]) -> str:
    """A body's `text`: its `summary` with Slack's escapes and dashboard link."""
    return summary(body, _slack, slack_link=True)


def _headline(body: dict[str, Any]) -> str:
    """A header's or title's words: the rule and its new state (and TEST for a test message)."""
    state = "FIRING" if body["state"] == "firing" else "RESOLVED"
    return f"{body['rule']} {state}{' (TEST)' if body.get('test') else ''}"


def _has_condition(body: dict[str, Any]) -> bool:
    """A body queued before the condition was part of it has `text` alone to go on."""
    return all(k in body for k in ("metric", "op", "threshold"))


def _facts(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) of what every format shows besides the summary line."""
    value = body.get("value")
    facts = [
        ("Run", f"{body['run_name']} ({body['run_id']})"),
        ("Step", "none" if body.get("step") is None else str(body["step"])),
        ("Value", "none" if value is None else f"{value:.6g}"),
        ("Severity", str(body["severity"])),
    ]
    if _has_condition(body):
        facts.append(("Condition", f"{compared(body)} {body['op']} {body['threshold']:g}"))
    return facts


def slack_body(body: dict[str, Any]) -> dict[str, Any]:
    """The message as a Slack incoming webhook takes it: `text` (the summary line, which
    notifications show) and Block Kit `blocks`: a header, the line, the facts as fields, the
    recommended action and the dashboard link. Names are escaped (`_slack`), so a run named
    ``<!channel>`` pings no one."""
    header = _headline(body)
    fields = [
        {"type": "mrkdwn", "text": _cut(f"*{label}*\n{_slack(text)}", SLACK_FIELD_CHARS)}
        for label, text in _facts(body)
    ]
    blocks: list[dict[str, Any]] = [
        {
            "type": "header",
            "text": {"type": "plain_text", "text": _cut(header, SLACK_HEADER_CHARS)},
        },
        _slack_section(body["text"]),
        {"type": "section", "fields": fields},
    ]
    if body.get("recommended_action"):
        blocks.append(_slack_section(f"*Recommended action*\n{_slack(body['recommended_action'])}"))
    if body.get("dashboard_url"):
        blocks.append(_slack_section(f"<{body['dashboard_url']}|Open the run's dashboard>"))
    return {"text": body["text"], "blocks": blocks}


def _slack_section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": _cut(text, SLACK_SECTION_CHARS)}}


def discord_body(body: dict[str, Any]) -> dict[str, Any]:
    """The message as a Discord webhook takes it: `content` (the summary line) and one embed
    (title, description, colour by state and severity, the facts as fields, the dashboard as
    its url). `allowed_mentions` empty: a run named ``@everyone`` pings no one."""
    firing = body["state"] == "firing"
    line = summary(body, _discord) if _has_condition(body) else body["text"]
    line = line.replace(":rotating_light:", "\N{POLICE CARS REVOLVING LIGHT}", 1)
    line = line.replace(":white_check_mark:", "\N{WHITE HEAVY CHECK MARK}", 1)
    colour = (
        "resolved" if not firing else "critical" if body["severity"] == "critical" else "firing"
    )
    fields = [
        {"name": label, "value": _cut(_discord(text), DISCORD_FIELD_CHARS), "inline": True}
        for label, text in _facts(body)
    ]
    if body.get("recommended_action"):
        action = _cut(_discord(body["recommended_action"]), DISCORD_FIELD_CHARS)
        fields.append({"name": "Recommended action", "value": action, "inline": False})
    embed: dict[str, Any] = {
        "title": _cut(_headline(body), DISCORD_TITLE_CHARS),
        "description": _cut(line, DISCORD_DESCRIPTION_CHARS),
        "color": DISCORD_COLOURS[colour],
        "fields": fields,
    }
    if body.get("dashboard_url"):
        embed["url"] = body["dashboard_url"]
    return {
        "content": _cut(line, DISCORD_CONTENT_CHARS),
        "embeds": [embed],
        "allowed_mentions": {"parse": []},
    }


def email_message(
    body: dict[str, Any], sender: str, to: str, signature: str | None = None
) -> EmailMessage:
    """The message as an e-mail from ``sender`` to ``to``: the summary line (without Slack's
    markup) as its subject, the facts, the recommended action and the dashboard link as plain
    text, and the JSON body attached as ``alert.json``; ``signature`` (`signature_header` over
    that attachment's bytes) goes in an ``X-Vantage-Signature`` header."""
    line = summary(body) if _has_condition(body) else body["text"]
    subject = line.removeprefix(":rotating_light: ").removeprefix(":white_check_mark: ")
    lines = [subject, ""]
    lines += [f"{label}: {text}" for label, text in _facts(body)]
    if body.get("recommended_action"):
        lines += ["", "Recommended action:", str(body["recommended_action"])]
    if body.get("dashboard_url"):
        lines += ["", f"Dashboard: {body['dashboard_url']}"]
    msg = EmailMessage()
    msg["Subject"] = _one_line(subject)
    msg["From"] = sender
    msg["To"] = to
    msg["Date"] = formatdate(localtime=False)
    msg["Message-ID"] = make_msgid(domain=sender.rpartition("@")[2].strip(" >") or None)
    if signature is not None:
        msg[SIGNATURE_HEADER] = signature
    msg.set_content("\n".join(lines) + "\n")
    msg.add_attachment(
        json_bytes(body), maintype="application", subtype="json", filename="alert.json"
    )
    return msg


SIGNATURE_HEADER = "X-Vantage-Signature"
# The outbox message's id, the same on every try of one message: a receiver that keeps the ids
# it has seen turns at-least-once delivery into one notification per message.
MESSAGE_ID_HEADER = "X-Vantage-Message-Id"


def signature_header(secret: str, body: bytes, timestamp: int) -> str:
    """The `X-Vantage-Signature` value of a message ``body`` sent at ``timestamp`` (Unix
    seconds): ``t=<timestamp>,v1=<hex HMAC-SHA256 of "<timestamp>." + body under secret>``, the
    scheme of Stripe's webhook signatures. A receiver recomputes it over the raw body (an
    e-mail's: its ``alert.json`` attachment) and refuses a mismatch or an old timestamp (a
    replay)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def json_bytes(body: dict[str, Any]) -> bytes:
    """A body as it goes out: compact JSON, UTF-8 (what a signature is computed over)."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _one_line(text: str) -> str:
    return "".join(c if c.isprintable() else " " for c in text)


def _slack(text: str) -> str:
    """``text`` as plain text in a Slack message: ``&``, ``<`` and ``>`` escaped, as Slack's
    message formatting asks, so that a run named ``<!channel>`` pings no one and
    ``<http://x|y>`` is no disguised link (the other fields carry the names as they are); line
    breaks and other control characters become spaces, so the summary stays one line."""
    return _one_line(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_DISCORD_MARKDOWN = str.maketrans({c: f"\\{c}" for c in "\\*_~`|>[]<@"})


def _discord(text: str) -> str:
    """``text`` as plain text in a Discord message: markdown characters escaped, so that a
    run named ``**x**`` shows its asterisks, ``[x](http://y)`` is no disguised link and
    ``<@123>`` no mention (`allowed_mentions` stops pings too); one line."""
    return _one_line(str(text)).translate(_DISCORD_MARKDOWN)
