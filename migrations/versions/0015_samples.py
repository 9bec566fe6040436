"""Completion samples: what the model answered for a prompt (``Monitor.log_samples``,
``POST /api/v1/runs/{run_id}/samples``), kept for the server's retention settings.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 21:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "samples",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("split", sa.String(length=64), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("prompt_id", sa.String(length=128), nullable=True),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("completions", sa.JSON(), nullable=False),
        sa.Column("rewards", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_samples_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_samples")),
        sa.UniqueConstraint(
            "run_id",
            "step",
            "split",
            "rank",
            "attempt",
            "seq",
            name=op.f("uq_samples_run_id_step_split_rank_attempt_seq"),
        ),
    )
    op.create_index("ix_samples_run_prompt_step", "samples", ["run_id", "prompt_id", "step"])
    op.create_index("ix_samples_created_at", "samples", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_samples_created_at", table_name="samples")
    op.drop_index("ix_samples_run_prompt_step", table_name="samples")
    op.drop_table("samples")
