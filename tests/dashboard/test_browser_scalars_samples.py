"""The run page's scalar picker and a prompt's completion samples, in a real headless Chromium
against a real `vantage serve` (issue 42 items 5 and 6)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser

GRAPH = "document.querySelector('#run-scalars-graph .js-plotly-plot')"


def test_picking_a_scalar_charts_it(read_page, dashboard_server):
    run_id = dashboard_server.runs["qwen-aapo"]
    page = read_page
    page.goto(f"{dashboard_server.url}/dashboard/runs/{run_id}")
    page.wait_for_function(f"{GRAPH}?.data?.length === 4")  # the default: the first four
    page.click("#run-scalars-pick")
    page.keyboard.type("reward_std")
    page.get_by_role("option", name="reward_std").click()
    page.keyboard.press("Escape")  # the list stays open for more picks: close it
    page.wait_for_function(f"{GRAPH}?.data?.length === 1 && {GRAPH}.data[0].name === 'reward_std'")
    # with smoothing, the raw values stay behind the smoothed line
    page.focus("#run-scalars-smooth [role=slider]")
    page.keyboard.press("End")  # the slider's keys: End is the most smoothing
    page.wait_for_function(f"{GRAPH}?.data?.length === 2")
    names = page.evaluate(f"{GRAPH}.data.map(t => t.name)")
    assert names == ["reward_std", "reward_std, smoothed"]


def test_a_prompts_samples_show_what_the_model_answered(read_page, dashboard_server):
    run_id = dashboard_server.runs["qwen-grpo"]
    with dashboard_server.api() as api:
        first = api.get(f"/api/v1/runs/{run_id}/prompts", params={"split": "train"}).json()
        prompt_id = first["prompts"][0]["prompt_id"]  # the table's first row
        body = {
            "attempt": 1,
            "samples": [
                {"step": 119, "prompt_id": prompt_id, "prompt": "What is 17+25?",
                 "completions": ["42", "forty-three"], "rewards": [1.0, 0.0]},
            ],
        }  # fmt: skip
        r = api.post(f"/api/v1/runs/{run_id}/samples", json=body)
        assert r.status_code == 200, r.text
    page = read_page
    page.goto(f"{dashboard_server.url}/dashboard/runs/{run_id}")
    page.locator("#run-tabs").get_by_text("Prompts").click()
    page.wait_for_selector("#prompts-table")
    page.locator("#prompts-table td[data-dash-column='prompt_id']").first.click()
    page.wait_for_function(
        "document.querySelector('#prompt-samples')?.innerText.includes('forty-three')"
    )
    text = page.inner_text("#prompt-samples")
    assert "What did the model answer?" in text and prompt_id in text
    assert "What is 17+25?" in text and "step 119" in text
