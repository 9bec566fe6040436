"""A run's health verdict in one word, from documented rules (docs/design.md §9, "Health").

Pure: the inputs are values the caller read (`vantage.server.run_health` reads them for the API
and the dashboard); nothing here touches the database. The first rule that holds gives the
verdict:

| verdict | rule |
|---|---|
| `failed` | the run ended failed |
| `finished` | the run ended finished |
| `critical` | an alert of severity `critical` fires (it wins over everything a running run shows) |
| `stale` | no heartbeat or data for 3 × the run's `heartbeat_s` |
| `stalled` | `acr_stall` fires, unless the effective ACR is at or below 0.35 |
| `collapsing` | the latest ACR is above 0.35, and its step's effective ACR is not at or below |
| `mitigated` | the latest ACR is above 0.35, its step's effective ACR at or below (a mitigation) |
| `warning` | another alert fires (warning or info severity) |
| `starting` | no step with an ACR yet |
| `healthy` | otherwise |

0.35 is the ACR above which GRPO runs were seen to stall (docs/design.md §1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

COLLAPSE_THRESHOLD = 0.35
STALL_RULE = "acr_stall"

# The verdicts in the order the rules are tried (the first that holds wins).
PRECEDENCE = (
    "failed",
    "finished",
    "critical",
    "stale",
    "stalled",
    "collapsing",
    "mitigated",
    "warning",
    "starting",
    "healthy",
)
# The runs list's "worst first" order: what needs a person first, ended runs last.
WORST_FIRST = (
    "critical",
    "stalled",
    "collapsing",
    "stale",
    "failed",
    "warning",
    "mitigated",
    "starting",
    "healthy",
    "finished",
)
# Whether a verdict asks for attention (the dashboard's colour): bad, warn, ok or none.
LEVEL = {
    "critical": "bad",
    "stalled": "bad",
    "collapsing": "bad",
    "failed": "bad",
    "stale": "warn",
    "warning": "warn",
    "mitigated": "ok",
    "healthy": "ok",
    "starting": "none",
    "finished": "none",
}
MEANING = {
    "failed": "The run ended failed.",
    "finished": "The run ended normally.",
    "critical": "A critical alert fires: act now (its message says what to do).",
    "stale": "No heartbeat or data lately: the trainer may have hung or lost its connection.",
    "stalled": "ACR has stayed above 0.35 for many steps (the stall rule fires) and no "
    "mitigation brings the effective ACR down: most groups teach nothing.",
    "collapsing": "The latest ACR is above 0.35: over a third of the prompt groups got one "
    "reward for every completion and teach nothing.",
    "mitigated": "The raw ACR is high, but a mitigation (AVSPO, AAPO or DAPO) gives those groups "
    "a gradient: the effective ACR is at or below 0.35.",
    "warning": "An alert fires (not about a stall): see the alerts column.",
    "starting": "No training step with a valid group yet.",
    "healthy": "ACR at or below 0.35, no alert firing.",
}


@dataclass(frozen=True)
class HealthInputs:
    """What a verdict is decided from.

    ``status``: running, stale, finished or failed (as the API reports it); ``latest_acr``:
    the raw ACR of the newest step that has one; ``latest_effective``: that step's effective
    ACR (None when the trainer sent none); ``firing``: (rule name, severity) of each firing
    alert of the run."""

    status: str
    latest_acr: float | None = None
    latest_effective: float | None = None
    firing: Sequence[tuple[str, str]] = field(default_factory=tuple)


def _offset(inputs: HealthInputs) -> bool:
    """A mitigation holds the effective ACR at or below the threshold."""
    eff = inputs.latest_effective
    return eff is not None and eff <= COLLAPSE_THRESHOLD


def verdict(inputs: HealthInputs) -> dict[str, str]:
    """``{health, reason}``: the verdict (one of PRECEDENCE) and a sentence saying why, with
    the numbers it was decided from."""
    acr, eff = inputs.latest_acr, inputs.latest_effective
    critical = sorted({rule for rule, severity in inputs.firing if severity == "critical"})
    others = sorted({rule for rule, severity in inputs.firing if severity != "critical"})
    raw = f"raw ACR {acr:.2f}" if acr is not None else "no ACR yet"
    effective = f", effective {eff:.2f}" if eff is not None else ""
    if inputs.status in ("failed", "finished"):
        return {"health": inputs.status, "reason": f"The run {inputs.status}."}
    if critical:
        return {"health": "critical", "reason": f"Critical alert firing: {', '.join(critical)}."}
    if inputs.status == "stale":
        return {"health": "stale", "reason": MEANING["stale"]}
    if STALL_RULE in others and not _offset(inputs):
        return {"health": "stalled", "reason": f"{STALL_RULE} fires ({raw}{effective})."}
    if acr is not None and acr > COLLAPSE_THRESHOLD:
        if _offset(inputs):
            return {
                "health": "mitigated",
                "reason": f"{raw} > {COLLAPSE_THRESHOLD}{effective} after the mitigation.",
            }
        return {"health": "collapsing", "reason": f"{raw}{effective} > {COLLAPSE_THRESHOLD}."}
    if others:
        return {"health": "warning", "reason": f"Alert firing: {', '.join(others)}."}
    if acr is None:
        return {"health": "starting", "reason": MEANING["starting"]}
    return {"health": "healthy", "reason": f"{raw}{effective}, no alert firing."}
