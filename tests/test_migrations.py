"""Migrations on a database that already holds data: 0003 (lean groups) keeps every group row,
names runs by their new integer key, and downgrades back to the old shape."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from alembic import command
from sqlalchemy import create_engine, text
from vantage.server.db import normalize_url
from vantage.server.migrate import alembic_config

from tests.conftest import new_postgres_database

OLD_GROUP = (
    "INSERT INTO groups (run_id, attempt, step, split, rank, group_id, prompt_id, cls, side, n, "
    "mean, std, min, max, n_pass, content_hash) VALUES (:run, 1, :step, 'train', 0, :gid, 'p', "
    "2, 'all_pass', 4, 1.0, 0.0, 1.0, 1.0, 4, :h)"
)
OLD_RUN = (
    "INSERT INTO runs (id, name, tags, reward_min, reward_max, trainer_eps, world_size, "
    "heartbeat_s, mitigation_mode, status, attempt, created_at, last_seen_at, client_health) "
    "VALUES (:id, :id, '[]', 0, 1, 0.0001, 1, 10, 'auto', 'running', 1, :at, :at, '{}')"
)


@pytest.fixture(params=["sqlite", "postgres"])
def empty_database(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:  # noqa: ANN001
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'migrate.db'}"
        return
    request.getfixturevalue("postgres_url")  # skips (or fails in CI) without PostgreSQL
    url, drop = new_postgres_database()
    try:
        yield url
    finally:
        drop()


def test_lean_groups_migration_keeps_data(empty_database: str) -> None:
    cfg = alembic_config(empty_database)
    command.upgrade(cfg, "0002")
    engine = create_engine(normalize_url(empty_database))
    with engine.begin() as conn:
        for i, run in enumerate(("run-b", "run-a")):
            conn.execute(text(OLD_RUN), {"id": run, "at": f"2026-01-0{i + 1} 00:00:00+00:00"})
            conn.execute(
                text("INSERT INTO launches (run_id, attempt, created_at) VALUES (:r, 1, :at)"),
                {"r": run, "at": "2026-01-01 00:00:00+00:00"},
            )
            for step in range(3):
                conn.execute(text(OLD_GROUP), {"run": run, "step": step, "gid": "g0", "h": step})
    command.upgrade(cfg, "head")
    with engine.connect() as conn:
        keys = dict(conn.execute(text('SELECT id, "key" FROM runs')).all())
        assert keys == {"run-b": 1, "run-a": 2}  # in creation order
        # rebuilding `runs` (SQLite batch mode) must not cascade into the tables that refer to it
        assert conn.execute(text("SELECT count(*) FROM launches")).scalar() == 2
        rows = conn.execute(
            text("SELECT run_key, step, content_hash FROM groups ORDER BY run_key, step")
        ).all()
        assert [tuple(r) for r in rows] == [(k, s, s) for k in (1, 2) for s in range(3)]
    command.downgrade(cfg, "0002")
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT run_id, step FROM groups ORDER BY run_id, step")).all()
        assert [tuple(r) for r in rows] == [(r, s) for r in ("run-a", "run-b") for s in range(3)]
    command.upgrade(cfg, "head")
    engine.dispose()
