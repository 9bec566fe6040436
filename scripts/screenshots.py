"""Regenerate the dashboard screenshots in docs/ (README shows them).

Starts `vantage serve --insecure-no-auth` on a temporary SQLite database, sends three sample runs
(GRPO, AVSPO, AAPO) through the HTTP API, applies a mitigation on one of them as a trainer would,
and photographs each page in headless Chromium (Debian's /usr/bin/chromium through Playwright).

    python scripts/screenshots.py [--out docs] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import httpx
from vantage.dashboard import sample_data
from vantage.server.launcher import start_server

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def seed(url: str) -> dict[str, str]:
    runs = sample_data.seed(url, steps=240)
    with httpx.Client(base_url=url, timeout=30) as c:
        # The AVSPO run switched AVSPO on at step 80, as a trainer acking a command does.
        rid = runs["qwen-avspo"]
        cmd = c.post(
            f"/api/v1/runs/{rid}/commands",
            json={"type": "set_mitigation", "params": {"mode": "avspo", "threshold": "fixed"},
                  "reason": "ACR above 0.35"},
        ).json()  # fmt: skip
        c.post(
            f"/api/v1/runs/{rid}/commands/{cmd['command_id']}/ack",
            json={"status": "applied", "step": 80},
        ).raise_for_status()
        c.post(f"/api/v1/runs/{runs['qwen-aapo']}/finish", json={"status": "finished"})
    return runs


def shoot(url: str, runs: dict[str, str], out: Path, chromium: str) -> list[Path]:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    shots = []
    ids = ",".join(runs.values())
    pages = [
        ("dashboard-runs.png", "/dashboard/", "#runs-table"),
        ("dashboard-run.png", f"/dashboard/runs/{runs['qwen-avspo']}", "#kpi-acr-value"),
        ("dashboard-compare.png", f"/dashboard/compare?runs={ids}", "#compare-tbl"),
    ]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        for name, path, ready in pages:
            page.goto(url + path)
            page.wait_for_selector(ready, timeout=20_000)
            page.wait_for_timeout(1500)  # let Plotly finish drawing
            target = out / name
            page.screenshot(path=str(target), full_page=True)
            shots.append(target)
        browser.close()
    return shots


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs"))
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vantage-shots-"))
    with start_server(f"sqlite:///{work / 'shots.db'}", work, "--insecure-no-auth") as server:
        runs = seed(server.url)
        for path in shoot(server.url, runs, Path(args.out), args.chromium):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
