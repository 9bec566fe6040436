"""Training-health detectors (docs/detectors.md): the rule fields they need, their state, the
step metrics they watch, the six built-in detector rules, and `acr_stall` on the ACR a run
trains on.

- ``alert_rules``: ``comparison`` (absolute, zscore, relative), ``baseline_steps``,
  ``warmup_steps``, ``alert_cooldown_steps``, ``recommended_action``, ``suggested_command``.
  Their defaults leave every existing rule as it was.
- ``alert_states``: ``last_fired_step`` (for the cooldown). A detector's baseline is kept with
  the run's evaluation progress (``runs.eval_progress``), which every batch writes anyway.
- ``steps``: ``n_out_of_range``, ``reward_std``, ``reward_bimodality`` (older steps: 0, null).
- The built-in rules `entropy_collapse`, `kl_spike`, `grad_norm_spike`, `loss_non_finite`,
  `reward_variance_spike` and `reward_out_of_range` (skipped where a rule of every run already
  has the name). None issues a command: each suggests one.
- `acr_stall`, while it is still the built-in default (`acr > 0.35` for 51 steps), watches
  `acr_trained`: the effective ACR when the trainer reports it, else the raw ACR. Under a
  mitigation that keeps the effective ACR at 0 (AVSPO, DAPO) the run trains on every group
  and has not stalled; the raw ACR stays on the dashboard and in `vantage diagnose`.

Columns are added (SQLite: ALTER TABLE ADD COLUMN, no table rebuild, so migration 0013's
triggers stay); the downgrade drops them with ALTER TABLE DROP COLUMN for the same reason.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07 21:10:00
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _columns() -> dict[str, tuple[sa.Column, ...]]:
    """The columns added, by table (made afresh: a Column belongs to one table)."""
    return {
        "alert_rules": _rule_columns(),
        "alert_states": (sa.Column("last_fired_step", sa.BigInteger(), nullable=True),),
        "steps": (
            sa.Column("n_out_of_range", sa.Integer(), nullable=False, server_default="0"),
            sa.Column("reward_std", sa.Float(), nullable=True),
            sa.Column("reward_bimodality", sa.Float(), nullable=True),
        ),
    }


def _rule_columns() -> tuple[sa.Column, ...]:
    return (
        sa.Column("comparison", sa.String(16), nullable=False, server_default="absolute"),
        sa.Column("baseline_steps", sa.Integer(), nullable=False, server_default="20"),
        sa.Column("warmup_steps", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("alert_cooldown_steps", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("recommended_action", sa.Text(), nullable=True),
        sa.Column("suggested_command", sa.JSON(), nullable=True),
    )


# The built-in detectors; docs/detectors.md gives the reason for every default.
DETECTORS = [
    {
        "name": "entropy_collapse",
        "metric": "scalars.entropy",
        "comparison": "relative",
        "op": "<",
        "threshold": 0.4,
        "clear_threshold": 0.6,
        "for_steps": 5,
        "baseline_steps": 20,
        "warmup_steps": 20,
        "alert_cooldown_steps": 50,
        "min_valid_groups": 0,
        "severity": "warning",
        "description": "Policy entropy below 0.4 x its mean over the run's first 20 steps, "
        "for 5 steps",
        "recommended_action": "Entropy collapsed: raise the sampling temperature (suggested: "
        "set_sampling temperature 1.2) or the entropy bonus, or lower the learning rate",
        "suggested_command": {"type": "set_sampling", "params": {"temperature": 1.2}},
    },
    {
        "name": "kl_spike",
        "metric": "scalars.kl",
        "comparison": "zscore",
        "op": ">",
        "threshold": 6.0,
        "clear_threshold": 3.0,
        "for_steps": 1,
        "baseline_steps": 50,
        "warmup_steps": 20,
        "alert_cooldown_steps": 20,
        "min_valid_groups": 0,
        "severity": "warning",
        "description": "KL to the reference over 6 standard deviations above its last 50 steps",
        "recommended_action": "KL jumped: check the learning rate and the KL coefficient; if it "
        "keeps rising, roll back to the last checkpoint",
        "suggested_command": None,
    },
    {
        "name": "grad_norm_spike",
        "metric": "scalars.grad_norm",
        "comparison": "zscore",
        "op": ">",
        "threshold": 6.0,
        "clear_threshold": 3.0,
        "for_steps": 1,
        "baseline_steps": 50,
        "warmup_steps": 20,
        "alert_cooldown_steps": 20,
        "min_valid_groups": 0,
        "severity": "warning",
        "description": "Gradient norm over 6 standard deviations above its last 50 steps",
        "recommended_action": "Gradient norm spiked: save a checkpoint now (suggested: "
        "checkpoint), then lower the learning rate or clip gradients harder",
        "suggested_command": {"type": "checkpoint", "params": {}},
    },
    {
        "name": "loss_non_finite",
        "metric": "non_finite_loss",
        "comparison": "absolute",
        "op": ">",
        "threshold": 0.0,
        "clear_threshold": None,
        "for_steps": 1,
        "baseline_steps": 20,
        "warmup_steps": 0,
        "alert_cooldown_steps": 0,
        "min_valid_groups": 0,
        "severity": "critical",
        "description": "The step's loss or grad_norm is NaN or infinite",
        "recommended_action": "Loss or gradient norm is not finite: stop the run (suggested: "
        "stop) and resume from the last finite checkpoint with a lower learning rate",
        "suggested_command": {"type": "stop", "params": {}},
    },
    {
        "name": "reward_variance_spike",
        "metric": "reward_spread",
        "comparison": "zscore",
        "op": ">",
        "threshold": 6.0,
        "clear_threshold": 3.0,
        "for_steps": 2,
        "baseline_steps": 50,
        "warmup_steps": 20,
        "alert_cooldown_steps": 20,
        "min_valid_groups": 1,
        "severity": "warning",
        "description": "The rewards' spread across completions, or their bimodality, over 6 "
        "standard deviations above its last 50 steps, for 2 steps",
        "recommended_action": "Rewards spread out or split in two clusters: read completions "
        "from both ends; a reward exploit or a broken reward component is likely",
        "suggested_command": None,
    },
    {
        "name": "reward_out_of_range",
        "metric": "n_out_of_range",
        "comparison": "absolute",
        "op": ">",
        "threshold": 0.0,
        "clear_threshold": None,
        "for_steps": 1,
        "baseline_steps": 20,
        "warmup_steps": 0,
        "alert_cooldown_steps": 100,
        "min_valid_groups": 0,
        "severity": "warning",
        "description": "Rewards outside the run's [reward_min, reward_max]",
        "recommended_action": "Rewards lie outside the run's bounds [{reward_min}, "
        "{reward_max}]: create the run with your reward's range (Monitor(reward_min=..., "
        "reward_max=...) or reward_min/reward_max in POST /api/v1/runs), or clip the reward",
        "suggested_command": None,
    },
]
NAMES = [d["name"] for d in DETECTORS]

ACR_STALL = {
    "old": ("acr", "ACR above 0.35 for more than 50 steps: the run has stalled", None),
    "new": (
        "acr_trained",
        "ACR the run trains on (effective ACR when the trainer reports it after mitigation, "
        "else raw ACR) above 0.35 for more than 50 steps: the run has stalled",
        "The run has stalled: turn on AVSPO or DAPO, or make the prompts harder (all-pass) or "
        "easier (all-fail); `vantage diagnose RUN` shows which side",
    ),
}

RULES = sa.table(
    "alert_rules",
    sa.column("name", sa.String),
    sa.column("run_id", sa.String),
    sa.column("project", sa.String),
    sa.column("metric", sa.String),
    sa.column("op", sa.String),
    sa.column("threshold", sa.Float),
    sa.column("for_steps", sa.Integer),
    sa.column("clear_threshold", sa.Float),
    sa.column("clear_steps", sa.Integer),
    sa.column("min_valid_groups", sa.Integer),
    sa.column("severity", sa.String),
    sa.column("notify", sa.JSON),
    sa.column("cooldown_steps", sa.Integer),
    sa.column("split", sa.String),
    sa.column("enabled", sa.Boolean),
    sa.column("builtin", sa.Boolean),
    sa.column("description", sa.Text),
    sa.column("comparison", sa.String),
    sa.column("baseline_steps", sa.Integer),
    sa.column("warmup_steps", sa.Integer),
    sa.column("alert_cooldown_steps", sa.Integer),
    sa.column("recommended_action", sa.Text),
    sa.column("suggested_command", sa.JSON),
    sa.column("created_at", sa.DateTime(timezone=True)),
    sa.column("updated_at", sa.DateTime(timezone=True)),
)


def upgrade() -> None:
    for table, columns in _columns().items():
        for column in columns:
            op.add_column(table, column)
    _add_detectors()
    _set_acr_stall(ACR_STALL["old"], ACR_STALL["new"])


def _add_detectors() -> None:
    bind = op.get_bind()
    taken = set(
        bind.execute(
            sa.select(RULES.c.name).where(
                RULES.c.name.in_(NAMES), RULES.c.run_id.is_(None), RULES.c.project.is_(None)
            )
        ).scalars()
    )
    now = datetime.now(UTC)
    rows = [
        {
            **d,
            "clear_steps": 1,
            "notify": [],
            "cooldown_steps": 0,
            "split": "train",
            "enabled": True,
            "builtin": True,
            "created_at": now,
            "updated_at": now,
        }
        for d in DETECTORS
        if d["name"] not in taken
    ]
    if rows:
        op.bulk_insert(RULES, rows)


def _set_acr_stall(old: tuple, new: tuple) -> None:
    """Only the built-in rule still at its default condition: an edited one is the user's."""
    op.execute(
        RULES.update()
        .where(
            RULES.c.name == "acr_stall",
            RULES.c.builtin.is_(True),
            RULES.c.metric == old[0],
            RULES.c.op == ">",
            RULES.c.threshold == 0.35,
            RULES.c.for_steps == 51,
        )
        .values(
            metric=new[0],
            description=new[1],
            recommended_action=new[2],
            updated_at=datetime.now(UTC),
        )
    )


def downgrade() -> None:
    _set_acr_stall(ACR_STALL["new"], ACR_STALL["old"])
    op.execute(RULES.delete().where(RULES.c.name.in_(NAMES), RULES.c.builtin.is_(True)))
    for table, columns in reversed(_columns().items()):
        for column in columns:
            op.execute(f"ALTER TABLE {table} DROP COLUMN {column.name}")
