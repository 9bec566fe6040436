"""Run locks on PostgreSQL: a lock taken without waiting (``NOWAIT``) that another transaction
holds ends the transaction, and `db.redo_on_lock_conflict` does it again (a rule change that
met a run it did not foresee after it had written, instead of waiting in a circle)."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import OperationalError
from vantage.client.schema import RunCreate
from vantage.server import db
from vantage.server.locks import lock_runs, run_lock
from vantage.server.migrate import upgrade
from vantage.server.runs import create_or_resume_run


def test_a_lock_held_elsewhere_is_refused_without_waiting_then_redone(postgres_url):
    upgrade(postgres_url)
    engine = db.make_engine(postgres_url)
    sessions = db.session_factory(engine)
    try:
        with sessions() as s:
            run, _, _ = create_or_resume_run(s, RunCreate(name="locked"), None, "auto")
            run_id = run.id
            s.commit()
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
    finally:
        engine.dispose()
