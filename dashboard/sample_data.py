"""Sample runs sent through the HTTP API, for the browser tests, the screenshot script and the
benchmark (`python -m vantage.dashboard.sample_data http://127.0.0.1:8000 [KEY]`)."""

from __future__ import annotations

import math
import random
import sys
import time

import httpx


def step_records(start: int, count: int, seed: int = 0, groups: int = 16, size: int = 8,
                 drift: float = 0.004, base: float = 0.25) -> list[dict]:  # fmt: skip
    """Steps whose pass rate climbs from ``base`` so collapse (mostly all-pass) rises."""
    rng = random.Random(seed * 100_003 + start)
    records = []
    now = time.time()
    for step in range(start, start + count):
        p_mean = min(0.97, base + drift * step)
        rows, prompt_ids = [], []
        for g in range(groups):
            p = min(1.0, max(0.0, rng.gauss(p_mean, 0.3)))
            rows.append([1.0 if rng.random() < p else 0.0 for _ in range(size)])
            prompt_ids.append(f"prompt-{(step * groups + g) % 40}")
        flat = [r for row in rows for r in row]
        mean = sum(flat) / len(flat)
        std = math.sqrt(sum((r - mean) ** 2 for r in flat) / (len(flat) - 1))
        records.append(
            {
                "step": step,
                "time": now - (start + count - step) * 2.0,
                "groups": [
                    {"group_id": str(g), "rewards": row, "prompt_id": pid}
                    for g, (row, pid) in enumerate(zip(rows, prompt_ids, strict=True))
                ],
                "scalars": {
                    "loss": 0.5 * math.exp(-step / 200) + 0.01 * rng.random(),
                    "kl": 0.001 * step**0.5,
                    "entropy": 1.5 * math.exp(-step / 300),
                    "temperature": 1.0,
                    "reward_std": std,
                },
            }
        )
    return records


def create_run(client: httpx.Client, name: str, project: str = "demo", tags=("grpo",),
               group_size: int = 8) -> tuple[str, int]:  # fmt: skip
    r = client.post(
        "/api/v1/runs",
        json={"name": name, "project": project, "tags": list(tags), "group_size": group_size,
              "config": {"model": "tiny-llama", "lr": 1e-4, "group_size": group_size}},
    )  # fmt: skip
    r.raise_for_status()
    body = r.json()
    return body["run_id"], body["attempt"]


def send_steps(client: httpx.Client, run_id: str, attempt: int, records: list[dict]) -> dict:
    r = client.post(f"/api/v1/runs/{run_id}/steps", json={"attempt": attempt, "records": records})
    r.raise_for_status()
    return r.json()


def seed(base_url: str, key: str | None = None, steps: int = 120) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    out = {}
    with httpx.Client(base_url=base_url, headers=headers, timeout=60) as c:
        for i, (name, drift) in enumerate(
            (("qwen-grpo", 0.006), ("qwen-avspo", 0.0015), ("qwen-aapo", 0.002))
        ):
            run_id, attempt = create_run(c, name, tags=("math", name.split("-")[1]))
            for start in range(0, steps, 50):
                records = step_records(start, min(50, steps - start), seed=i, drift=drift)
                send_steps(c, run_id, attempt, records)
            out[name] = run_id
    return out


if __name__ == "__main__":
    print(seed(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
