"""The soak (benchmarks/soak.py, docs/design.md §2) in its small CI form: 2 runs of 2 ranks, plus
a run whose spool fills, through a ``kill -9`` of the server, a crash-restart of PostgreSQL, bursts
of malformed requests, a webhook receiver that is down for a while and commands to the runs;
nothing may be lost, stored twice, left unnotified or unacked. It starts a PostgreSQL cluster of
its own (initdb), so it skips where the PostgreSQL binaries are missing, unless
``VANTAGE_REQUIRE_POSTGRES=1``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.postgres import REQUIRE_POSTGRES

SOAK = Path(__file__).resolve().parents[1] / "benchmarks" / "soak.py"


def _has_initdb() -> bool:
    sys.path.insert(0, str(SOAK.parent))
    try:
        from soak_cluster import pg_bin_dir
    finally:
        sys.path.remove(str(SOAK.parent))
    return pg_bin_dir() is not None


def test_soak_loses_nothing_through_server_kills_and_database_restarts():
    if not _has_initdb():
        if REQUIRE_POSTGRES:
            pytest.fail("PostgreSQL's initdb and pg_ctl are required (VANTAGE_REQUIRE_POSTGRES=1)")
        pytest.skip("no initdb/pg_ctl on PATH or under /usr/lib/postgresql")
    done = subprocess.run(
        [sys.executable, str(SOAK), "--ci", "--no-mlflow"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=SOAK.parent,
    )
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-3000:]
    report = json.loads(lines[-1])
    said = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert report["problems"] == [], said
    assert done.returncode == 0, said
    assert report["server_kills"] >= 1 and report["database_restarts"] >= 1, said
    assert (report["lost"], report["duplicated"], report["conflicts"]) == (0, 0, 0), said
    assert report["incomplete_steps"] == 0 and report["spool_left"] == 0, said
    assert report["groups"] > 0 and report["runs"] == 3 and report["ranks_per_run"] == 2
    assert report["commands"] >= 1 and report["commands"] == report["commands_acked_once"], said
    assert report["alert_episodes"] >= 1 and report["notifications_missing"] == 0, said
    assert report["notifications_duplicated"] == 0, said
    # the small spool filled during the outages: what it could not keep was counted (and the
    # run's client health said so: a mismatch is one of the problems above)
    assert report["small_spool_dropped_groups"] > 0, said
    assert not any(status.startswith("5") for status in report["malformed_answers"]), said
