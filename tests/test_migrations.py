"""Migrations on a database that already holds data: 0003 (lean groups) keeps every group row and
names runs by their new integer key; 0005 (group blocks) packs the groups of each (step, split,
rank) into a block that ingest and the prompts view read as before; 0006 changes one built-in
rule; 0007 stops SQLite reusing the ids of deleted rules, alerts and silences; 0008 adds when
each launch began; 0009 widens a command's issued_by; 0010 has PostgreSQL compress group blocks
with lz4; 0011 records the step of a run's latest ACR; 0012 packs the ACR series on PostgreSQL;
0013 records each run's newest steps and adds the triggers that move its alert epoch;
0014 adds the detector rules, their fields and step metrics, and moves a default acr_stall.
All downgrade back; the newest builds the schema the models describe."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import orjson
import pytest
from alembic import command
from sqlalchemy import create_engine, text
from vantage.server.db import normalize_url
from vantage.server.migrate import alembic_config

from tests.helpers.postgres import new_postgres_database

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
    command.upgrade(cfg, "0004")
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


KEYED_RUN = OLD_RUN.replace("INSERT INTO runs (id,", 'INSERT INTO runs ("key", id,').replace(
    "VALUES (:id,", "VALUES (1, :id,"
)
LEAN_GROUP = (
    "INSERT INTO groups (run_key, attempt, step, split, rank, group_id, prompt_id, cls, side, n, "
    "mean, std, min, max, n_pass, content_hash) VALUES (1, 1, :step, 'train', :rank, :gid, "
    ":prompt, :cls, :side, 4, :mean, :std, :mean, :max, :n_pass, :h)"
)
STEP_ROW = (
    "INSERT INTO steps (run_id, split, step, attempt, first_seen_at, updated_at, world_size, "
    "ranks, acc, effective_by_rank, scalars, n_groups, n_valid, n_collapsed, n_near_collapsed, "
    "n_invalid, n_degenerate, wasted_rollouts, evaluated) VALUES ('run-a', 'train', :step, 1, "
    "'2026-01-01', '2026-01-01', 1, '[0, 1]', '{}', '{}', '{}', 0, 0, 0, 0, 0, 0, 0, true)"
)


def _lean_groups() -> list[dict]:
    """Steps 0-1, ranks 0-1: collapsed groups of prompt p (all pass), live ones of prompt q,
    an invalid one with nulls, in an order that is not the key's."""
    rows = []
    for step in (1, 0):
        for rank in (1, 0):
            for gid, prompt, cls, side, mean, std, mx, n_pass in (
                ("g1", "q", 4, None, 0.5, 0.5, 1.0, 2),
                ("g0", "p", 2, "all_pass", 1.0, 0.0, 1.0, 4),
                ("g2", None, 0, None, None, None, None, None),
            ):
                h = 100 * step + 10 * rank + int(gid[1]) - 2**63  # signed 64-bit
                rows.append(
                    {"step": step, "rank": rank, "gid": gid, "prompt": prompt, "cls": cls}
                    | {"side": side, "mean": mean, "std": std, "max": mx, "n_pass": n_pass, "h": h}
                )
    return rows


def test_group_blocks_migration_packs_and_unpacks_groups(empty_database: str) -> None:
    from sqlalchemy.orm import Session
    from vantage.server.queries import run_prompts

    cfg = alembic_config(empty_database)
    command.upgrade(cfg, "0004")
    engine = create_engine(normalize_url(empty_database))
    rows = _lean_groups()
    with engine.begin() as conn:
        conn.execute(text(KEYED_RUN), {"id": "run-a", "at": "2026-01-01 00:00:00+00:00"})
        conn.execute(text(STEP_ROW), [{"step": 0}, {"step": 1}])
        conn.execute(text(LEAN_GROUP), rows)
    command.upgrade(cfg, "head")
    with engine.connect() as conn:
        blocks = conn.execute(text("SELECT step, rank, block, n_groups FROM group_blocks")).all()
        assert sorted(tuple(b) for b in blocks) == [(s, r, 0, 3) for s in (0, 1) for r in (0, 1)]
    with Session(engine) as session:
        prompts = {p["prompt_id"]: p for p in run_prompts(session, "run-a")}
    assert prompts["p"]["all_pass"] == 4 and prompts["p"]["steps"] == 2
    assert prompts["q"]["collapsed"] == 0 and prompts["q"]["groups"] == 4
    command.downgrade(cfg, "0004")
    columns = "step, rank, group_id, prompt_id, cls, side, mean, std, max, n_pass, content_hash"
    with engine.connect() as conn:
        back = conn.execute(text(f"SELECT {columns} FROM groups")).all()
    keys = ("step", "rank", "gid", "prompt", "cls", "side", "mean", "std", "max", "n_pass", "h")
    assert sorted(tuple(b) for b in back) == sorted(tuple(r[k] for k in keys) for r in rows)
    command.upgrade(cfg, "head")
    engine.dispose()


def test_non_finite_rule_migration_changes_only_the_default(empty_database: str) -> None:
    """0006 gives the built-in non_finite_rewards rule min_valid_groups 0 when it still has the
    default 1, keeps a value a user set, and downgrades back."""
    cfg = alembic_config(empty_database)
    engine = create_engine(normalize_url(empty_database))
    read = text("SELECT min_valid_groups FROM alert_rules WHERE name = 'non_finite_rewards'")
    command.upgrade(cfg, "0005")
    with engine.connect() as conn:
        assert conn.execute(read).scalar() == 1
    command.upgrade(cfg, "head")
    with engine.connect() as conn:
        assert conn.execute(read).scalar() == 0
    command.downgrade(cfg, "0005")
    with engine.begin() as conn:
        assert conn.execute(read).scalar() == 1
        edit = "UPDATE alert_rules SET min_valid_groups = 3 WHERE name = 'non_finite_rewards'"
        conn.execute(text(edit))
    command.upgrade(cfg, "head")
    with engine.connect() as conn:
        assert conn.execute(read).scalar() == 3
    engine.dispose()


def test_group_blocks_are_compressed_with_lz4_on_postgresql(empty_database: str) -> None:
    """0010 sets lz4 on the packed columns of group blocks (PostgreSQL: "l" in attcompression,
    "" the default pglz), and downgrades back; SQLite has no such setting and is untouched."""
    cfg = alembic_config(empty_database)
    command.upgrade(cfg, "head")
    if not empty_database.startswith("postgresql"):
        command.downgrade(cfg, "0009")
        return
    engine = create_engine(normalize_url(empty_database))
    read = text(
        "SELECT attname, attcompression FROM pg_attribute WHERE attrelid = 'group_blocks'::regclass"
        " AND attname IN ('data', 'hashes', 'group_ids', 'prompt_ids', 'split')"
    )
    with engine.connect() as conn:
        methods = dict(conn.execute(read).all())
    assert methods == {"data": "l", "hashes": "l", "group_ids": "l", "prompt_ids": "l", "split": ""}
    command.downgrade(cfg, "0009")
    with engine.connect() as conn:
        assert set(dict(conn.execute(read).all()).values()) == {""}
    engine.dispose()


def _runs_at(url: str, revision: str, *run_ids: str):  # noqa: ANN202
    """Upgrade an empty database to ``revision`` and add runs (keys 1, 2, ...); returns the
    Alembic config and an engine."""
    cfg = alembic_config(url)
    command.upgrade(cfg, revision)
    engine = create_engine(normalize_url(url))
    with engine.begin() as conn:
        for key, run in enumerate(run_ids, 1):
            keyed = KEYED_RUN.replace("VALUES (1,", f"VALUES ({key},")
            conn.execute(text(keyed), {"id": run, "at": "2026-01-01 00:00:00+00:00"})
    return cfg, engine


def test_the_step_of_a_latest_acr_is_the_runs_last_step(empty_database: str) -> None:
    """0011 gives a run that has a latest ACR its last step as the ACR's step (what ingest
    compared with before), and none to a run without one."""
    cfg, engine = _runs_at(empty_database, "0010", "measured", "unmeasured")
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET last_step = 7"))
        conn.execute(text("UPDATE runs SET latest_acr = 0.5 WHERE id = 'measured'"))
    command.upgrade(cfg, "head")
    read = text("SELECT id, latest_acr_step FROM runs")
    with engine.connect() as conn:
        assert dict(conn.execute(read).all()) == {"measured": 7, "unmeasured": None}
    command.downgrade(cfg, "0010")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM runs")).scalar() == 2
    engine.dispose()


def test_ids_of_deleted_silences_rules_and_alerts_are_never_reused(empty_database: str) -> None:
    """After 0007 a deleted newest row's id is not given to the next row (SQLite reused it);
    rows and indexes survive the rebuild, and the downgrade keeps the rows."""
    cfg = alembic_config(empty_database)
    engine = create_engine(normalize_url(empty_database))
    command.upgrade(cfg, "0006")
    add = text("INSERT INTO silences (matchers, until, created_at) VALUES ('{}', :t, :t)")
    at = {"t": "2100-01-01 00:00:00"}
    with engine.begin() as conn:
        conn.execute(add, at)
        conn.execute(add, at)
    command.upgrade(cfg, "head")
    ids = text("SELECT id FROM silences ORDER BY id")
    with engine.begin() as conn:
        assert [r[0] for r in conn.execute(ids)] == [1, 2]
        newest_rule = conn.execute(text("SELECT max(id) FROM alert_rules")).scalar()
        conn.execute(text("DELETE FROM silences WHERE id = 2"))
        conn.execute(text("DELETE FROM alert_rules WHERE id = :id"), {"id": newest_rule})
        conn.execute(add, at)
        assert [r[0] for r in conn.execute(ids)] == [1, 3]
        rule = conn.execute(
            text(
                "INSERT INTO alert_rules (name, metric, op, threshold, for_steps, clear_steps, "
                "min_valid_groups, severity, notify, cooldown_steps, split, enabled, builtin, "
                "created_at, updated_at) VALUES ('r', 'acr', '>', 0.5, 1, 1, 1, 'warning', '[]', "
                "0, 'train', true, false, :t, :t) RETURNING id"
            ),
            at,
        ).scalar()
        assert rule == newest_rule + 1
    if empty_database.startswith("sqlite"):
        with engine.connect() as conn:
            names = {r[0] for r in conn.execute(text("SELECT name FROM sqlite_master"))}
        assert "ix_alert_episodes_run_state" in names and "ix_alert_rules_name" in names
    command.downgrade(cfg, "0006")
    with engine.connect() as conn:
        assert [r[0] for r in conn.execute(ids)] == [1, 3]
    engine.dispose()


def test_the_migrations_build_the_schema_the_models_describe(empty_database: str) -> None:
    """A column added to a model without its migration (or the other way round) would work in
    tests that build the schema one way and fail on a database upgraded the other."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from vantage.server.alerts import models  # noqa: F401  (its tables join the metadata)
    from vantage.server.models import Base

    command.upgrade(alembic_config(empty_database), "head")
    engine = create_engine(normalize_url(empty_database))
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    engine.dispose()


ACR_STEP_ROW = (
    "INSERT INTO steps (run_id, split, step, attempt, first_seen_at, updated_at, world_size, "
    "ranks, acc, effective_by_rank, scalars, n_groups, n_valid, n_collapsed, n_near_collapsed, "
    "n_invalid, n_degenerate, wasted_rollouts, evaluated, acr) VALUES (:run, :split, :step, 1, "
    "'2026-01-01 00:00:00+00:00', '2026-01-01 00:00:00+00:00', 1, '[]', '{}', '{}', '{}', "
    "0, 0, 0, 0, 0, 0, 0, false, :acr)"
)


def _series(conn) -> dict:  # noqa: ANN001
    """step_series decoded: {(run, split): {step: acr or None}} (absent slots left out)."""
    from vantage.server.models import ACR_ABSENT, ACR_NULL, SERIES_SLOTS

    out: dict = {}
    for run, split, chunk, acrs in conn.execute(text("SELECT * FROM step_series")):
        acrs = bytes(acrs)
        for slot in range(SERIES_SLOTS):
            value = acrs[8 * slot : 8 * slot + 8]
            if value != ACR_ABSENT:
                step = chunk * SERIES_SLOTS + slot
                out.setdefault((run, split), {})[step] = (
                    None if value == ACR_NULL else struct.unpack(">d", value)[0]
                )
    return out


def test_step_series_packs_existing_steps_and_follows_new_ones(empty_database: str) -> None:
    """0012 packs the (step, acr) of existing steps 64 to a row (PostgreSQL; SQLite gets the
    table, empty); its trigger writes the slot of every step row inserted, or updated with
    another acr, including negative steps, null acrs, and steps far apart."""
    cfg = alembic_config(empty_database)
    command.upgrade(cfg, "0011")
    engine = create_engine(normalize_url(empty_database))
    old = {-65: 0.25, -1: None, 0: 0.5, 63: 1.0, 64: 0.0, 130: 1 / 3, 2**40 + 5: 0.75}
    with engine.begin() as conn:
        conn.execute(text(KEYED_RUN), {"id": "r", "at": "2026-01-01 00:00:00+00:00"})
        for step, acr in old.items():
            conn.execute(
                text(ACR_STEP_ROW), {"run": "r", "split": "train", "step": step, "acr": acr}
            )
        conn.execute(text(ACR_STEP_ROW), {"run": "r", "split": "eval", "step": 3, "acr": 0.125})
    command.upgrade(cfg, "head")
    postgres = engine.dialect.name == "postgresql"
    with engine.begin() as conn:
        if not postgres:
            assert _series(conn) == {}
        else:
            assert _series(conn) == {("r", "train"): old, ("r", "eval"): {3: 0.125}}
            conn.execute(
                text(ACR_STEP_ROW), {"run": "r", "split": "train", "step": 66, "acr": None}
            )
            conn.execute(text("UPDATE steps SET acr = 0.875 WHERE step = 0"))
            conn.execute(text("UPDATE steps SET acr = NULL WHERE step = 63"))
            conn.execute(text("UPDATE steps SET attempt = 2 WHERE step = 64"))  # acr unchanged
            want = old | {66: None, 0: 0.875, 63: None}
            assert _series(conn) == {("r", "train"): want, ("r", "eval"): {3: 0.125}}
            conn.execute(text("DELETE FROM runs"))
            assert _series(conn) == {}
    command.downgrade(cfg, "0011")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM steps")).scalar() == (0 if postgres else 8)
    command.upgrade(cfg, "head")
    engine.dispose()


def test_runs_learn_their_newest_steps_and_follow_rule_and_state_changes(empty_database) -> None:
    """0013 gives each run the highest step of each split that has a row (an empty object to a
    run without steps), marks every run as maybe holding unevaluated steps, and installs the
    triggers that move a run's alert epoch when a rule that may apply to it, or one of its
    states, changes."""
    cfg, engine = _runs_at(empty_database, "0012", "stepped", "empty")
    with engine.begin() as conn:
        for split, step in (("train", 3), ("train", 9), ("eval", -2)):
            conn.execute(
                text(ACR_STEP_ROW), {"run": "stepped", "split": split, "step": step, "acr": 0.5}
            )
    command.upgrade(cfg, "head")
    epochs = text("SELECT id, alert_epoch FROM runs ORDER BY id")
    with engine.begin() as conn:
        rows = conn.execute(text("SELECT id, newest_steps, has_unevaluated FROM runs")).all()
        newest = {run: orjson.loads(n) if isinstance(n, str) else n for run, n, _ in rows}
        assert newest == {"stepped": {"train": 9, "eval": -2}, "empty": {}}
        assert all(bool(flag) for *_, flag in rows)
        before = dict(conn.execute(epochs).all())
        conn.execute(text("UPDATE alert_rules SET threshold = threshold WHERE name = 'acr_stall'"))
        after = dict(conn.execute(epochs).all())
        assert all(after[run] > before[run] for run in before)
        rule = conn.execute(text("SELECT id FROM alert_rules WHERE name = 'acr_stall'")).scalar()
        state = "INSERT INTO alert_states (rule_id, run_id, streak, clear_streak) VALUES "
        conn.execute(text(state + "(:r, 'empty', 1, 0)"), {"r": rule})
        moved = dict(conn.execute(epochs).all())
        assert moved == {"stepped": after["stepped"], "empty": after["empty"] + 1}
    command.downgrade(cfg, "0012")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM runs")).scalar() == 2
    engine.dispose()


def test_detectors_migration_adds_rules_and_moves_only_a_default_acr_stall(empty_database) -> None:
    """0014 adds the six detector rules (not one a user already named so), points the built-in
    acr_stall at acr_trained only while it keeps its default condition, gives old steps 0
    out-of-range rewards, keeps the alert-epoch triggers, and downgrades back."""
    cfg, engine = _runs_at(empty_database, "0013", "old")
    with engine.begin() as conn:
        conn.execute(text(ACR_STEP_ROW), {"run": "old", "split": "train", "step": 1, "acr": 0.5})
    stall = text("SELECT metric FROM alert_rules WHERE name = 'acr_stall'")
    detectors = text("SELECT name, builtin FROM alert_rules")
    command.upgrade(cfg, "0014")
    with engine.begin() as conn:
        assert conn.execute(stall).scalar() == "acr_trained"
        names = {name for name, builtin in conn.execute(detectors) if builtin}
        assert {"entropy_collapse", "kl_spike", "loss_non_finite", "reward_out_of_range"} <= names
        assert conn.execute(text("SELECT n_out_of_range FROM steps")).scalar() == 0
        epoch = text("SELECT alert_epoch FROM runs WHERE id = 'old'")
        before = conn.execute(epoch).scalar()
        conn.execute(text("UPDATE alert_rules SET warmup_steps = 5 WHERE name = 'kl_spike'"))
        assert conn.execute(epoch).scalar() > before
    command.downgrade(cfg, "0013")
    with engine.begin() as conn:
        assert conn.execute(stall).scalar() == "acr"
        left = {name for name, _ in conn.execute(detectors)}
        assert "kl_spike" not in left and "acr_stall" in left
        conn.execute(text("UPDATE alert_rules SET for_steps = 30 WHERE name = 'acr_stall'"))
    command.upgrade(cfg, "0014")
    with engine.connect() as conn:
        assert conn.execute(stall).scalar() == "acr"  # edited: the user's rule
    engine.dispose()
