"""The run page's command panel and command log.

Each action button names a command; clicking it asks for confirmation (`confirm_box`, saying
what the trainer will do), then the command is created as the logged-in key and appears in the
log, whose status the trainer moves from pending to delivered to applied."""

from __future__ import annotations

import json
import math
from typing import Any

from dash import dcc, html
from pydantic import ValidationError
from vantage.client.schema import (
    AVSPO_THRESHOLDS,
    MITIGATION_DEFAULTS,
    TEMPERATURE_RANGE,
    errors_in_one_line,
    temperature_problem,
    validate_command_params,
)
from vantage.dashboard import explain

ACTIONS = {
    # action: (button text, command type, help key, danger)
    "avspo": ("Enable AVSPO", "set_mitigation", "avspo", False),
    "aapo": ("Enable AAPO", "set_mitigation", "aapo", False),
    "dapo": ("Enable DAPO", "set_mitigation", "dapo", False),
    "none": ("Mitigation off", "set_mitigation", "none", False),
    "temperature": ("Set temperature", "set_sampling", "temperature", False),
    "checkpoint": ("Save checkpoint", "checkpoint", "checkpoint", False),
    "stop": ("Stop run", "stop", "stop", True),
}


def build_command(action: str, values: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(type, params) of an action from the panel's inputs, checked as the server checks a
    command (before the confirmation: a temperature of -1 was confirmed, then refused with
    pydantic's dump); raises ValueError saying what is wrong."""
    kind, params = _command(action, values)
    validate_command_params(kind, params)
    return kind, params


def _command(action: str, values: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    kind = ACTIONS[action][1]
    if action == "avspo":
        alpha = values.get("avspo_alpha")
        params = {
            "mode": "avspo",
            "threshold": values.get("avspo_threshold") or MITIGATION_DEFAULTS["threshold"],
        }
        if alpha is not None:
            params["alpha"] = float(alpha)
        return kind, params
    if action == "aapo":
        params: dict[str, Any] = {"mode": "aapo"}
        for key in ("delta_low", "delta_high"):
            if values.get(f"aapo_{key}") is not None:
                params[key] = float(values[f"aapo_{key}"])
        return kind, params
    if action == "dapo":
        batches = values.get("dapo_max_gen_batches")
        if batches is None or batches == "":
            return kind, {"mode": "dapo"}
        # a whole float (3.0) is that integer; any other value goes to the server's check as is
        whole = isinstance(batches, float) and batches.is_integer()
        return kind, {"mode": "dapo", "max_gen_batches": int(batches) if whole else batches}
    if action == "none":
        return kind, {"mode": "none"}
    if action == "temperature":
        t = values.get("temperature")
        low, high = TEMPERATURE_RANGE
        if t is None or t == "":
            raise ValueError(f"enter a temperature, a number from {low:g} to {high:g}")
        if problem := temperature_problem(float(t)):
            raise ValueError(problem)
        return kind, {"temperature": float(t)}
    return kind, {}


def asked_command(trigger: dict, values: dict[str, Any]) -> tuple[str, dict, int | None]:
    """(type, params, alert id) of the command a click asks for: a suggestion's, which rides in
    its button's id, or an action button's from the panel's ``values`` (`build_command`).
    Raises ValueError, KeyError, IndexError or TypeError for a malformed one."""
    if trigger["type"] == "suggest":
        cmd = json.loads(trigger["command"])
        return cmd["type"], cmd.get("params") or {}, cmd.get("alert_id")
    kind, params = build_command(trigger["action"], values)
    return kind, params, None


def one_line(exc: Exception) -> str:
    """An error as one line: pydantic's validation errors as "field: message" each."""
    if isinstance(exc, ValidationError):
        return errors_in_one_line(exc)
    return str(exc)


def pending_command(
    pending: object, run_id: object, reason: object
) -> tuple[str, dict, int | None]:
    """The command the browser asks to send, checked: the store and fields come from the
    browser, and a crafted request with a store of another shape was a 500.
    Raises ValueError saying what is wrong."""
    if not isinstance(run_id, str) or not (reason is None or isinstance(reason, str)):
        raise ValueError("the page's run or reason is not text; reload the page")
    if reason is not None and len(reason) > 1000:  # pydantic's dump said so
        raise ValueError(f"the reason has {len(reason):,} characters; at most 1,000")
    if not isinstance(pending, dict):
        raise ValueError("the command to send is not a command; choose it again")
    kind, params = pending.get("type"), pending.get("params")
    if not isinstance(kind, str) or not isinstance(params, dict):
        raise ValueError("the command to send has no type or parameters; choose it again")
    alert_id = pending.get("alert_id")
    if alert_id is not None and (type(alert_id) is not int or not 0 < alert_id < 2**31):
        raise ValueError("the alert the command answers is not an alert id; choose it again")
    return kind, params, alert_id


def confirm_box() -> html.Div:
    """The confirmation of a command, hidden until an action asks for it: its sentence
    (`describe`), Send and Cancel. Part of the page, not the browser's confirm dialog, which
    Dash's ConfirmDialog sometimes fails to open on the first click after a live update,
    leaving "Stop run" looking dead."""
    return html.Div(
        html.Div(
            [
                html.P(id="cmd-confirm-message"),
                html.Button("Send", id="cmd-confirm-send", className="confirm-send", n_clicks=0),
                html.Button("Cancel", id="cmd-confirm-cancel", className="secondary", n_clicks=0),
            ],
            className="confirm-box",
            role="dialog",
        ),
        id="cmd-confirm",
        className="confirm-overlay",
        hidden=True,
    )


def describe(kind: str, params: dict[str, Any], run_name: str = "") -> str:
    """One sentence for the confirmation, naming the run (with several run pages open, a
    confirmation that did not was easy to give on the wrong one)."""
    shown = ", ".join(explain.settings_text(params)) or "no parameters"
    what = {
        "set_mitigation": "switch the advantage estimator",
        "set_sampling": "change the sampling temperature",
        "checkpoint": "save a checkpoint",
        "stop": "STOP training",
    }.get(kind, kind)
    return (
        f"Send '{kind}' ({shown}) to run '{run_name}'? Its trainer will {what} at its next step "
        "boundary and report back in the command log."
    )


def _button(action: str, why_not: str | None) -> html.Button:
    """A command button; ``why_not`` (shown as its tooltip) disables it."""
    text, _kind, help_key, danger = ACTIONS[action]
    return html.Button(
        text,
        id={"type": "cmd", "action": action},
        className="action danger" if danger else "action",
        disabled=why_not is not None,
        title=why_not or explain.COMMAND_HELP[help_key],
    )


def _card(title: str, help_text: str, *children: Any) -> html.Div:
    """One action's box in the command panel: its title, what it does, its inputs and button."""
    return html.Div([html.H4(title), html.P(help_text), *children], className="cmd")


def _number(id_: str, value: float, step: float, label: str, help_text: str) -> html.Span:
    return html.Span(
        [
            html.Label(label, htmlFor=id_, title=help_text),
            dcc.Input(id=id_, type="number", value=value, step=step, debounce=True),
        ],
        title=help_text,
    )


# A form field → (the trainer config's field, the set_mitigation param, the trainer's default).
SETTINGS = {
    form: (config_field, param, MITIGATION_DEFAULTS[param])
    for form, config_field, param in (
        ("avspo_threshold", "avspo_threshold", "threshold"),
        ("avspo_alpha", "avspo_alpha", "alpha"),
        ("aapo_delta_low", "aapo_delta_low", "delta_low"),
        ("aapo_delta_high", "aapo_delta_high", "delta_high"),
        ("dapo_max_gen_batches", "max_gen_batches", "max_gen_batches"),
    )
}


def current_settings(run: dict, commands: list[dict], latest: dict | None = None) -> dict[str, Any]:
    """The run's settings as far as the server knows, the starting values of the command forms
    (so that a click re-sends what is in effect, not the defaults): each mitigation setting
    from the run's config, then every applied `set_mitigation` that names it (the trainer keeps
    settings across commands), oldest first; the temperature from `current_temperature`.
    ``commands``: newest first, as the log lists them; ``latest``: the run's newest training
    step (a metrics point), or None."""
    config = run.get("config") or {}
    out = {name: _setting(config.get(key), default) for name, (key, _, default) in SETTINGS.items()}
    for c in reversed(commands):
        if c.get("type") == "set_mitigation" and c.get("status") == "applied":
            params = c.get("params") or {}
            for name, (_, param, _) in SETTINGS.items():
                out[name] = _setting(params.get(param), out[name])
    out["temperature"] = current_temperature(run, commands, latest)
    return out


def _setting(value: Any, fallback: Any) -> Any:
    """``value`` when it can stand in a form: a finite number for a number, one of AVSPO's
    thresholds for the threshold; else ``fallback``."""
    if isinstance(fallback, str):
        return value if value in AVSPO_THRESHOLDS else fallback
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if number and math.isfinite(value) else fallback


def current_temperature(run: dict, commands: list[dict], latest: dict | None = None) -> float:
    """The run's sampling temperature as far as the server knows: the one the trainer reported
    (its ``temperature`` scalar) at the newest step ``latest``, when that step came after the
    newest applied `set_sampling` (a relaunch may have set another: the form kept offering the
    command's value); else that command's (``commands`` newest first, as the log lists
    them); else the config's ``temperature``; else 1.0 (the trainer's default)."""
    applied = next(
        (c for c in commands if c.get("type") == "set_sampling" and c.get("status") == "applied"),
        None,
    )
    reported = _temperature(((latest or {}).get("scalars") or {}).get("temperature"))
    if reported is not None and (
        applied is None or (applied.get("acked_step") or 0) < (latest or {}).get("step", 0)
    ):
        return reported
    if applied is not None:
        return float(applied["params"]["temperature"])
    return _temperature((run.get("config") or {}).get("temperature")) or 1.0


def _temperature(t: Any) -> float | None:
    ok = isinstance(t, int | float) and not isinstance(t, bool) and 0 < t <= 10
    return float(t) if ok else None


def panel(
    can_control: bool, ended: str | None = None, settings: dict[str, Any] | None = None
) -> html.Div:
    """The command controls. ``ended``: the run's status when it has finished or failed (no
    trainer reads commands then, and the server refuses them); ``settings``: the run's current
    settings (`current_settings`), the starting values of the forms."""
    now = settings or {name: default for name, (_, _, default) in SETTINGS.items()}
    temperature = (settings or {}).get("temperature", 1.0)
    note, why_not = [], None
    if not can_control:
        why_not = "Needs an API key with the control scope."
        text = "Read-only: your key has no control scope, so actions are disabled."
        note = [html.P(text, className="result-error", id="cmd-readonly")]
    elif ended:
        why_not = f"The run has {ended}: no trainer reads its commands."
        text = (
            f"This run has {ended}, so no trainer reads commands and actions are disabled. "
            "Relaunching it (a new attempt of the same run) makes them available again."
        )
        note = [html.P(text, className="muted", id="cmd-ended")]
    return html.Div(
        [
            *note,
            html.Div(
                [
                    _card(
                        "AVSPO",
                        explain.COMMAND_HELP["avspo"],
                        html.Label("trigger", htmlFor="avspo-threshold"),
                        dcc.Dropdown(
                            id="avspo-threshold",
                            options=list(AVSPO_THRESHOLDS),
                            value=now["avspo_threshold"],
                            clearable=False,
                        ),
                        _number(
                            "avspo-alpha",
                            now["avspo_alpha"],
                            0.05,
                            "α",
                            "Virtual samples per collapsed group: K = ⌈G·ACR^α⌉.",
                        ),
                        _button("avspo", why_not),
                    ),
                    _card(
                        "AAPO",
                        explain.COMMAND_HELP["aapo"],
                        _number(
                            "aapo-delta-low",
                            now["aapo_delta_low"],
                            0.01,
                            "δ low",
                            "Margin clip, low.",
                        ),
                        _number(
                            "aapo-delta-high",
                            now["aapo_delta_high"],
                            0.01,
                            "δ high",
                            "Margin clip, high.",
                        ),
                        html.Br(),
                        _button("aapo", why_not),
                    ),
                    _card(
                        "DAPO",
                        explain.COMMAND_HELP["dapo"],
                        _number(
                            "dapo-max-gen-batches",
                            now["dapo_max_gen_batches"],
                            1,
                            "batches",
                            "At most this many generation batches a step to fill the batch "
                            "with groups that are not collapsed.",
                        ),
                        html.Br(),
                        _button("dapo", why_not),
                    ),
                    _card("Plain GRPO", explain.COMMAND_HELP["none"], _button("none", why_not)),
                    _card(
                        "Sampling",
                        explain.COMMAND_HELP["temperature"],
                        _number(
                            "temperature-value",
                            temperature,
                            0.05,
                            "temperature",
                            explain.COMMAND_HELP["temperature"],
                        ),
                        _button("temperature", why_not),
                    ),
                    _card(
                        "Checkpoint and stop",
                        f"{explain.COMMAND_HELP['checkpoint']} {explain.COMMAND_HELP['stop']}",
                        _button("checkpoint", why_not),
                        " ",
                        _button("stop", why_not),
                    ),
                ],
                className="command-panel",
            ),
            html.Div(
                [
                    html.Label("Reason (kept in the log): ", htmlFor="cmd-reason"),
                    dcc.Input(id="cmd-reason", type="text", maxLength=1000, style={"width": "40%"}),
                ],
                style={"marginTop": ".6rem"},
            ),
            html.Div(id="cmd-input-error", className="result-error"),
            html.Div(id="cmd-result", style={"marginTop": ".4rem"}),
        ]
    )
