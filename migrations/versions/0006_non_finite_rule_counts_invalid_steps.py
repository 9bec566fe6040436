"""non_finite_rewards evaluates every step: the built-in rule gets min_valid_groups 0.

With the default of 1, a step whose groups are all non-finite (n_valid 0) neither advanced nor
reset the rule (docs/design.md §6), so a run whose rewards were all broken never raised it. Only the
built-in rule still at that default is changed; an edited one keeps its value.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 06:45:00
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RULES = sa.table(
    "alert_rules",
    sa.column("name", sa.String),
    sa.column("builtin", sa.Boolean),
    sa.column("min_valid_groups", sa.Integer),
    sa.column("updated_at", sa.DateTime(timezone=True)),
)


def _set_min_valid_groups(old: int, new: int) -> None:
    op.execute(
        RULES.update()
        .where(
            RULES.c.name == "non_finite_rewards",
            RULES.c.builtin.is_(True),
            RULES.c.min_valid_groups == old,
        )
        .values(min_valid_groups=new, updated_at=datetime.now(UTC))
    )


def upgrade() -> None:
    _set_min_valid_groups(1, 0)


def downgrade() -> None:
    _set_min_valid_groups(0, 1)
