"""The command a firing rule issues (docs/design.md §6), and whether a run already asks for it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..commands import ENDED_STATES, create_command, mitigation_state
from ..models import Command
from .models import AlertEpisode
from .states import Context, RuleRow, RuleState


def mitigate(
    ctx: Context, rule: RuleRow, st: RuleState, ep: AlertEpisode, step: int | None, why: str
) -> None:
    """Issue the rule's mitigation for a firing episode (docs/design.md §6): when the run's mode is
    auto, at most once per cooldown_steps (counted from the step it was issued or found
    already asked for), and not while the run already asks for it (`in_effect`). Called when
    the alert fires and, until the episode has done so, at each later step whose value meets
    the condition: an alert that fired in `suggest` mode, or within a cooldown, acts once the
    run is switched to `auto` or the cooldown ends. Nothing is
    issued for a run that has finished or failed (`evaluate_locked` gives an ended run's steps
    to no rule; this guards the rest): no trainer reads its commands, and one left `pending`
    would reach a relaunch as if new."""
    if not rule.mitigation or ctx.run.mitigation_mode != "auto" or step is None:
        return
    if ctx.run.status in ENDED_STATES:
        return
    last, cooldown = st.last_mitigation_step, rule.cooldown_steps or 0
    mit = rule.mitigation
    if not (last is None or cooldown == 0 or abs(step - last) >= cooldown):
        return
    # Already asked for: this episode's mitigation is done, so a user who then turns it off by
    # hand is not overruled while the alert keeps firing (the next episode issues it again).
    st.last_mitigation_step = step
    if not in_effect(ctx.session, ctx.run.id, mit):
        create_command(
            ctx.session,
            ctx.run.id,
            mit["type"],
            mit.get("params") or {},
            reason=f"{why}: {rule.metric} = {ep.value:.4g} ({rule.op} {rule.threshold:g})",
            issued_by=f"alert:{rule.name}",
            alert_id=ep.id,
            ttl_s=ctx.settings.command_ttl_s,
        )
        ctx.issued = True


# Command types a rule never repeats while the run's newest one of the type, in these states,
# asks for the same thing (a checkpoint may be wanted at every episode).
_UNREPEATED = {
    "set_mitigation": ("pending", "delivered", "applied"),
    "set_sampling": ("pending", "delivered", "applied"),
    "stop": ("pending", "delivered"),  # an applied stop: the run was relaunched since
}


def in_effect(session: Session, run_id: str, mitigation: dict[str, Any]) -> bool:
    """Whether the run's newest command of the rule's type that is pending, delivered or
    (for settings) applied already asks for ``mitigation`` (every parameter the rule gives):
    issuing it again would only repeat it, each time the alert fires anew."""
    kind, wanted = mitigation.get("type"), mitigation.get("params") or {}
    if kind == "set_mitigation":
        requested = mitigation_state(session, [run_id])[run_id]["requested"]
        return requested is not None and all(requested.get(k) == v for k, v in wanted.items())
    if kind not in _UNREPEATED:
        return False
    newest = session.scalars(
        select(Command.params)
        .where(
            Command.run_id == run_id,
            Command.type == kind,
            Command.status.in_(_UNREPEATED[kind]),
        )
        .order_by(Command.created_at.desc())
        .limit(1)
    ).first()
    return newest is not None and all(newest.get(k) == v for k, v in wanted.items())
