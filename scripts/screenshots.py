"""Regenerate the dashboard screenshots in docs/ (README shows them).

Starts `vantage serve --insecure-no-auth` on a temporary SQLite database, sends three sample runs
(GRPO, AVSPO, AAPO) through the HTTP API, applies a mitigation on one of them as a trainer would,
and photographs each page in headless Chromium (Debian's /usr/bin/chromium through Playwright).

    python scripts/screenshots.py [--out docs] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from vantage.dashboard import sample_data

ROOT = Path(__file__).resolve().parents[1]
VANTAGE = str(Path(sys.executable).with_name("vantage"))
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(db_url: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [VANTAGE, "serve", "--host", "127.0.0.1", "--port", str(port), "--insecure-no-auth",
         "--database-url", db_url, "--log-level", "warning"],
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            if proc.poll() is not None:
                raise SystemExit("vantage serve did not start") from None
            time.sleep(0.2)


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
    db_url = f"sqlite:///{Path(tempfile.mkdtemp(prefix='vantage-shots-')) / 'shots.db'}"
    proc, url = start_server(db_url)
    try:
        runs = seed(url)
        for path in shoot(url, runs, Path(args.out), args.chromium):
            print(path)
    finally:
        proc.terminate()
        proc.wait(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
