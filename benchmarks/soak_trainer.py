"""One rank of one soak run (benchmarks/soak.py), as its own process with its own ``Monitor``.

It logs ``groups`` reward groups of ``group_size`` and a few scalars per step at
``steps_per_s`` until the file ``stop_file`` exists (the soak makes it once its faults are over),
acks every command it polls at the step it polls
it (rank 0 gets them), closes the Monitor, and writes what it saw to ``result`` (JSON): the steps
and groups it logged, its counters, the commands it polled and acked, the latency of each
``POST .../steps`` it sent, the high-water marks of its spool and queue, and the longest
``log_*`` call (training must never wait on the network).

    python benchmarks/soak_trainer.py CONFIG_JSON
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

COLLAPSED_SHARE = {0: 0.09, 1: 0.81}  # by phase: a step's share of collapsed groups


def phase_of(step: int, phase_steps: int, offset: int) -> int:
    """1 in a collapsed phase (ACR about 0.81), 0 in a live one (about 0.09)."""
    return ((step + offset) // phase_steps) % 2


def step_rewards(
    run: int, rank: int, step: int, groups: int, group_size: int, phase_steps: int, offset: int
) -> list[list[float]]:
    """The binary rewards of one rank's step: ``groups`` × ``group_size``, the same on every
    call (seeded by run, rank and step). Collapsed groups are all 0 or all 1; the others hold
    both values, so that a phase's ACR is exact and an alert rule fires and clears on it."""
    rng = random.Random(f"{run}-{rank}-{step}")
    n_collapsed = round(COLLAPSED_SHARE[phase_of(step, phase_steps, offset)] * groups)
    out = []
    for i in range(groups):
        if i < n_collapsed:
            out.append([float(i % 2)] * group_size)
        else:
            row = [float(rng.random() < 0.5) for _ in range(group_size)]
            row[0], row[1] = 0.0, 1.0  # both values: a live group
            out.append(row)
    return out


def main(config_path: str) -> None:
    cfg = json.loads(Path(config_path).read_text())
    from vantage.client import Monitor

    mon = Monitor(
        cfg["server"],
        cfg["api_key"],
        run_name=cfg["run_name"],
        run_id=cfg["run_id"],
        launch_id=cfg["launch_id"],
        project="soak",
        rank=cfg["rank"],
        world_size=cfg["world_size"],
        group_size=cfg["group_size"],
        spool_dir=cfg["spool_dir"],
        heartbeat_s=cfg["heartbeat_s"],
        spool_max_bytes=cfg["spool_max_bytes"],
    )
    latencies: list[tuple[float, float, int, str]] = []  # (wall end, ms, status, kind)
    transport = mon._worker.delivery.transport  # the benchmark times the client's own requests
    post = transport.post

    def timed(path: str, body: bytes, timeout: float | None = None):  # noqa: ANN202
        t0 = time.perf_counter()
        reply = post(path, body, timeout)
        if path.endswith("/steps"):
            ms = 1000 * (time.perf_counter() - t0)
            latencies.append((time.time(), ms, reply.status, reply.kind))
        return reply

    transport.post = timed
    polled: dict[str, int] = {}
    acked: dict[str, int] = {}
    spool_hw = queue_hw = 0
    longest_call_ms = 0.0
    step = 0
    period = 1.0 / cfg["steps_per_s"]
    next_at = time.monotonic()
    stop = Path(cfg["stop_file"])
    while not stop.exists():
        step += 1
        rewards = step_rewards(
            cfg["run_index"], cfg["rank"], step, cfg["groups"], cfg["group_size"],
            cfg["phase_steps"], cfg["phase_offset"],
        )  # fmt: skip
        t0 = time.perf_counter()
        mon.log_groups(step, rewards)
        mon.log_scalars(step, {"loss": 1.0 / step, "kl": 0.01 * (step % 7)})
        for cmd in mon.poll_commands():
            polled[cmd.command_id] = polled.get(cmd.command_id, 0) + 1
            mon.ack(cmd.command_id, "applied", step)
            acked[cmd.command_id] = acked.get(cmd.command_id, 0) + 1
        longest_call_ms = max(longest_call_ms, 1000 * (time.perf_counter() - t0))
        spool_hw = max(spool_hw, mon.spooled_groups)
        queue_hw = max(queue_hw, mon._worker.queued)
        next_at += period
        time.sleep(max(0.0, next_at - time.monotonic()))
    t_close = time.monotonic()
    mon.close(timeout=cfg["close_timeout_s"])
    close_s = time.monotonic() - t_close
    result = {
        "run_id": mon.run_id,
        "run_index": cfg["run_index"],
        "rank": cfg["rank"],
        "attempt": mon.attempt,
        "steps": step,
        "groups_per_step": cfg["groups"],
        "logged_groups": step * cfg["groups"],
        "dropped_groups": mon.dropped_groups,
        "dead_letter_batches": mon.dead_letter_batches,
        "stats": dict(mon.stats),
        "polled": polled,
        "acked": acked,
        "latencies": latencies,
        "spool_high_water_groups": spool_hw,
        "queue_high_water_groups": queue_hw,
        "longest_log_call_ms": round(longest_call_ms, 2),
        "close_s": round(close_s, 2),
        "finish_sent": mon._worker.finish_sent,
        "spool_left": mon.spool_path.exists(),
        "last_error": mon.last_error,
    }
    tmp = Path(cfg["result"] + ".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, cfg["result"])


if __name__ == "__main__":
    main(sys.argv[1])
