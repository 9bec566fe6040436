"""The runs table's client-health cell (docs/design.md §5, spool): what a trainer's client could
not keep (a full spool or queue) is shown as a count, never as "ok" (issue 45, item 4; the
client counts the drops and the server sums every rank's, tests/client/test_monitor_server.py,
tests/test_heartbeat_ranks.py and benchmarks/soak.py)."""

from __future__ import annotations

from vantage.dashboard.pages.runs.table import health_cell


def test_dropped_groups_are_shown_with_what_they_mean():
    cell = health_cell({"spooled_groups": 0, "dropped_groups": 37, "dead_letter_batches": 0})
    assert cell.children == "0 spooled · 37 dropped · 0 refused"
    assert cell.className == "health-warn" and "full spool or queue" in cell.title


def test_a_client_that_kept_everything_is_ok():
    for client in (None, {}, {"spooled_groups": 0, "dropped_groups": 0, "dead_letter_batches": 0}):
        assert health_cell(client).children == "ok"
    spooled = health_cell({"spooled_groups": 5, "dropped_groups": 0, "dead_letter_batches": 0})
    assert spooled.children == "5 spooled · 0 dropped · 0 refused"
