"""Client health from several ranks at once (docs/design.md §4, heartbeat): each rank's counters
are kept, whatever the order in which concurrent heartbeats commit. Real server, SQLite and
PostgreSQL."""

from __future__ import annotations

import threading

from tests.helpers.api import new_run


def test_concurrent_heartbeats_of_two_ranks_keep_both_ranks_counters(api, auth_server):
    """The ranks of a launch close together, each sending its final counts: the heartbeat read
    the run's per-rank health, changed its own rank's and wrote the whole back, so that of two
    concurrent heartbeats the later write put back the other rank's older counts (a lost
    update: the summary under-reported the drops of a full spool, benchmarks/soak.py)."""
    run = new_run(api, world_size=2)
    path = f"/api/v1/runs/{run['run_id']}/heartbeat"
    wrong = []
    for i in range(1, 31):
        barrier = threading.Barrier(2)

        def beat(rank: int, i: int = i, barrier: threading.Barrier = barrier) -> None:
            body = {"attempt": 1, "rank": rank, "dropped_groups": 1000 * rank + i}
            with auth_server.client("all") as client:
                barrier.wait()
                assert client.post(path, json=body).status_code == 200

        threads = [threading.Thread(target=beat, args=(rank,)) for rank in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        dropped = api.get(f"/api/v1/runs/{run['run_id']}").json()["client"]["dropped_groups"]
        if dropped != 1000 + 2 * i:
            wrong.append((i, dropped))
    assert wrong == []
