"""The run page's header and banner: the run's identity, its firing alerts and the mitigations
it offers for one click."""

from __future__ import annotations

import json
from typing import Any

from dash import html
from vantage.dashboard import components, explain


def header(run: dict) -> list:
    """The run's title, status, health verdict (`vantage.server.health`) with its reason,
    identity, mitigation and notes."""
    tags = ", ".join(run.get("tags") or [])
    bits = [
        f"project {run.get('project') or '—'}",
        f"attempt {run.get('attempt')}",
        f"id {run['run_id']}",
    ]
    if tags:
        bits.append(f"tags {tags}")
    mit, mit_help = components.mitigation_text(run)
    out = [
        html.H2([run.get("name") or run["run_id"], " ", components.status_badge(run["status"])]),
        html.Div(
            [
                "Health: ",
                components.health_badge(run, "run-health"),
                " ",
                html.Span(run.get("health_reason") or "", className="muted"),
            ],
            className="run-health",
        ),
        html.Div(" · ".join(bits), className="muted"),
        html.Div(["Mitigation: ", html.Span(mit, title=mit_help, id="run-mitigation")]),
    ]
    if run.get("notes"):  # set with PATCH /api/v1/runs/{id}; shown as typed (text, not markup)
        out.append(html.Div(run["notes"], id="run-notes", className="run-notes"))
    return out


def suggestions(run: dict, alerts: list[dict], state: dict) -> list[dict]:
    """Mitigations to offer for one click: those the server offers with firing alerts (a rule's
    command on a run in 'suggest' mode that does not already ask for it), else AVSPO when the
    run looks stalled (ACR above 0.35 for more than 50 steps), runs and has requested no
    mitigation and its mode is not 'off'. None once the run has finished or failed."""
    if components.run_ended(run):  # no trainer reads commands any more
        return []
    requested = run.get("mitigation_requested") or {}
    requested_mode = requested.get("mode") if isinstance(requested, dict) else requested
    out = [
        {
            "type": mit["type"],
            "params": mit.get("params") or {},
            "alert_id": a.get("alert_id"),
            "why": f"alert {a.get('rule')} is firing (value {explain.fmt(a.get('value'))})",
        }
        for a in alerts
        if a.get("state") == "firing"
        and isinstance(mit := a.get("mitigation"), dict)
        and mit.get("type")
    ]
    avspo = {"mode": "avspo", "threshold": "fixed", "alpha": 0.5}
    # not while a mitigation runs: AVSPO leaves the raw ACR high, and a run started with it
    # from its config (reported, never requested) was offered AVSPO again
    idle = requested_mode in (None, "none") and components.current_mitigation(run) == "none"
    stalled = (state.get("streak") or 0) > 50 and idle
    if not out and stalled and run.get("mitigation_mode") != "off":
        out.append(
            {
                "type": "set_mitigation",
                "params": avspo,
                "alert_id": None,
                "why": f"ACR has been above 0.35 for {state['streak']} steps",
            }
        )
    return out


def banner_key(run: dict, alerts: list[dict], offers: list[dict]) -> str:
    """What the banner shows, in short: its firing alerts and its offers (`suggestions`)."""
    firing = sorted(str(a.get("alert_id")) for a in alerts if a.get("state") == "firing")
    said = [(s["type"], s["params"], s.get("alert_id")) for s in offers]
    return json.dumps([firing, said, components.run_ended(run)], default=str)


def _mitigated_note(run: dict) -> str:
    """For the alerts banner of a run with a mitigation on: the built-in rules read the raw ACR,
    which a mitigation leaves as it is (a stall alert on a run AVSPO brought to an effective 0
    read as the run failing)."""
    mode = components.current_mitigation(run)
    if mode == "none":
        return ""
    return (
        f" {mode.upper()} is on: it leaves the raw ACR that rules read as it is and gives "
        "collapsed groups a gradient, so judge it by the effective ACR line."
    )


def banner(
    run: dict, alerts: list[dict], state: dict, can_control: bool, offers: list[dict] | None = None
) -> list:
    """The run's banner: its firing alerts, then its offers (``offers``: `suggestions` of the
    run, computed here when not given)."""
    offers = suggestions(run, alerts, state) if offers is None else offers
    firing = [a for a in alerts if a.get("state") == "firing"]
    ended = components.run_ended(run)
    parts: list[Any] = []
    if firing:
        parts.append(
            html.Div(
                [
                    html.B(f"Alerts firing{' when the run ended' if ended else ''}: "),
                    *components.alert_chips(firing, ended),
                    html.Span(
                        " Red triangles on the ACR chart mark where alerts fired."
                        + _mitigated_note(run),
                        className="muted",
                    ),
                ],
                className="banner banner-info" if ended else "banner banner-alert",
                id="run-alerts",
            )
        )
    for s in offers:
        params = s["params"] or {}
        mode = params.get("mode", s["type"])
        # what it would do: the mode, or the command and its values (set_sampling temperature=1.3)
        what = mode.upper()
        if "mode" not in params:
            what = " ".join([s["type"], *explain.settings_text(params)])
        said = f"{s['type']} {what}" if "mode" in params else what
        extra = explain.settings_text(params, skip=("mode",))
        if "mode" in params and extra:  # the values the rule set (they were not said)
            said += f" ({', '.join(extra)})"
        parts.append(
            html.Div(
                [
                    html.B("Suggested: "),
                    f"{said} because {s['why']}. ",
                    explain.COMMAND_HELP.get(mode, ""),
                    html.Button(
                        f"Apply {what}",
                        # The command rides in the id, so the click callback needs no lookup.
                        id={
                            "type": "suggest",
                            "command": json.dumps(
                                {
                                    "type": s["type"],
                                    "params": s["params"],
                                    "alert_id": s["alert_id"],
                                }
                            ),
                        },
                        className="action",
                        disabled=not can_control,
                        title="" if can_control else "needs a key with the control scope",
                    ),
                ],
                className="banner banner-info",
            )
        )
    return parts
