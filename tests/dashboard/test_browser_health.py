"""Health verdicts and a command's round trip in headless Chromium against a real `vantage serve`
(issue 42, items 1 and 7)."""

from __future__ import annotations

import time

import pytest
from vantage.dashboard import sample_data

pytestmark = pytest.mark.browser

COLLAPSED = [{"rewards": [1.0] * 4}] * 4
LIVE = [{"rewards": [1.0, 0.0, 1.0, 0.0]}] * 4


def _seed(api, name: str, groups: list[dict], **record) -> str:
    run_id, attempt = sample_data.create_run(api, name, project="health", tags=("health",))
    records = [{"step": s, "groups": groups, **record} for s in range(3)]
    sample_data.send_steps(api, run_id, attempt, records)
    return run_id


def test_health_verdicts_on_the_runs_list_and_the_run_header(control_page, dashboard_server):
    with dashboard_server.api() as api:
        runs = {
            "healthy": _seed(api, "h-healthy", LIVE),
            "collapsing": _seed(api, "h-collapsing", COLLAPSED),
            "mitigated": _seed(
                api,
                "h-mitigated",
                COLLAPSED,
                effective={"n_valid": 4, "n_zero_advantage": 0},
                mitigation={"mode": "avspo"},
            ),
            "failed": _seed(api, "h-failed", LIVE),
        }
        api.post(f"/api/v1/runs/{runs['failed']}/finish", json={"status": "failed"})
    page = control_page
    page.goto(f"{dashboard_server.url}/dashboard/?project=health&order=health")
    page.wait_for_selector("#runs-table")
    shown = page.locator("#runs-table tr.run-row [data-health]")
    page.wait_for_function("document.querySelectorAll('#runs-table tr.run-row').length == 4")
    # worst first: collapsing, failed, mitigated, healthy (docs/design.md §9)
    assert shown.all_inner_texts() == ["collapsing", "failed", "mitigated", "healthy"]
    mitigated = page.locator(f"tr[data-run-id='{runs['mitigated']}']")
    assert "effective 0.00" in mitigated.inner_text()  # the raw and effective ACR, labelled
    assert "after the mitigation" in mitigated.locator("[data-health]").get_attribute("title")
    # the project's cost of collapse: 2 runs × 3 steps × 16 completions wasted of 4 runs' 192
    page.wait_for_selector("[data-project='health']")
    assert "96 completions" in page.inner_text("[data-project='health']")
    page.goto(f"{dashboard_server.url}/dashboard/runs/{runs['mitigated']}")
    page.wait_for_selector("#run-health")
    assert page.inner_text("#run-health") == "mitigated"
    assert "effective 0.00" in page.inner_text(".run-health")
    assert page.get_attribute("#kpi-wasted", "class") == "kpi kpi-info"  # not green
    assert "AVSPO acts on it" in page.inner_text("#kpi-wasted")
    assert page.inner_text("#kpi-acr_effective-value") == "0.00"


def test_a_command_sent_from_the_run_page_is_acked_by_the_trainers_client(
    control_page, dashboard_server, tmp_path
):
    """The lead sends a checkpoint; a real `Monitor` (the trainer's client) receives it in a
    heartbeat answer and acks it over HTTP; the command log shows it applied."""
    from vantage.client import Monitor

    mon = Monitor(
        server=dashboard_server.url,
        api_key=dashboard_server.keys["ingest"],
        run_name="acked-run",
        project="health",
        spool_dir=tmp_path,
        heartbeat_s=0.5,
    )
    try:
        mon.log_groups(0, [[1.0, 0.0, 1.0, 0.0]] * 4)
        assert mon.flush(timeout=20)
        page = control_page
        page.goto(f"{dashboard_server.url}/dashboard/runs/{mon.run_id}")
        page.locator("button.action", has_text="Save checkpoint").click()
        page.click("#cmd-confirm-send")
        page.wait_for_selector("#cmd-sent")
        deadline, received = time.monotonic() + 20, []
        while not received and time.monotonic() < deadline:
            received = [c for c in mon.poll_commands() if c.type == "checkpoint"]
            time.sleep(0.2)
        assert received, "the client never received the checkpoint command"
        mon.ack(received[0].command_id, "applied", 0, detail="saved")
        assert mon.flush(timeout=20)
        row = page.locator(f"tr[data-command-id='{received[0].command_id}']")
        row.wait_for()
        page.wait_for_function(
            f"document.querySelector(\"tr[data-command-id='{received[0].command_id}']\")"
            ".innerText.includes('applied')",
            timeout=10_000,
        )
        assert "dashboard:lead" in row.inner_text()
    finally:
        mon.close(timeout=10)
