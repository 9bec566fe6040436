"""group blocks: the groups one record stored for a (step, split, rank) become one row of
`group_blocks`, their columns packed (`vantage.server.group_blocks`), instead of a row each in
`groups`. PostgreSQL spent about three times the CPU and wrote seven times the WAL on the rows
and their six-column key. Existing groups are moved over, one block per (run, attempt, step,
split, rank); downgrading unpacks them.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 05:00:00
"""

from collections.abc import Iterator, Sequence
from itertools import groupby

import orjson
import sqlalchemy as sa
from alembic import op
from vantage.server.group_blocks import decode_block, decode_hashes, encode_block

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

HEAD = ("run_key", "attempt", "step", "split", "rank")
DATA = ("group_id", "prompt_id", "cls", "side", "n", "mean", "std", "min", "max", "n_pass")
DATA += ("content_hash",)
PACKED = DATA[2:-1]  # the columns of a block's data
CHUNK = 1000
STREAM = {"stream_results": True, "yield_per": CHUNK}


def _head_columns() -> list[sa.Column]:
    return [
        sa.Column("run_key", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("split", sa.String(length=64), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
    ]


def _chunks(rows: Iterator[dict]) -> Iterator[list[dict]]:
    chunk = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _blocks(conn: sa.Connection) -> Iterator[dict]:
    order = ", ".join(f'"{c}"' for c in (*HEAD, "group_id"))
    columns = ", ".join(f'"{c}"' for c in (*HEAD, *DATA))
    query = sa.text(f"SELECT {columns} FROM groups ORDER BY {order}")
    result = conn.execute(query, execution_options=STREAM)
    for head, rows in groupby(result, key=lambda r: tuple(r[:5])):
        columns = list(zip(*(r[5:] for r in rows), strict=True))
        yield dict(zip(HEAD, head, strict=True)) | {"block": 0} | encode_block(*columns)


def _groups(conn: sa.Connection) -> Iterator[dict]:
    names = (*HEAD, "n_groups", "group_ids", "prompt_ids", "hashes", "data")
    q = "SELECT " + ", ".join(f'"{c}"' for c in names) + " FROM group_blocks"
    for row in conn.execute(sa.text(q), execution_options=STREAM):
        head, (n, ids, prompts, hashes, data) = row[:5], row[5:]
        block = decode_block(n, data)
        values = {
            "group_id": orjson.loads(ids),
            "prompt_id": orjson.loads(prompts) if prompts is not None else [None] * n,
            "content_hash": decode_hashes(hashes),
            **{c: block.column(c) for c in PACKED},
        }
        for i in range(n):
            yield dict(zip(HEAD, head, strict=True)) | {c: values[c][i] for c in DATA}


def upgrade() -> None:
    blocks = op.create_table(
        "group_blocks",
        *_head_columns(),
        sa.Column("block", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("n_groups", sa.Integer(), nullable=False),
        sa.Column("group_ids", sa.Text(), nullable=False),
        sa.Column("prompt_ids", sa.Text(), nullable=True),
        sa.Column("hashes", sa.LargeBinary(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint(*HEAD, "block", name=op.f("pk_group_blocks")),
    )
    conn = op.get_bind()
    for chunk in _chunks(_blocks(conn)):
        conn.execute(blocks.insert(), chunk)
    op.drop_table("groups")


def downgrade() -> None:
    groups = op.create_table(
        "groups",
        *_head_columns(),
        sa.Column("group_id", sa.String(length=128), nullable=False),
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
        sa.PrimaryKeyConstraint(*HEAD, "group_id", name=op.f("pk_groups")),
    )
    conn = op.get_bind()
    for chunk in _chunks(_groups(conn)):
        conn.execute(groups.insert(), chunk)
    op.drop_table("group_blocks")
