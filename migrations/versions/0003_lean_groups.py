"""lean groups: runs get a small integer `key`; `groups` is keyed by (run_key, attempt, step,
split, rank, group_id) with no surrogate id and no foreign key, which makes ingest about twice
as fast into PostgreSQL (benchmarks/ingest.py). Existing rows are copied over. Alert evaluation
keeps its progress per run (`runs.eval_progress`) instead of per (rule, run), so a quiet step
writes no alert state.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 20:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DATA_COLUMNS = (
    "attempt, step, split, rank, group_id, prompt_id, cls, side, n, mean, std, min, max, "
    "n_pass, content_hash"
)


def _data_columns() -> list[sa.Column]:
    return [
        sa.Column("prompt_id", sa.String(length=128), nullable=True),
        sa.Column("cls", sa.SmallInteger(), nullable=False),
        sa.Column("side", sa.String(length=16), nullable=True),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("mean", sa.Float(), nullable=True),
        sa.Column("std", sa.Float(), nullable=True),
        sa.Column("min", sa.Float(), nullable=True),
        sa.Column("max", sa.Float(), nullable=True),
        sa.Column("n_pass", sa.Integer(), nullable=True),
        sa.Column("content_hash", sa.BigInteger(), nullable=False),
    ]


def _key_columns() -> list[sa.Column]:
    return [
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("split", sa.String(length=64), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("group_id", sa.String(length=128), nullable=False),
    ]


def _set_aside_old_groups() -> None:
    """Rename `groups` out of the way; on PostgreSQL its constraint names are schema-wide."""
    op.rename_table("groups", "groups_old")
    if op.get_bind().dialect.name == "postgresql":
        for name in ("pk_groups", "uq_groups_run_id_attempt_step_split_rank_group_id"):
            op.execute(f"ALTER TABLE groups_old RENAME CONSTRAINT {name} TO {name}_old")
        op.execute("ALTER TABLE groups_old DROP CONSTRAINT IF EXISTS fk_groups_run_id_runs")


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch_op:
        batch_op.add_column(sa.Column("key", sa.Integer(), nullable=True))
    op.execute(
        "UPDATE runs SET key = (SELECT count(*) FROM runs r2 WHERE r2.created_at < runs.created_at "
        "OR (r2.created_at = runs.created_at AND r2.id <= runs.id))"
    )
    with op.batch_alter_table("runs") as batch_op:
        batch_op.alter_column("key", existing_type=sa.Integer(), nullable=False)
        batch_op.create_index("ix_runs_key", ["key"], unique=True)
        batch_op.add_column(sa.Column("eval_progress", sa.JSON(), nullable=True))
    with op.batch_alter_table("alert_states") as batch_op:
        batch_op.drop_column("last_step")
        batch_op.drop_column("last_attempt")

    _set_aside_old_groups()
    op.create_table(
        "groups",
        sa.Column("run_key", sa.Integer(), autoincrement=False, nullable=False),
        *_key_columns(),
        *_data_columns(),
        sa.PrimaryKeyConstraint(
            "run_key", "attempt", "step", "split", "rank", "group_id", name=op.f("pk_groups")
        ),
    )
    op.execute(
        f"INSERT INTO groups (run_key, {DATA_COLUMNS}) "
        f"SELECT r.key, {', '.join('g.' + c for c in DATA_COLUMNS.split(', '))} "
        "FROM groups_old g JOIN runs r ON r.id = g.run_id"
    )
    op.drop_table("groups_old")


def downgrade() -> None:
    op.rename_table("groups", "groups_old")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE groups_old RENAME CONSTRAINT pk_groups TO pk_groups_old")
    op.create_table(
        "groups",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        *_key_columns(),
        *_data_columns(),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_groups_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_groups")),
        sa.UniqueConstraint(
            "run_id",
            "attempt",
            "step",
            "split",
            "rank",
            "group_id",
            name=op.f("uq_groups_run_id_attempt_step_split_rank_group_id"),
        ),
    )
    op.execute(
        f"INSERT INTO groups (run_id, {DATA_COLUMNS}) "
        f"SELECT r.id, {', '.join('g.' + c for c in DATA_COLUMNS.split(', '))} "
        "FROM groups_old g JOIN runs r ON r.key = g.run_key"
    )
    op.drop_table("groups_old")
    with op.batch_alter_table("alert_states") as batch_op:
        batch_op.add_column(sa.Column("last_step", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("last_attempt", sa.Integer(), nullable=True))
    with op.batch_alter_table("runs") as batch_op:
        batch_op.drop_index("ix_runs_key")
        batch_op.drop_column("key")
        batch_op.drop_column("eval_progress")
