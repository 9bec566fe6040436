"""`vantage diagnose RUN`: a run's health report from stored data (`vantage.server.diagnose`),
as text or, with ``--format json``, as one JSON document for scripts."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..preflight import open_session
from .arguments import uses_database


def register(sub: argparse._SubParsersAction) -> None:
    """Add `diagnose` to the `vantage` parser."""
    p = sub.add_parser(
        "diagnose",
        help="a run's health report: detector verdicts, ACR and waste, commands, next actions",
        description="Read a run's stored steps, alerts and commands and print its health "
        "report: each rule's verdict with the steps it would fire, the ACR summary and the "
        "wasted share of rollouts, the commands applied and what changed after them, and "
        "the recommended next actions.",
    )
    p.add_argument(
        "run_id",
        metavar="RUN",
        help="the run's id (GET /api/v1/runs lists them) or its start, 8 characters or more, "
        "when no other run's id starts so (the short id the dashboard shows)",
    )
    p.add_argument(
        "--split",
        default="train",
        help="the split to read (default: train); one the run has no steps in is refused, "
        "naming those it has",
    )
    p.add_argument("--format", choices=("text", "json"), default="text")
    uses_database(p)
    p.set_defaults(func=cmd_diagnose)


def cmd_diagnose(args: argparse.Namespace) -> int:
    """Print the report; exit 1 naming the run when there is none (with ``--format json``,
    as ``{"error": ...}`` on stdout, so that a script reads JSON either way)."""
    from ..diagnose import RunNotFound, diagnose

    with open_session(args) as session:
        try:
            report = diagnose(session, args.run_id, args.split)
        except RunNotFound as exc:
            if args.format == "json":
                print(json.dumps({"error": str(exc)}))
            else:
                print(f"error: {exc}", file=sys.stderr)
            return 1
    if args.format == "json":
        print(json.dumps(report, indent=2, allow_nan=False))
    else:
        print(render(report))
    return 0


def render(report: dict[str, Any]) -> str:
    """The report as text: one section each, a line per rule, command and action."""
    run, acr = report["run"], report["acr"]
    lines = [
        f"Run {run['name']} ({run['run_id']}): {run['status']}, {run['steps']} steps, last step "
        f"{run['last_step']}, rewards in [{run['reward_min']:g}, {run['reward_max']:g}], "
        f"mitigation mode {run['mitigation_mode']}",
        "",
        "ACR",
        f"  pooled {_num(acr['acr_pooled'])}, latest {_num(acr['acr_latest'])}, effective "
        f"latest {_num(acr['acr_effective_latest'])} (mean {_num(acr['acr_effective_mean'])})",
        "  collapsed sides: " + ", ".join(f"{k} {_num(v)}" for k, v in acr["sides"].items()),
        f"  wasted rollouts {acr['wasted_rollouts']} of {acr['completions']} completions "
        f"({_pct(acr['wasted_share'])}); {acr['steps_above_stall']} steps above ACR 0.35",
        "",
        "Rules (would fire at)",
    ]
    for v in report["rules"]:
        steps = ", ".join(map(str, v["fires_at"][:10])) or "-"
        more = f" (+{len(v['fires_at']) - 10} more)" if len(v["fires_at"]) > 10 else ""
        lines.append(
            f"  {v['verdict']:<15} {v['rule']:<22} {v['metric']} {v['condition']}"
            f" [{v['comparison']}]: {steps}{more}"
        )
    lines += ["", "Commands applied"]
    if not report["commands"]:
        lines.append("  none")
    for c in report["commands"]:
        b, a = c["before"], c["after"]
        lines.append(
            f"  step {c['step']}: {c['type']} {json.dumps(c['params'])} by {c['issued_by']}: "
            f"ACR {_num(b['acr'])} -> {_num(a['acr'])}, effective {_num(b['acr_effective'])} "
            f"-> {_num(a['acr_effective'])}, reward {_num(b['reward_mean'])} -> "
            f"{_num(a['reward_mean'])}"
        )
    lines += ["", "Next actions"]
    lines += [f"  - {action}" for action in report["next_actions"]]
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"
