"""Notification targets and formats without a server (docs/design.md §6): which kind a `notify`
entry is, what is refused, and the Slack, Discord and e-mail form of one message."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from vantage.server.alerts.messages import (
    discord_body,
    email_message,
    slack_body,
    webhook_body,
)
from vantage.server.alerts.targets import (
    RefusedTarget,
    Target,
    check_target,
    parse_target,
    redact_target,
)

SLACK = "https://hooks.slack.com/services/T000/B000/XXXX"
DISCORD = "https://discord.com/api/webhooks/123/abc"


@pytest.mark.parametrize(
    ("entry", "target"),
    [
        (SLACK, Target("slack", SLACK)),
        (
            "https://hooks.slack.com/triggers/T/1/x",
            Target("webhook", "https://hooks.slack.com/triggers/T/1/x"),
        ),  # noqa: E501 (a workflow takes any JSON)
        (DISCORD, Target("discord", DISCORD)),
        (
            "https://discordapp.com/api/webhooks/1/x",
            Target("discord", "https://discordapp.com/api/webhooks/1/x"),
        ),  # noqa: E501
        ("https://discord.com/channels/1", Target("webhook", "https://discord.com/channels/1")),
        ("slack+http://127.0.0.1:9/hook", Target("slack", "http://127.0.0.1:9/hook")),
        ("Discord+https://chat.example/x", Target("discord", "https://chat.example/x")),
        ("https://alerts.example.com/x", Target("webhook", "https://alerts.example.com/x")),
        ("mailto:ops@example.com", Target("email", "ops@example.com")),
        ("ops@example.com", Target("email", "ops@example.com")),
    ],
)
def test_the_kind_of_a_target(entry, target):
    assert parse_target(entry) == target


def test_e_mail_targets_are_checked_and_stored_as_mailto():
    assert check_target("ops@example.com", None) == "mailto:ops@example.com"
    assert check_target("mailto:a.b+x@mail.example.org", None) == "mailto:a.b+x@mail.example.org"
    for bad in (
        "ops@example.com, boss@example.com",  # a second recipient
        "Ops <ops@example.com>",
        "ops@example.com\r\nBcc: all@example.com",  # a header of its own
        "mailto:ops@example.com?cc=boss@example.com",
        "mailto:@example.com",
        "ops@",
    ):
        with pytest.raises(RefusedTarget, match="not one plain address"):
            check_target(bad, None)
    missing = ["VANTAGE_SMTP_HOST", "VANTAGE_SMTP_FROM"]
    with pytest.raises(RefusedTarget, match="set VANTAGE_SMTP_HOST and VANTAGE_SMTP_FROM"):
        check_target("ops@example.com", None, smtp_missing=missing)


def test_prefixed_targets_are_checked_as_their_url():
    assert check_target("slack+http://127.0.0.1:9/hook", None) == "slack+http://127.0.0.1:9/hook"
    for bad in ("slack+http://169.254.169.254/x", "discord+file:///etc/passwd", "slack+ftp://x/"):
        with pytest.raises(RefusedTarget):
            check_target(bad, None)
    with pytest.raises(RefusedTarget, match="VANTAGE_WEBHOOK_ALLOW"):
        check_target("slack+https://evil.test/x", "https://hooks.slack.com/")
    assert check_target(f"slack+{SLACK}", "https://hooks.slack.com/") == f"slack+{SLACK}"


def test_redacted_targets_keep_no_token():
    assert redact_target(SLACK) == "https://hooks.slack.com/…"
    assert (
        redact_target("slack+https://chat.example:8443/t0ken")
        == "slack+https://chat.example:8443/…"
    )
    assert redact_target("mailto:ops@example.com") == "mailto:…@example.com"


def body(state: str = "firing", **rule_fields) -> dict:
    settings = SimpleNamespace(public_url="https://vantage.example.com")
    run = SimpleNamespace(id="run-1", name="qwen <grpo> *fast*")
    rule = SimpleNamespace(
        id=7, name="acr_stall", project=None, run_id=None, severity="critical", metric="acr",
        op=">", threshold=0.35, description="Lower the learning rate or turn on AVSPO.",
    )  # fmt: skip
    for name, value in rule_fields.items():
        setattr(rule, name, value)
    return webhook_body(settings, run, rule, 3, state, 12, 0.5)


def test_the_json_body_is_the_webhook_message():
    firing = body()
    assert firing["text"] == (
        ":rotating_light: [critical] acr_stall FIRING on run 'qwen &lt;grpo&gt; *fast*' at step "
        "12: acr = 0.5 (above 0.35) <https://vantage.example.com/dashboard/runs/run-1|dashboard>"
    )
    assert (firing["state"], firing["run_name"], firing["step"], firing["value"]) == (
        "firing", "qwen <grpo> *fast*", 12, 0.5,
    )  # fmt: skip
    assert firing["recommended_action"] == "Lower the learning rate or turn on AVSPO."
    assert (firing["metric"], firing["op"], firing["threshold"]) == ("acr", ">", 0.35)
    assert body(description=None)["recommended_action"] is None


def test_slack_format():
    message = slack_body(body())
    assert message["text"] == body()["text"]  # what a notification shows
    header, line, facts, action, link = message["blocks"]
    assert header == {"type": "header", "text": {"type": "plain_text", "text": "acr_stall FIRING"}}
    assert line["text"] == {"type": "mrkdwn", "text": body()["text"]}
    shown = [f["text"] for f in facts["fields"]]
    assert shown == [
        "*Run*\nqwen &lt;grpo&gt; *fast* (run-1)",
        "*Step*\n12",
        "*Value*\n0.5",
        "*Severity*\ncritical",
        "*Condition*\nacr &gt; 0.35",
    ]
    assert (
        action["text"]["text"] == "*Recommended action*\nLower the learning rate or turn on AVSPO."
    )
    link_text = "<https://vantage.example.com/dashboard/runs/run-1|Open the run's dashboard>"
    assert link["text"]["text"] == link_text
    resolved = slack_body(body("resolved", description=None))
    assert resolved["blocks"][0]["text"]["text"] == "acr_stall RESOLVED"
    assert len(resolved["blocks"]) == 4  # no recommended action


def test_discord_format():
    message = discord_body(body())
    assert message["allowed_mentions"] == {"parse": []}  # "@everyone" in a name pings no one
    assert message["content"] == (
        "\N{POLICE CARS REVOLVING LIGHT} [critical] acr\\_stall FIRING on run "
        "'qwen \\<grpo\\> \\*fast\\*' at step 12: acr = 0.5 (above 0.35)"
    )
    (embed,) = message["embeds"]
    assert embed["title"] == "acr_stall FIRING" and embed["description"] == message["content"]
    assert embed["url"] == "https://vantage.example.com/dashboard/runs/run-1"
    assert embed["color"] == 0xD93025  # critical and firing: red
    fields = {f["name"]: f["value"] for f in embed["fields"]}
    assert fields == {
        "Run": "qwen \\<grpo\\> \\*fast\\* (run-1)",
        "Step": "12",
        "Value": "0.5",
        "Severity": "critical",
        "Condition": "acr \\> 0.35",
        "Recommended action": "Lower the learning rate or turn on AVSPO.",
    }
    resolved = discord_body(body("resolved", severity="warning"))["embeds"][0]
    assert resolved["color"] == 0x1E8E3E and resolved["title"] == "acr_stall RESOLVED"
    assert discord_body(body(severity="warning"))["embeds"][0]["color"] == 0xF29900


def test_e_mail_format():
    message = email_message(body(), "Vantage <vantage@example.com>", "ops@example.com", "t=1,v1=ab")
    assert message["Subject"] == (
        "[critical] acr_stall FIRING on run 'qwen <grpo> *fast*' at step 12: acr = 0.5 (above 0.35)"
    )
    assert (message["From"], message["To"]) == ("Vantage <vantage@example.com>", "ops@example.com")
    assert message["X-Vantage-Signature"] == "t=1,v1=ab"
    text, attached = message.iter_parts()
    said = text.get_content()
    assert "Recommended action:\nLower the learning rate or turn on AVSPO." in said
    assert "Dashboard: https://vantage.example.com/dashboard/runs/run-1" in said
    assert "Run: qwen <grpo> *fast* (run-1)" in said and "Step: 12" in said
    assert attached.get_filename() == "alert.json"
    assert json.loads(attached.get_content()) == body()


def test_a_body_queued_before_the_condition_was_in_it_still_formats():
    """Outbox rows written by an earlier version carry `text` without the condition fields."""
    old = {k: v for k, v in body().items() if k not in ("metric", "op", "threshold", "reason")}
    assert slack_body(old)["text"] == old["text"]
    assert discord_body(old)["content"].startswith("\N{POLICE CARS REVOLVING LIGHT} [critical]")
    assert email_message(old, "v@example.com", "ops@example.com")["Subject"].startswith(
        "[critical]"
    )
