"""Run locks on PostgreSQL: a lock taken without waiting (``NOWAIT``) that another transaction
holds ends the transaction, and `db.redo_on_lock_conflict` does it again (a rule change that
met a run it did not foresee after it had written, instead of waiting in a circle)."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from vantage.client.schema import RunCreate
from vantage.server import db
from vantage.server.locks import lock_runs, rule_writes_lock, run_lock
from vantage.server.migrate import upgrade
from vantage.server.runs import create_or_resume_run


@pytest.fixture
def one_run(postgres_url):  # noqa: ANN001, ANN201
    """Session factory of a migrated PostgreSQL database, and the id of a run stored in it."""
    upgrade(postgres_url)
    engine = db.make_engine(postgres_url)
    sessions = db.session_factory(engine)
    with sessions() as s:
        run, _, _ = create_or_resume_run(s, RunCreate(name="locked"), None, "auto")
        s.commit()
        run_id = run.id
    yield sessions, run_id
    engine.dispose()


def test_a_lock_held_elsewhere_is_refused_without_waiting_then_redone(one_run):
    sessions, run_id = one_run
    with sessions() as holder, sessions() as other:
        with lock_runs(holder, [run_id]):  # another transaction holds the run
            with pytest.raises(OperationalError) as refused, run_lock(other, run_id, True):
                pass
            assert db.must_redo(refused.value)
            other.rollback()
            tries: list[int] = []

            def work() -> str:
                tries.append(1)
                if len(tries) == 2:
                    holder.commit()  # the other transaction ends between the tries
                with run_lock(other, run_id, nowait=True):
                    other.commit()
                return "done"

            assert db.redo_on_lock_conflict(other, work) == "done"
            assert len(tries) == 2  # refused once, then done
        with pytest.raises(ValueError, match="no redo"):  # other errors are not redone

            def fails() -> None:
                tries.append(1)
                raise ValueError("no redo")

            db.redo_on_lock_conflict(other, fails)
        assert len(tries) == 3


def test_rule_writes_and_run_locks_exclude_each_other_rule_lock_first(one_run):
    """A rule change waits for every transaction holding a run, and a run lock waits for a
    rule change, taking the rule lock before the run's row: an ingest that read a rule as
    enabled could otherwise fire it after its disabling had closed its episodes and committed
    (a disabled rule kept a firing alert: CI), and a run lock taken row first would close a
    circle with a rule change waiting for that row."""
    sessions, run_id = one_run
    with sessions() as ingest, sessions() as change, sessions() as watch:
        with run_lock(ingest, run_id):
            done = _in_thread(lambda: _take_rule_lock(change))
            assert not done.wait(0.5)  # the change waits for the run's holder
            ingest.commit()
            assert done.wait(10)
        with sessions() as other, sessions() as row_holder:
            row_holder.execute(text("SELECT id FROM runs WHERE id = :r FOR UPDATE"),
                               {"r": run_id})  # fmt: skip
            with rule_writes_lock(change):
                pid = other.execute(text("SELECT pg_backend_pid()")).scalar_one()
                locked = _in_thread(lambda: _take_run_lock(other, run_id))
                assert not locked.wait(0.5)
                waits = (
                    watch.execute(
                        text("SELECT locktype FROM pg_locks WHERE pid = :pid AND NOT granted"),
                        {"pid": pid},
                    )
                    .scalars()
                    .all()
                )
                assert waits == ["advisory"]  # the rule lock, not yet the run's row
                change.commit()
            row_holder.commit()
            assert locked.wait(10)


def _in_thread(work) -> threading.Event:  # noqa: ANN001
    done = threading.Event()

    def run() -> None:
        work()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


def _take_rule_lock(session) -> None:  # noqa: ANN001
    with rule_writes_lock(session):
        session.commit()


def _take_run_lock(session, run_id: str) -> None:  # noqa: ANN001
    with run_lock(session, run_id):
        session.commit()
