"""A log_groups call whose rewards are not numbers costs only its own groups (found by a
fresh-user trial: it used to lose every step batched with it)."""

from __future__ import annotations

import httpx
from vantage.client import Monitor

from tests.conftest import start_server


def test_unreadable_rewards_drop_only_their_call(tmp_path):
    srv = start_server(f"sqlite:///{tmp_path}/m.db", tmp_path, "--insecure-no-auth")
    try:
        mon = Monitor(srv.url, None, run_name="bad-call", spool_dir=str(tmp_path / "spool"))
        for step in range(5):
            mon.log_groups(step, [[1, 1], [1, 0]])
        mon.log_groups(5, [[[1, 0], [0, 1]]])  # one level too deep
        mon.log_groups(6, [["a", "b"]])  # strings
        mon.log_groups(2**70, [[1, 1]])  # a step the server cannot take (found by a trial too)
        mon.log_effective(2**64, n_valid=1, n_zero_advantage=0)
        mon.log_scalars(-1, {"loss": 1.0})
        for step in (7, 8):
            mon.log_groups(step, [[1, 1], [1, 0]])
        mon.close(timeout=20)
        points = httpx.get(f"{srv.url}/api/v1/runs/{mon.run_id}/metrics").json()["points"]
        by_step = {p["step"]: p for p in points}
        for step in (0, 1, 2, 3, 4, 7, 8):
            assert by_step[step]["n_groups"] == 2 and by_step[step]["acr"] == 0.5
        assert all(by_step.get(s, {"n_groups": 0})["n_groups"] == 0 for s in (5, 6))
        assert mon.dropped_groups == 2
    finally:
        srv.stop()


def test_a_dead_letter_reaches_the_server_before_finish(tmp_path):
    """The server's client-health counters hear of a batch the server refused even when the run
    finishes before the next periodic heartbeat (found by a fresh-user trial)."""
    srv = start_server(f"sqlite:///{tmp_path}/d.db", tmp_path, "--insecure-no-auth")
    try:
        mon = Monitor(srv.url, None, run_name="dead", spool_dir=str(tmp_path / "spool"))
        mon.log_groups(1, [[1, 0]], group_ids=["x" * 200])  # the server refuses ids over 128
        mon.close(timeout=20)
        assert mon.dead_letter_batches == 1
        run = httpx.get(f"{srv.url}/api/v1/runs/{mon.run_id}").json()
        assert run["client"]["dead_letter_batches"] == 1 and run["status"] == "finished"
    finally:
        srv.stop()
