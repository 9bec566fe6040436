"""The rule form: one declarative list of fields (`FIELDS`), each with its input kind, turned
into inputs (`inputs`), filled from a rule (`form_values`) and read back into an API body
(`rule_body`).

A field the server's rules do not have (`vantage.server.alerts.rule_bodies.RULE_FIELDS`) is left
out, so the list may name fields ahead of the server; a field the server has and the list does
not keeps its value on every edit (an edit sends only what changed). Adding a field is one
`Field` line."""

from __future__ import annotations

import json
import math
from typing import Any, Literal, NamedTuple

from dash import dcc, html

Kind = Literal["text", "number", "int", "choice", "lines", "command", "bool"]
COMMAND_TYPES = ("set_mitigation", "set_sampling", "checkpoint", "stop")


class Field(NamedTuple):
    """One input of the form: the rule's field (as the API names it), its label, its kind,
    its help (the input's tooltip) and, for a choice, its options (for text, suggestions)."""

    name: str
    label: str
    kind: Kind
    help: str
    options: tuple[str, ...] = ()


FIELDS: tuple[Field, ...] = (
    Field("name", "Name", "text", "Unique among the rules of the same scope."),
    Field("metric", "Metric", "text", "A step metric (acr, acr_all_fail, reward_mean, …), a "
          "window metric (acr_ema, acr_100, acr_volatility, acr_streak), reward_drop, stale, "
          "or scalars.NAME (a trainer scalar).",
          ("acr", "acr_effective", "acr_all_fail", "acr_all_pass", "acr_constant", "acr_ema",
           "acr_100", "acr_volatility", "acr_streak", "reward_mean", "reward_drop", "n_invalid",
           "stale", "scalars.loss", "scalars.kl", "scalars.entropy", "scalars.grad_norm")),
    Field("op", "Fires when the metric is", "choice", "How the metric is compared with the "
          "threshold.", (">", ">=", "<", "<=")),
    Field("threshold", "Threshold", "number", "The condition is `metric op threshold`."),
    Field("for_steps", "For steps", "int", "Consecutive evaluated steps the condition must "
          "hold before the alert fires (default 1)."),
    Field("clear_threshold", "Clears past", "number", "A firing alert resolves at the first "
          "step strictly past this value (empty: the threshold)."),
    Field("clear_steps", "Clear steps", "int", "Consecutive clear steps needed to resolve "
          "(default 1)."),
    Field("min_valid_groups", "Min valid groups", "int", "A step with fewer valid groups "
          "neither advances nor resets the count (default 1)."),
    Field("comparison", "Comparison", "choice", "absolute: the metric itself; zscore: "
          "standard deviations above its rolling baseline; relative: over its early-run level.",
          ("absolute", "zscore", "relative")),
    Field("baseline_steps", "Baseline steps", "int", "Steps the baseline of a zscore or "
          "relative comparison covers."),
    Field("warmup_steps", "Warmup steps", "int", "A run's first steps with a value, which "
          "feed the baseline and never fire."),
    Field("severity", "Severity", "choice", "Sent with notifications; a firing critical alert "
          "makes the run critical (default warning).",
          ("info", "warning", "critical")),
    Field("project", "Project", "text", "Only this project's runs (empty: every project)."),
    Field("run_id", "Run id", "text", "Only this run (empty: every run)."),
    Field("split", "Split", "text", "The split whose steps are evaluated (default train).",
          ("train", "eval")),
    Field("notify", "Notify", "lines", "One target a line: a webhook URL (Slack's and "
          "Discord's get their format; slack+https://… or discord+https://… chooses it) or an "
          "e-mail address. Told when the alert fires and when it resolves."),
    Field("mitigation", "Mitigation command", "command", "A command issued when the alert "
          "fires (the run's mitigation mode decides: auto sends it, suggest offers it, off "
          "does nothing); its parameters as JSON, e.g. {\"mode\": \"avspo\"}.", COMMAND_TYPES),
    Field("cooldown_steps", "Cooldown steps", "int", "Steps after the rule's command before "
          "it issues another (default 0)."),
    Field("suggested_command", "Suggested command", "command", "A command offered with the "
          "alert, never issued by it; its parameters as JSON.", COMMAND_TYPES),
    Field("alert_cooldown_steps", "Alert cooldown steps", "int", "After an alert fired at step "
          "s, no new one fires before step s + this (default 0)."),
    Field("recommended_action", "Recommended action", "text", "One line told with the alert: "
          "what to do when it fires."),
    Field("description", "Description", "text", "Free text; sent as the recommended action "
          "when the rule has no field of that name."),
    Field("enabled", "Enabled", "bool", "A disabled rule is not evaluated."),
)  # fmt: skip


# the fields a new rule must have, and what each must be
REQUIRED = {"name": "required", "metric": "required", "threshold": "required: a finite number"}


def shown_fields() -> tuple[Field, ...]:
    """The fields of `FIELDS` that the server's rules have."""
    from vantage.server.alerts.rule_bodies import RULE_FIELDS

    return tuple(f for f in FIELDS if f.name in RULE_FIELDS)


def _id(name: str) -> dict[str, str]:
    return {"type": "rule-field", "field": name}


def inputs(fields: tuple[Field, ...], values: dict[str, Any]) -> list[html.Div]:
    """The form's inputs, one labelled box per field (a command: its type and its params),
    holding ``values`` (`form_values`)."""
    boxes = []
    for f in fields:
        label = html.Label(f.label, title=f.help)
        if f.kind == "choice":
            box = [dcc.Dropdown(id=_id(f.name), options=list(f.options), value=values.get(f.name))]
        elif f.kind == "bool":
            yes = [{"label": " yes", "value": "on"}]
            box = [dcc.Checklist(id=_id(f.name), options=yes, value=values.get(f.name))]
        elif f.kind == "lines":
            box = [dcc.Textarea(id=_id(f.name), rows=3, style={"width": "100%"},
                                value=values.get(f.name))]  # fmt: skip
        elif f.kind == "command":
            box = [
                dcc.Dropdown(id=_id(f.name), options=list(f.options), placeholder="none",
                             value=values.get(f.name)),
                dcc.Input(id=_id(f.name + ".params"), type="text", placeholder="{}",
                          style={"width": "100%"}, value=values.get(f.name + ".params")),
            ]  # fmt: skip
        else:
            kind = "number" if f.kind in ("number", "int") else "text"
            extra = {"list": f"rule-options-{f.name}"} if f.options and kind == "text" else {}
            box = [dcc.Input(id=_id(f.name), type=kind, style={"width": "100%"},
                             value=values.get(f.name), **extra)]  # fmt: skip
            if extra:
                box.append(html.Datalist([html.Option(value=o) for o in f.options],
                                         id=extra["list"]))  # fmt: skip
        boxes.append(html.Div([label, *box], className=f"rule-input rule-{f.kind}", title=f.help))
    return boxes


def form_values(fields: tuple[Field, ...], rule: dict | None) -> dict[str, Any]:
    """Each input's value (by its field id, `.params` for a command's) for ``rule``, or for a
    new rule (None: the §6 defaults)."""
    rule = rule or {"op": ">", "for_steps": 1, "severity": "warning", "enabled": True}
    out: dict[str, Any] = {}
    for f in fields:
        value = rule.get(f.name)
        if f.kind == "bool":
            out[f.name] = ["on"] if value else []
        elif f.kind == "lines":
            out[f.name] = "\n".join(value or [])
        elif f.kind == "command":
            out[f.name] = (value or {}).get("type")
            params = (value or {}).get("params")
            out[f.name + ".params"] = json.dumps(params) if params else ""
        else:
            out[f.name] = value
    return out


def rule_body(
    fields: tuple[Field, ...], values: dict[str, Any], original: dict | None
) -> dict[str, Any]:
    """The API body of the form's ``values`` (by field id): for a new rule (``original``
    None) the fields given; for an edit, only those that differ from ``original`` (a cleared
    one as null). Raises ValueError naming, by its label, each field the form cannot read
    (one a line: only the first was said)."""
    body: dict[str, Any] = {}
    errors: list[str] = []
    for f in fields:
        try:
            value = _read(f, values)
        except ValueError as exc:
            errors.append(str(exc))
            continue
        if original is None and f.name in REQUIRED and value is None:
            # a number input holds nothing for one it cannot read (1e400): said here with the
            # rest, not as the API's "threshold: Field required" after them
            errors.append(f"{f.label}: {REQUIRED[f.name]}")
            continue
        if original is None:
            if value is not None and value != []:
                body[f.name] = value
            continue
        before = original.get(f.name)
        if value != (before or [] if f.kind == "lines" else before):
            body[f.name] = value
    if errors:
        raise ValueError("\n".join(errors))
    return body


def api_errors(fields: tuple[Field, ...], detail: Any) -> list[str] | None:
    """A 422's errors (FastAPI's ``detail`` list) as the form says them, each field by its
    label ("Threshold: …", not "threshold: …"); None when ``detail`` is not such a list. A
    number field that is "required" was empty or not a number the browser could hold (1e400
    reached the server as nothing)."""
    if not isinstance(detail, list) or not all(isinstance(e, dict) for e in detail):
        return None
    by_name = {f.name: f for f in fields}
    out = []
    for e in detail:
        loc = [str(p) for p in e.get("loc") or [] if p != "body"]
        f = by_name.get(loc[0]) if loc else None
        msg = str(e.get("msg", "")).removeprefix("Value error, ")
        if f is None:
            out.append(f"{'.'.join(loc)}: {msg}" if loc else msg)
            continue
        if f.kind in ("number", "int") and e.get("type") == "missing":
            msg = "required: a finite number" if f.kind == "number" else "required: a whole number"
        rest = f" {'.'.join(loc[1:])}" if loc[1:] else ""
        out.append(f"{f.label}{rest}: {msg}")
    return out


def _read(f: Field, values: dict[str, Any]) -> Any:
    raw = values.get(f.name)
    if f.kind == "bool":
        return bool(raw) and "on" in raw
    if f.kind == "lines":
        return [line.strip() for line in str(raw or "").splitlines() if line.strip()]
    if f.kind == "command":
        # the parameters are read even without a command: `{not json` beside "none" was
        # dropped without a word
        text = str(values.get(f.name + ".params") or "").strip()
        try:
            params = json.loads(text) if text else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"{f.label}: the parameters are not JSON ({exc.msg})") from None
        if not isinstance(params, dict):
            raise ValueError(f"{f.label}: the parameters must be a JSON object, like {{}}")
        if not raw:
            if params:
                raise ValueError(f"{f.label}: parameters given, but no command chosen")
            return None
        return {"type": raw, "params": params}
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if f.kind in ("number", "int"):
        number = float(raw)
        if not math.isfinite(number):
            raise ValueError(f"{f.label}: must be a finite number")
        if f.kind == "int":
            if not number.is_integer():
                raise ValueError(f"{f.label}: must be a whole number")
            return int(number)
        return number
    return str(raw).strip() if f.kind == "text" else raw
