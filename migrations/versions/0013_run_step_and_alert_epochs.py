"""Runs: what ingest knows of their step rows (``newest_steps``, ``has_unevaluated``), and an
``alert_epoch`` that triggers move on whenever a rule that may apply to the run, or one of its
alert states, changes.

Each ingest batch read its steps' rows and the run's unevaluated ones, and the run's rules and
alert states, under the run's lock: two queries, which for a batch of new steps on a run with
nothing left unevaluated read nothing new. With these columns, read with the run under its lock,
a batch of steps the run has no row for skips the first (`vantage.server.ingest.steps`),
and a process that has evaluated the run at its epoch skips the second
(`vantage.server.alerts.states.ALERT_CONFIG`).

- ``newest_steps``: per split, the highest step that has a row; existing runs get theirs here.
  NULL means not known (a run made without the API): every batch then reads.
- ``has_unevaluated``: true until ingest has seen that the run has no unevaluated step row.
- ``alert_epoch``: the triggers count each change; on SQLite they are triggers too. A migration
  that rebuilds ``alert_rules`` or ``alert_states`` on SQLite (``batch_alter_table``) must
  create their triggers again.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05 22:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BUMP = "UPDATE runs SET alert_epoch = alert_epoch + 1"


def _rule_runs(row: str) -> str:
    """The runs a rule applies to, as `vantage.server.alerts.states` selects its rules: its run's,
    or with no run every run of its project, or every run."""
    return (
        f"({row}.run_id IS NOT NULL AND id = {row}.run_id) OR ({row}.run_id IS NULL "
        f"AND ({row}.project IS NULL OR project = {row}.project))"
    )


PG_FUNCTIONS = (
    f"""
CREATE FUNCTION alert_states_epoch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        {BUMP} WHERE id = OLD.run_id;
    END IF;
    IF TG_OP = 'INSERT' OR NEW.run_id IS DISTINCT FROM OLD.run_id THEN
        {BUMP} WHERE id = NEW.run_id;
    END IF;
    RETURN NULL;
END
$$
""",
    f"""
CREATE FUNCTION alert_rules_epoch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        {BUMP} WHERE {_rule_runs("OLD")};
    END IF;
    IF TG_OP <> 'DELETE' THEN
        {BUMP} WHERE {_rule_runs("NEW")};
    END IF;
    RETURN NULL;
END
$$
""",
)
PG_TRIGGERS = tuple(
    f"CREATE TRIGGER {table}_epoch AFTER INSERT OR UPDATE OR DELETE ON {table} "
    f"FOR EACH ROW EXECUTE FUNCTION {table}_epoch()"
    for table in ("alert_states", "alert_rules")
)
SQLITE_TRIGGERS = {
    "alert_states_epoch_insert": ("INSERT", "alert_states", "id = NEW.run_id"),
    "alert_states_epoch_update": ("UPDATE", "alert_states", "id IN (OLD.run_id, NEW.run_id)"),
    "alert_states_epoch_delete": ("DELETE", "alert_states", "id = OLD.run_id"),
    "alert_rules_epoch_insert": ("INSERT", "alert_rules", _rule_runs("NEW")),
    "alert_rules_epoch_update": (
        "UPDATE",
        "alert_rules",
        f"{_rule_runs('OLD')} OR {_rule_runs('NEW')}",
    ),
    "alert_rules_epoch_delete": ("DELETE", "alert_rules", _rule_runs("OLD")),
}


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("newest_steps", sa.JSON(), nullable=True))
        batch.add_column(
            sa.Column("has_unevaluated", sa.Boolean(), nullable=False, server_default=sa.true())
        )
        batch.add_column(
            sa.Column("alert_epoch", sa.BigInteger(), nullable=False, server_default="0")
        )
    _fill_newest_steps()
    if op.get_bind().dialect.name == "postgresql":
        for statement in (*PG_FUNCTIONS, *PG_TRIGGERS):
            op.execute(statement)
    else:
        for name, (event, table, where) in SQLITE_TRIGGERS.items():
            op.execute(
                f"CREATE TRIGGER {name} AFTER {event} ON {table} BEGIN {BUMP} WHERE {where}; END"
            )


def _fill_newest_steps() -> None:
    bind = op.get_bind()
    newest: dict[str, dict[str, int]] = {}
    read = sa.text("SELECT run_id, split, max(step) FROM steps GROUP BY run_id, split")
    for run_id, split, step in bind.execute(read):
        newest.setdefault(run_id, {})[split] = step
    runs = sa.table("runs", sa.column("id"), sa.column("newest_steps", sa.JSON()))
    bind.execute(runs.update().values(newest_steps={}))
    for run_id, steps in newest.items():
        bind.execute(runs.update().where(runs.c.id == run_id).values(newest_steps=steps))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in ("alert_states", "alert_rules"):
            op.execute(f"DROP TRIGGER {table}_epoch ON {table}")
            op.execute(f"DROP FUNCTION {table}_epoch()")
    else:
        for name in SQLITE_TRIGGERS:
            op.execute(f"DROP TRIGGER {name}")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("alert_epoch")
        batch.drop_column("has_unevaluated")
        batch.drop_column("newest_steps")
