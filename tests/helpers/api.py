"""Small calls on the HTTP API that many tests make."""

from __future__ import annotations

import httpx


def new_run(client: httpx.Client, **body: object) -> dict:
    """POST /api/v1/runs (name "test" unless given); returns the answer."""
    r = client.post("/api/v1/runs", json={"name": "test", **body})
    assert r.status_code in (200, 201), r.text
    return r.json()


def post_steps(
    client: httpx.Client,
    run: dict,
    records: list[dict],
    attempt: int | None = None,
    expect: int = 200,
) -> dict:
    """POST the records to the run's steps (its attempt unless given) and check the status."""
    r = client.post(
        f"/api/v1/runs/{run['run_id']}/steps",
        json={"attempt": attempt or run["attempt"], "records": records},
    )
    assert r.status_code == expect, r.text
    return r.json()
