"""What the Monitor costs a training loop (issue 3, item 7).

1. ``log_groups`` latency for a [64, 16] float32 tensor over ``--calls`` calls (default 10,000)
   while the sender is busy: between calls the loop does a little GIL-releasing torch work, and
   the groups arrive far faster than a server on the same machine ingests them, so the sender
   is encoding, spooling and posting throughout. Reports p50, p99 and max in microseconds.
2. The wall time of a ``--steps``-step CPU loop of ~``--step-ms`` ms steps (torch matmuls) with
   and without a Monitor, interleaved in blocks (without, with, without, ...) so that drift in
   the machine's speed hits both alike. ``overhead_ratio`` = with / without.

A real ``vantage serve`` (SQLite in a temporary folder, at low CPU priority, standing in for a
server on another machine) is started unless ``--server`` is given.
The last line printed is JSON with ``log_groups_p99_us`` and ``overhead_ratio``.

    python benchmarks/client_overhead.py [--calls 10000] [--steps 200] [--step-ms 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from vantage.client import Monitor
from vantage.server.launcher import start_server


def pct(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def latency(server: str, spool: Path, calls: int) -> dict[str, float]:
    torch.manual_seed(0)
    inputs = [torch.rand(64, 16) for _ in range(16)]
    a, b = torch.rand(96, 96), torch.rand(96, 96)
    mon = Monitor(server, None, run_name="bench-latency", spool_dir=spool)
    for i in range(200):  # warm up the code paths
        mon.log_groups(i, inputs[i % 16])
    times = []
    t_start = time.perf_counter()
    for i in range(calls):
        rewards = inputs[i % 16]
        t0 = time.perf_counter()
        mon.log_groups(1000 + i // 4, rewards)
        times.append(time.perf_counter() - t0)
        torch.mm(a, b)  # a little work that releases the GIL, as a training step does
    loop_s = time.perf_counter() - t_start
    backlog = mon.spooled_groups + mon._worker.queued
    mon.close(timeout=5, status=None)
    times.sort()
    return {
        "calls": calls,
        "log_groups_p50_us": pct(times, 0.50) * 1e6,
        "log_groups_p99_us": pct(times, 0.99) * 1e6,
        "log_groups_max_us": times[-1] * 1e6,
        "latency_loop_s": loop_s,
        "groups_per_s_offered": calls * 64 / loop_s,
        "sender_backlog_groups_at_end": backlog,
        "sent_groups": mon.stats["sent_groups"],
    }


def calibrate(step_ms: float) -> int:
    a, b = torch.rand(256, 256), torch.rand(256, 256)
    per = float("inf")
    for _ in range(5):  # the fastest of several tries: other processes only ever slow it down
        t0 = time.perf_counter()
        for _ in range(20):
            torch.mm(a, b)
        per = min(per, (time.perf_counter() - t0) / 20)
    return max(1, round(step_ms / 1e3 / per))


def train_step(k: int, a: torch.Tensor, b: torch.Tensor) -> float:
    acc = 0.0
    for _ in range(k):
        acc += float(torch.mm(a, b)[0, 0])
    return acc


def overhead(server: str, spool: Path, steps: int, step_ms: float, blocks: int) -> dict[str, float]:
    k = calibrate(step_ms)
    a, b = torch.rand(256, 256), torch.rand(256, 256)
    rewards = [torch.randint(0, 2, (64, 16)).float() for _ in range(8)]
    mon = Monitor(server, None, run_name="bench-overhead", spool_dir=spool)
    per_block = steps // blocks
    with_s, without_s = [], []
    cpu = {False: 0.0, True: 0.0}
    sender_clock = time.pthread_getcpuclockid(mon._worker.thread.ident)
    sender_cpu0 = time.clock_gettime(sender_clock)
    step = 0
    for _ in range(blocks):
        for use_monitor in (False, True):
            t0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(per_block):
                loss = train_step(k, a, b)
                if use_monitor:
                    mon.log_groups(step, rewards[step % 8])
                    mon.log_scalars(step, {"loss": loss})
                step += 1
            (with_s if use_monitor else without_s).append(time.perf_counter() - t0)
            cpu[use_monitor] += time.thread_time() - c0
            if use_monitor:
                mon.flush(30)  # between blocks, so that a block never pays for its neighbour
    sender_cpu = time.clock_gettime(sender_clock) - sender_cpu0
    mon.close(timeout=30, status=None)
    n = per_block * blocks
    return {
        # CPU time is less sensitive than wall time to other processes on a shared machine.
        "train_thread_cpu_ratio": cpu[True] / cpu[False],
        "sender_cpu_ms_per_step": sender_cpu / n * 1e3,
        "cpu_ratio_with_sender": (cpu[True] + sender_cpu) / cpu[False],
        "steps_each": per_block * blocks,
        "step_ms_without": statistics.fmean(without_s) / per_block * 1e3,
        "step_ms_with": statistics.fmean(with_s) / per_block * 1e3,
        "wall_s_without": sum(without_s),
        "wall_s_with": sum(with_s),
        "overhead_ratio": sum(with_s) / sum(without_s),
        "overhead_ratio_median_pair": statistics.median(
            w / wo for w, wo in zip(with_s, without_s, strict=True)
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", help="an existing server (default: start one on SQLite)")
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--step-ms", type=float, default=50.0)
    ap.add_argument("--blocks", type=int, default=40, help="interleaved blocks per variant")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the loop")
    ap.add_argument(
        "--server-nice",
        type=int,
        default=19,
        help="niceness of the server started here (in a deployment it runs on another machine; "
        "the Monitor's own thread is always fully counted)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        started = None
        server = args.server
        if server is None:
            started = start_server(
                f"sqlite:///{folder / 'bench.db'}",
                folder,
                "--insecure-no-auth",
                log_name="server.log",
                timeout=60,
                nice=args.server_nice,
            )
            server = started.url
        try:
            # The loop first: the latency part leaves the server a backlog to ingest.
            ovh = overhead(server, folder / "spool-overhead", args.steps, args.step_ms, args.blocks)
            print(f"{ovh['steps_each']} steps (aimed at {args.step_ms:.0f} ms), interleaved: "
                  f"{ovh['step_ms_without']:.2f} ms/step without, {ovh['step_ms_with']:.2f} ms "
                  f"with a Monitor; overhead_ratio {ovh['overhead_ratio']:.4f}")  # fmt: skip
            lat = latency(server, folder / "spool-latency", args.calls)
            print(f"log_groups [64, 16] tensor, {lat['calls']} calls while the sender is busy "
                  f"({lat['groups_per_s_offered']:.0f} groups/s offered): p50 "
                  f"{lat['log_groups_p50_us']:.1f} us, p99 {lat['log_groups_p99_us']:.1f} us, "
                  f"max {lat['log_groups_max_us']:.1f} us")  # fmt: skip
        finally:
            if started is not None:
                started.stop()
    result = {**lat, **ovh, "cpus": os.cpu_count(), "torch_threads": args.threads}
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
