"""The Monitor against a real `vantage serve` process over HTTP (docs/design.md §5, issue 3 item 6):
outages, restarts, retries, dead letters, ranks, launches, commands, bounded close, sync."""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from vantage.client import Monitor
from vantage.client.spool import SPOOL_SUFFIX, Spool
from vantage.client.sync import sync

from tests.helpers.client import queue_refused_record
from tests.helpers.server import RestartableServer, free_port


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def monitor(server_url: str, tmp_path: Path, **kw) -> Monitor:
    kw.setdefault("run_name", "client-test")
    kw.setdefault("heartbeat_s", 1.0)
    return Monitor(server_url, None, spool_dir=tmp_path / "spool", **kw)


def step_rewards(step: int, p: int = 8, g: int = 4) -> list[list[float]]:
    rng = random.Random(step)
    return [[float(rng.random() < 0.5) for _ in range(g)] for _ in range(p)]


def test_stream_survives_sigterm_and_restart_every_group_once(
    own_noauth_server: RestartableServer, tmp_path: Path
):
    noauth_server = own_noauth_server
    mon = monitor(noauth_server.url, tmp_path, batch_interval_s=0.2)
    expected = {}
    for step in range(200):
        rewards = step_rewards(step)
        expected[step] = rewards
        mon.log_groups(step, rewards)
        if step == 60:
            noauth_server.stop()  # SIGTERM mid-stream
        if step == 140:
            noauth_server.start()
        time.sleep(0.01)
    assert mon.stats["retries"] > 0, "the outage was never noticed"
    mon.close(timeout=60)
    assert mon.spooled_groups == 0 and mon.dropped_groups == 0
    points = noauth_server.metrics(mon.run_id)
    assert [p["step"] for p in points] == list(range(200))
    assert all(p["n_groups"] == 8 for p in points), [p for p in points if p["n_groups"] != 8]
    assert {p["attempt"] for p in points} == {1}
    # stored exactly once: every group was new to the server once and only once
    assert mon.stats["accepted"] == 200 * 8
    for p in points[::37]:
        flat = [r for row in expected[p["step"]] for r in row]
        collapsed = sum(1 for row in expected[p["step"]] if min(row) == max(row))
        assert p["acr"] == collapsed / 8
        assert abs(p["reward_mean"] - sum(flat) / len(flat)) < 1e-12


class FlakyProxy:
    """A test double of the network, not of our code: forwards to the real server, but answers
    the first ``fail_first`` step requests with ``status`` (after the server has stored them when
    ``forward_failures``), so the client must retry and the server must see duplicates."""

    def __init__(
        self,
        upstream: str,
        fail_first: int,
        status: int = 500,
        forward_failures: bool = True,
        retry_after: str | None = None,
        chaos: float = 0.0,
    ) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.upstream, self.fail_first, self.status = upstream, fail_first, status
        # chaos: the share of requests (any endpoint) that fail at random: 503 before reaching
        # the server, 500 after it has acted, or a connection dropped after it has acted.
        self.chaos, self.rng, self.faults = chaos, random.Random(7), 0
        self.forward_failures, self.retry_after = forward_failures, retry_after
        self.step_times: list[tuple[float, int]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _relay(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                is_steps = self.path.endswith("/steps")
                fail = False
                if is_steps:
                    with lock:
                        fail = proxy.fail_first > 0
                        proxy.fail_first -= fail
                with lock:
                    fault = None
                    if proxy.rng.random() < proxy.chaos:
                        fault = proxy.rng.choice(["503", "500", "drop"])
                        proxy.faults += 1
                if fault == "503":
                    self.send_response(503)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                if not fail or proxy.forward_failures:
                    r = httpx.request(
                        method,
                        proxy.upstream + self.path,
                        content=body,
                        headers={"content-type": "application/json"},
                        timeout=30,
                    )
                status, content = (
                    (proxy.status, b'{"detail":"injected"}') if fail else (r.status_code, r.content)
                )
                if fault == "drop":
                    self.close_connection = True  # the server acted; its answer is lost
                    return
                if fault == "500":
                    status, content = 500, b"{}"
                if is_steps:
                    proxy.step_times.append((time.monotonic(), status))
                self.send_response(status)
                if fail and proxy.retry_after:
                    self.send_header("Retry-After", proxy.retry_after)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def do_POST(self):
                self._relay("POST")

            def do_GET(self):
                self._relay("GET")

        lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()


def test_500_after_store_then_200_no_duplicates(noauth_server: RestartableServer, tmp_path: Path):
    proxy = FlakyProxy(noauth_server.url, fail_first=3, status=500, forward_failures=True)
    try:
        mon = monitor(proxy.url, tmp_path, batch_interval_s=0.1)
        for step in range(30):
            mon.log_groups(step, step_rewards(step))
            time.sleep(0.01)
        mon.close(timeout=30)
    finally:
        proxy.close()
    assert [s for _, s in proxy.step_times[:3]] == [500, 500, 500]
    # The server had stored what the 500s hid: the re-sends came back as duplicates, and each
    # group was either new to the server in an answer we saw or a duplicate of a hidden one.
    assert mon.stats["duplicates"] > 0
    assert mon.stats["accepted"] + mon.stats["duplicates"] == 30 * 8
    points = noauth_server.metrics(mon.run_id)
    assert [p["step"] for p in points] == list(range(30))
    assert all(p["n_groups"] == 8 for p in points)


def test_retry_after_is_honoured(noauth_server: RestartableServer, tmp_path: Path):
    proxy = FlakyProxy(
        noauth_server.url, fail_first=1, status=503, forward_failures=False, retry_after="2"
    )
    try:
        mon = monitor(proxy.url, tmp_path)
        mon.log_groups(0, [[1.0, 0.0]])
        assert mon.flush(timeout=20)
        mon.close(timeout=10)
    finally:
        proxy.close()
    (t_fail, s_fail), (t_ok, s_ok) = proxy.step_times[:2]
    assert (s_fail, s_ok) == (503, 200)
    assert t_ok - t_fail >= 1.9


def test_full_spool_counts_and_reports_drops(tmp_path: Path):
    srv = RestartableServer(tmp_path)  # not started yet: the server is down while the run logs
    mon = monitor(srv.url, tmp_path, spool_max_bytes=20_000, batch_interval_s=0.05)
    total = 0
    for step in range(60):
        mon.log_groups(step, step_rewards(step, p=16, g=8))
        total += 16
        time.sleep(0.005)
    assert wait_for(lambda: mon.dropped_groups > 0 and not mon._worker.queue, 10)
    dropped = mon.dropped_groups
    kept = mon.spooled_groups
    assert dropped + kept == total
    srv.start()
    try:
        assert mon.flush(timeout=30)
        time.sleep(1.5)  # one heartbeat period
        with srv.api() as api:

            def reported() -> bool:
                run = api.get(f"/api/v1/runs/{mon.run_id}").json()
                return run["client"]["dropped_groups"] == dropped

            assert wait_for(reported, 10)
        mon.close(timeout=10)
        stored = sum(p["n_groups"] for p in srv.metrics(mon.run_id))
        assert stored == kept == total - dropped
        # the server has the drops, so nothing is left to keep the file for (it was kept, and
        # re-reported by every `vantage sync` of the folder: a trial)
        assert not mon.spool_path.exists()
    finally:
        srv.cleanup()


def test_refused_batch_goes_to_dead_letter_training_unaffected(
    noauth_server: RestartableServer, tmp_path: Path
):
    mon = monitor(noauth_server.url, tmp_path, batch_interval_s=0.5)
    for step in range(10):
        if step == 4:
            queue_refused_record(mon, step)
        else:
            mon.log_groups(step, step_rewards(step))
    assert mon.flush(timeout=20)
    assert mon.dead_letter_batches == 1
    path = mon.spool_path
    time.sleep(1.2)
    with noauth_server.api() as api:
        assert wait_for(
            lambda: (
                api.get(f"/api/v1/runs/{mon.run_id}").json()["client"]["dead_letter_batches"] == 1
            )
        )
    mon.close(timeout=10)
    steps = [p["step"] for p in noauth_server.metrics(mon.run_id)]
    assert steps == [s for s in range(10) if s != 4]  # the good records of that batch got in
    spool = Spool(path)
    (dead,) = spool.dead_letters()
    assert dead["status"] == 422 and dead["records"][0]["step"] == 4
    spool.close()


RANK_SCRIPT = """
import sys, time
from vantage.client import Monitor
rank = int(sys.argv[1])
mon = Monitor(sys.argv[2], None, run_name="ranks", run_id=sys.argv[3], rank=rank, world_size=2,
              spool_dir=sys.argv[4])
rewards = [[1, 1], [0, 1], [1, 0]] if rank == 0 else [[0, 0]]
mon.log_groups(5, rewards)
assert mon.flush(30), "not delivered"
print("ATTEMPT", mon.attempt)
mon.close(timeout=10, status=None)
"""


def test_two_rank_processes_share_one_attempt_and_pool(
    noauth_server: RestartableServer, tmp_path: Path
):
    run_id = str(uuid.uuid4())
    env = {**os.environ, "VANTAGE_LAUNCH_ID": "launch-" + run_id[:8]}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RANK_SCRIPT,
                str(rank),
                noauth_server.url,
                run_id,
                str(tmp_path / f"spool{rank}"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert all("ATTEMPT 1" in o for o in outs), outs
    (point,) = noauth_server.metrics(run_id)
    assert point["step"] == 5 and point["n_groups"] == 4
    assert point["acr"] == 0.5  # pooled over both ranks, not 0.667


def test_second_launch_is_a_new_attempt_that_supersedes(
    noauth_server: RestartableServer, tmp_path: Path
):
    first = monitor(noauth_server.url, tmp_path, launch_id="L1")
    for step in range(20):
        first.log_groups(step, [[0.0, 0.0], [0.0, 1.0]])
    first.close(timeout=20)
    assert first.attempt == 1
    second = monitor(noauth_server.url, tmp_path, run_id=first.run_id, launch_id="L2")
    for step in range(10, 20):
        second.log_groups(step, [[1.0, 0.0], [0.0, 1.0]])
    second.close(timeout=20)
    assert second.attempt == 2
    points = noauth_server.metrics(first.run_id)
    assert [p["step"] for p in points] == list(range(20))
    assert [p["attempt"] for p in points] == [1] * 10 + [2] * 10
    assert [p["acr"] for p in points] == [0.5] * 10 + [0.0] * 10
    # a rank of the second launch that starts later joins the same attempt
    late = monitor(
        noauth_server.url, tmp_path, run_id=first.run_id, launch_id="L2", rank=1, world_size=2
    )
    assert late.flush(20) and late.attempt == 2
    late.close(timeout=10, status=None)


def test_a_launch_superseded_while_it_sends_is_warned(
    noauth_server: RestartableServer, tmp_path: Path, caplog
):
    first = monitor(noauth_server.url, tmp_path, launch_id="L1")
    first.log_groups(0, [[0.0, 1.0]])
    assert first.flush(20) and first.attempt == 1
    with noauth_server.api() as api:
        body = {"run_id": first.run_id, "launch_id": "L2"}
        assert api.post("/api/v1/runs", json=body).json()["attempt"] == 2
    with caplog.at_level(logging.WARNING, logger="vantage"):
        for step in (1, 2, 3):
            first.log_groups(step, [[0.0, 1.0]])
            assert first.flush(20)
    # once per relaunch, whichever answer tells it first (it was said every second)
    (warning,) = [r.getMessage() for r in caplog.records if "launched again" in r.getMessage()]
    assert "(attempt 2)" in warning and "attempt 1" in warning, warning
    first.close(timeout=10, status=None)


def test_commands_delivered_once_and_acknowledged(noauth_server: RestartableServer, tmp_path: Path):
    mon = monitor(noauth_server.url, tmp_path, heartbeat_s=0.3)
    seen = []
    mon.on_command(seen.append)
    mon.log_groups(0, [[1.0, 0.0]])
    assert mon.flush(20)
    with noauth_server.api() as api:
        r = api.post(
            f"/api/v1/runs/{mon.run_id}/commands",
            json={"type": "set_sampling", "params": {"temperature": 0.7}, "reason": "t"},
        )
        assert r.status_code == 201, r.text
        command_id = r.json()["command_id"]
        got = []
        assert wait_for(lambda: got.extend(mon.poll_commands()) or got, 10)
        # re-listed by every answer until acked (at-least-once), but handed out once
        for step in range(1, 5):
            mon.log_groups(step, [[1.0, 0.0]])
        assert mon.flush(20)
        time.sleep(0.8)  # more heartbeats listing it
        assert mon.poll_commands() == []
        assert [c.command_id for c in got] == [command_id] == [c.command_id for c in seen]
        assert got[0].type == "set_sampling" and got[0].params == {"temperature": 0.7}
        # the server refuses bidi controls and NUL in a detail, and JSON cannot carry a lone
        # surrogate (the ack was lost): they are dropped, the ack kept
        mon.ack(command_id, "applied", step=5, detail="temperature\u202e 0.7\x00\ud800")
        assert mon.flush(20)
        (cmd,) = api.get(f"/api/v1/runs/{mon.run_id}/commands").json()["commands"]
        assert cmd["status"] == "applied" and cmd["acked_step"] == 5
        assert cmd["detail"] == "temperature 0.7"
    mon.close(timeout=10)


def test_close_finds_a_server_back_within_seconds(tmp_path: Path):
    """A server that comes back during close() is found within seconds: close retried on its
    backoff, which had grown to 15-30 s while the server was down (a trial waited 16 s)."""
    srv = RestartableServer(tmp_path)  # down
    mon = monitor(srv.url, tmp_path)
    for step in range(5):
        mon.log_groups(step, step_rewards(step))
    time.sleep(16)  # at least five failed tries: the next delay is 8 to 16 s, then 15 to 30
    closed = threading.Event()
    threading.Thread(target=lambda: (mon.close(timeout=90), closed.set()), daemon=True).start()
    srv.start()
    back = time.monotonic()
    try:
        assert closed.wait(60)
        assert time.monotonic() - back < 8.0
        assert [p["step"] for p in srv.metrics(mon.run_id)] == list(range(5))
    finally:
        srv.cleanup()


def test_close_is_bounded_when_the_server_is_down_then_sync_uploads(tmp_path: Path):
    srv = RestartableServer(tmp_path)
    mon = monitor(srv.url, tmp_path)
    for step in range(50):
        mon.log_groups(step, step_rewards(step))
    t0 = time.monotonic()
    mon.close(timeout=2.0)
    assert time.monotonic() - t0 < 3.0
    assert mon.spooled_groups == 50 * 8
    assert mon.spool_path.exists()
    srv.start()
    try:
        with srv.api() as api:  # what a live Monitor reports before its server went away
            body = {"run_id": mon.run_id, "launch_id": mon.launch_id, "name": "x"}
            assert api.post("/api/v1/runs", json=body).json()["attempt"] == 1
            health = {"attempt": 1, "rank": 0, "spooled_groups": 196, "dropped_groups": 0}
            api.post(f"/api/v1/runs/{mon.run_id}/heartbeat", json=health).raise_for_status()
        result = sync(tmp_path / "spool", srv.url, None)
        assert result["sent_groups"] == 400 and result["remaining_groups"] == 0, result
        assert result["errors"] == []
        assert not list((tmp_path / "spool").glob(f"*{SPOOL_SUFFIX}"))  # clean files removed
        points = srv.metrics(mon.run_id)
        assert [p["step"] for p in points] == list(range(50))
        assert all(p["n_groups"] == 8 for p in points)
        with srv.api() as api:  # the final status waited in the spool too
            run = api.get(f"/api/v1/runs/{mon.run_id}").json()
            assert run["status"] == "finished"
            assert run["client"]["spooled_groups"] == 0  # sync says the spool is empty now
    finally:
        srv.cleanup()


def test_an_outage_is_reported_while_it_lasts_and_when_it_ends(tmp_path: Path, caplog, monkeypatch):
    """The user learns that the server is down during the run, not only at close."""
    import vantage.client.worker as worker_module

    monkeypatch.setattr(worker_module, "OUTAGE_WARN_S", 1.0)
    srv = RestartableServer(tmp_path)  # not started yet
    mon = monitor(srv.url, tmp_path, batch_interval_s=0.2)

    def said(text: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if text in r.getMessage()]

    try:
        for step in range(5):
            mon.log_groups(step, step_rewards(step))
        assert wait_for(lambda: said("has failed for"), timeout=15)
        (warning,) = said("has failed for")
        assert srv.url in warning and "ConnectError" in warning, warning
        assert "training goes on" in warning and str(mon.spool_path) in warning
        assert not said("answers again")
        srv.start()
        assert wait_for(lambda: said("answers again"), timeout=60)
        assert mon.flush(timeout=30)
        assert [p["step"] for p in srv.metrics(mon.run_id)] == list(range(5))
        mon.close(timeout=10)
        assert len(said("has failed for")) == 1  # once per outage (then every 10 minutes)
    finally:
        srv.cleanup()


def test_close_is_bounded_against_a_server_that_never_answers(tmp_path: Path):
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(100)  # accepts connections into the backlog, never reads or answers
    try:
        mon = monitor(f"http://127.0.0.1:{hole.getsockname()[1]}", tmp_path)
        mon.log_groups(0, [[1.0, 0.0]])
        t0 = time.monotonic()
        mon.close(timeout=1.5)
        assert time.monotonic() - t0 < 2.5
        assert mon.spooled_groups == 1
    finally:
        hole.close()


def test_unreachable_server_never_blocks_logging(tmp_path: Path):
    mon = monitor(f"http://127.0.0.1:{free_port()}", tmp_path)
    t0 = time.perf_counter()
    for step in range(200):
        mon.log_groups(step, step_rewards(step))
    assert time.perf_counter() - t0 < 1.0
    mon.close(timeout=0.5)


@pytest.mark.parametrize("strict", [False, True])
def test_non_finite_scalars_reach_the_server_as_non_finite(
    noauth_server: RestartableServer, tmp_path: Path, strict: bool
):
    """docs/design.md §5: a non-finite scalar is sent and stored as non-finite, never dropped
    or made finite; the API answers it as "NaN", "Infinity" or "-Infinity"."""
    np = pytest.importorskip("numpy")
    with monitor(noauth_server.url, tmp_path, strict=strict) as mon:
        mon.log_groups(1, [[0.0, 1.0]])
        mon.log_scalars(
            1,
            {
                "loss": float("nan"),
                "grad_norm": float("inf"),
                "kl": -float("inf"),
                "entropy": np.float32("nan"),
                "reward_scale": 10**400,  # an integer past float64: Infinity, as 1e400 in JSON
                "lr": 1e-6,
            },
        )
        mon.log_scalars(2, {"loss": np.array(float("nan"))})  # no groups: the step still arrives
    points = {p["step"]: p for p in noauth_server.metrics(mon.run_id)}
    assert points[1]["scalars"] == {
        "loss": "NaN",
        "grad_norm": "Infinity",
        "kl": "-Infinity",
        "entropy": "NaN",
        "reward_scale": "Infinity",
        "lr": 1e-6,
    }
    assert points[2]["scalars"] == {"loss": "NaN"}
    assert mon.stats["rejected_calls"] == 0


def test_effective_scalars_and_finish_reach_the_server(
    noauth_server: RestartableServer, tmp_path: Path
):
    config = {"lr": 1e-4, "obj": object()}
    with monitor(noauth_server.url, tmp_path, config=config, tags="prod") as mon:
        mon.log_groups(0, [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.5, 0.0]])
        mon.log_effective(0, n_valid=4, n_zero_advantage=1, n_virtual=2)
        mon.log_scalars(0, {"loss": 0.5, "kl": torch_free_number(0.01)})
    (point,) = noauth_server.metrics(mon.run_id)
    assert point["acr"] == 0.5 and point["acr_effective"] == 0.25
    assert point["scalars"] == {"loss": 0.5, "kl": 0.01}
    with noauth_server.api() as api:
        run = api.get(f"/api/v1/runs/{mon.run_id}").json()
    assert run["status"] == "finished" and run["attempt"] == 1
    assert run["tags"] == ["prod"]  # one string is one tag (it was one tag per character)


def test_a_steps_first_effective_report_is_kept_within_a_batch_too(
    noauth_server: RestartableServer, tmp_path
):
    """Two reports for one step in one batch: the client kept the last, the server keeps a
    rank's first (README), so the answer hung on the batching. The mitigation in effect is
    the latest reported, in a batch or not."""
    with monitor(noauth_server.url, tmp_path, batch_interval_s=60) as mon:
        mon.log_groups(2, [[1.0, 0.0]] * 4)
        mon.log_effective(2, n_valid=4, n_zero_advantage=1, mitigation={"mode": "avspo"})
        mon.log_effective(2, n_valid=4, n_zero_advantage=3, mitigation={"mode": "none"})
    (point,) = noauth_server.metrics(mon.run_id)
    assert point["acr_effective"] == 0.25
    with noauth_server.api() as api:
        run = api.get(f"/api/v1/runs/{mon.run_id}").json()
    assert run["mitigation_reported"] == {"mode": "none"}


@pytest.mark.parametrize(("ending", "with_block", "status"), [
    ("pass", False, "finished"),
    ("raise RuntimeError('CUDA out of memory')", False, "failed"),
    ("raise KeyboardInterrupt", False, "failed"),  # Ctrl-C
    # IPython imported by a library (tqdm.auto does) in a plain script: still a script
    ("sys.modules['IPython'] = type(sys)('IPython'); sys.modules['IPython'].get_ipython = "
     "lambda: None; raise RuntimeError('x')", False, "failed"),
    ("sys.exit(0)", True, "finished"),
    ("sys.exit(3)", True, "failed"),
])  # fmt: skip
def test_the_run_ends_failed_when_an_error_ends_the_program(
    noauth_server: RestartableServer, tmp_path: Path, ending: str, with_block: bool, status: str
):
    """A program that never calls close() had its run marked `finished` at exit even when an
    exception or Ctrl-C ended it (a trial): an uncaught error now marks it `failed`, and so does
    `sys.exit(n)` out of a `with Monitor(...)` block, for n other than 0."""
    make = f"Monitor({noauth_server.url!r}, None, run_name='ending', spool_dir={str(tmp_path)!r})"
    lines = ["import sys", "from vantage.client import Monitor"]
    lines += [f"with {make} as mon:"] if with_block else [f"mon = {make}", "if True:"]
    lines += ["    print(mon.run_id, flush=True)", "    mon.log_groups(0, [[1, 0], [1, 1]])"]
    lines += [f"    {ending}"]
    proc = subprocess.run([sys.executable, "-c", "\n".join(lines)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    run_id = proc.stdout.split()[0]
    with noauth_server.api() as api:
        run = api.get(f"/api/v1/runs/{run_id}").json()
    assert run["status"] == status, proc.stderr
    assert run["last_step"] == 0


def test_a_forked_child_that_exits_leaves_the_run_to_its_parent(
    noauth_server: RestartableServer, tmp_path
):
    """A child forked after the Monitor was made ran its exit hook: it warned of groups "not
    on the server yet" that the parent had sent, and could end the run under the parent."""
    script = f"""
import os, sys
from vantage.client import Monitor
mon = Monitor({noauth_server.url!r}, None, run_name='forked', spool_dir={str(tmp_path)!r})
print(mon.run_id, flush=True)
for step in range(5):
    mon.log_groups(step, [[1, 0], [1, 1]])
pid = os.fork()
if pid == 0:
    sys.exit(0)
os.waitpid(pid, 0)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "not on the server" not in proc.stderr, proc.stderr
    assert proc.stderr.count("vantage:") == 0, proc.stderr
    run_id = proc.stdout.split()[0]
    with noauth_server.api() as api:
        run = api.get(f"/api/v1/runs/{run_id}").json()
    assert run["status"] == "finished" and run["last_step"] == 4


def torch_free_number(x: float):
    """A number-like object that is not a float (as a 0-d tensor would be)."""

    class Number:
        def __float__(self) -> float:
            return x

    return Number()


def test_sender_sleeps_when_idle_and_when_backing_off(
    noauth_server: RestartableServer, tmp_path: Path
):
    """The sender thread waits on events and timers; it never spins."""
    for url in (noauth_server.url, f"http://127.0.0.1:{free_port()}"):  # server up, then down
        mon = monitor(url, tmp_path / str(len(url)), heartbeat_s=0.5)
        mon.log_groups(0, [[1.0, 0.0]])
        time.sleep(0.5)
        clock = time.pthread_getcpuclockid(mon._worker.thread.ident)
        cpu0 = time.clock_gettime(clock)
        time.sleep(2.0)
        used = time.clock_gettime(clock) - cpu0
        mon.close(timeout=1)
        assert used < 0.1, f"sender used {used:.3f} s of CPU in 2 s against {url}"


def test_server_with_a_new_database_gets_the_run_created_again(
    own_noauth_server: RestartableServer, tmp_path: Path
):
    noauth_server = own_noauth_server
    mon = monitor(noauth_server.url, tmp_path, batch_interval_s=0.1)
    for step in range(10):
        mon.log_groups(step, step_rewards(step))
    assert mon.flush(20)
    noauth_server.stop()
    noauth_server.wipe_database()  # the server loses everything
    noauth_server.start()
    for step in range(10, 20):
        mon.log_groups(step, step_rewards(step))
    mon.close(timeout=30)
    assert mon.dead_letter_batches == 0 and mon.spooled_groups == 0
    points = noauth_server.metrics(mon.run_id)
    assert [p["step"] for p in points] == list(range(10, 20))  # 404 → run created again → sent
    assert all(p["n_groups"] == 8 for p in points)


def test_a_spool_kept_for_its_drops_goes_once_the_server_has_them(
    noauth_server: RestartableServer, tmp_path: Path
):
    """An offline run with an unreadable group keeps its file after close (the server has not
    heard of the drop); the sync that reports it removes the file, so a second sync finds
    nothing (every sync of the folder reported the same drop again: a trial)."""
    offline = Monitor(None, None, run_name="drops", spool_dir=tmp_path / "spool")
    offline.log_groups(0, [[1, 0], [1, 1]])
    offline.log_groups(1, [["1", "0"]])  # strings: dropped by the sender, counted
    offline.close(timeout=5)
    assert offline.spool_path.exists() and offline.dropped_groups == 1
    first = sync(tmp_path / "spool", noauth_server.url)
    assert first["sent_groups"] == 2 and first["dropped_groups"] == 1 and not first["failed"]
    with noauth_server.api() as api:
        assert api.get(f"/api/v1/runs/{offline.run_id}").json()["client"]["dropped_groups"] == 1
    assert not offline.spool_path.exists()
    assert sync(tmp_path / "spool", noauth_server.url)["dropped_groups"] == 0
    # nothing but an unreadable group: the run the sync registers ends too (it stayed running)
    unread = Monitor(None, None, run_name="unread", spool_dir=tmp_path / "spool")
    unread.log_groups(0, [["x", "y"]])
    unread.close(timeout=5)
    assert sync(tmp_path / "spool", noauth_server.url)["dropped_groups"] == 1
    with noauth_server.api() as api:
        run = api.get(f"/api/v1/runs/{unread.run_id}").json()
    assert run["status"] == "finished" and run["client"]["dropped_groups"] == 1


def test_vantage_sync_cli_uploads_an_offline_spool(
    noauth_server: RestartableServer, tmp_path: Path
):
    offline = Monitor(None, None, run_name="offline", spool_dir=tmp_path / "spool")
    for step in range(5):
        offline.log_groups(step, step_rewards(step))
    offline.close(timeout=5)
    vantage = str(Path(sys.executable).with_name("vantage"))
    proc = subprocess.run([vantage, "sync", str(tmp_path / "spool"), "--server", noauth_server.url],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["sent_groups"] == 40 and not result["failed"]
    assert [p["n_groups"] for p in noauth_server.metrics(offline.run_id)] == [8] * 5
    with noauth_server.api() as api:
        assert api.get(f"/api/v1/runs/{offline.run_id}").json()["status"] == "finished"
    env = {**os.environ, "VANTAGE_SERVER": noauth_server.url}  # the default of --server
    proc = subprocess.run([vantage, "sync", str(tmp_path / "spool")],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    again = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (again["files"], again["server"]) == (0, noauth_server.url)  # nothing left
    proc = subprocess.run([vantage, "sync", str(tmp_path / "spool"), "--server", "127.0.0.1:8000"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "not an http:// or https:// URL" in proc.stderr, proc.stderr


def test_sync_of_a_launch_older_than_the_runs_newest_attempt_keeps_it(
    noauth_server: RestartableServer, tmp_path: Path
):
    """A spool written while the server was down, synced after a relaunch had registered,
    became the newest attempt: its old steps replaced the relaunch's and the finished run
    turned failed. The server refuses it; sync names the file and keeps it."""
    old = Monitor(
        None, None, run_name="relaunched", launch_id="first", spool_dir=tmp_path / "spool"
    )
    for step in range(5):
        old.log_groups(step, step_rewards(step))
    old.close(timeout=5, status="failed")
    spool = Spool(old.spool_path)  # began two hours ago (a test cannot wait that long)
    spool.set_meta("run", {**spool.get_meta("run"), "started_at": time.time() - 7200})
    spool.close()
    relaunch = Monitor(noauth_server.url, None, run_id=old.run_id, run_name="relaunched",
                       launch_id="second", spool_dir=tmp_path / "live")  # fmt: skip
    for step in range(3, 6):
        relaunch.log_groups(step, [[0.0, 1.0]] * 8)
    relaunch.close(timeout=10)
    result = sync(tmp_path / "spool", noauth_server.url, None)
    assert result["failed"] and result["sent_groups"] == 0, result
    (error,) = result["errors"]
    assert "before attempt 1" in error and old.spool_path.name in error, error
    assert old.spool_path.exists() and Spool(old.spool_path).pending_groups == 40
    with noauth_server.api() as api:
        run = api.get(f"/api/v1/runs/{old.run_id}").json()
    assert (run["attempt"], run["status"], run["last_step"]) == (1, "finished", 5)
    assert all(p["acr"] == 0.0 for p in noauth_server.metrics(old.run_id))


def test_sync_skips_a_spool_file_it_cannot_read_and_uploads_the_others(
    noauth_server: RestartableServer, tmp_path: Path
):
    spool_dir = tmp_path / "spool"
    offline = Monitor(None, None, run_name="next-to-garbage", spool_dir=spool_dir)
    offline.log_groups(0, step_rewards(0))
    offline.close(timeout=5)
    (good,) = spool_dir.glob("*.vantage-spool")
    (spool_dir / "aaaa.r0.vantage-spool").write_bytes(b"garbage\n")  # not SQLite at all
    (spool_dir / "zzzz.r0.vantage-spool").write_bytes(good.read_bytes()[:6000])  # cut short
    result = sync(spool_dir, noauth_server.url, None)  # the test server runs without auth
    # one file, as a Monitor's close warning names it: the folder's others are not touched
    only = sync(spool_dir / "aaaa.r0.vantage-spool", noauth_server.url, None)
    assert only["files"] == 1 and "aaaa.r0.vantage-spool" in only["errors"][0]
    assert result["files"] == 3 and result["sent_groups"] == 8 and result["failed"]
    unreadable = [e for e in result["errors"] if "not a readable spool file" in e]
    assert len(unreadable) == 2 and "aaaa.r0.vantage-spool" in unreadable[0], result["errors"]
    assert [p["n_groups"] for p in noauth_server.metrics(offline.run_id)] == [8]
    assert (spool_dir / "aaaa.r0.vantage-spool").exists()  # left for a person to look at


def test_sync_names_and_keeps_damaged_or_foreign_files_and_uploads_the_others(
    noauth_server: RestartableServer, tmp_path: Path
):
    """A batch whose body was damaged crashed `vantage sync` with a traceback, and an empty or
    foreign SQLite file was deleted after being named in `errors` (a trial)."""
    import sqlite3

    spool_dir = tmp_path / "spool"
    runs = []
    for name in ("damaged", "good"):
        mon = Monitor(None, None, run_name=name, spool_dir=spool_dir)
        mon.log_groups(0, step_rewards(0))
        mon.close(timeout=5)
        runs.append(mon.run_id)
    (damaged,) = spool_dir.glob(f"{runs[0]}*{SPOOL_SUFFIX}")
    (good,) = spool_dir.glob(f"{runs[1]}*{SPOOL_SUFFIX}")
    with sqlite3.connect(damaged) as db:
        db.execute("UPDATE batches SET body = X'00ff00ff'")
    with sqlite3.connect(spool_dir / f"foreign{SPOOL_SUFFIX}") as db:
        db.execute("CREATE TABLE t (x)")
    (spool_dir / f"empty{SPOOL_SUFFIX}").write_bytes(b"")
    result = sync(spool_dir, noauth_server.url, None)
    assert result["files"] == 4 and result["sent_groups"] == 8 and result["failed"]
    named = " ".join(result["errors"])
    for path in (spool_dir / damaged.name, spool_dir / f"foreign{SPOOL_SUFFIX}",
                 spool_dir / f"empty{SPOOL_SUFFIX}"):  # fmt: skip
        assert path.name in named and path.exists(), (path.name, result["errors"])
    assert "could not be replayed" in named
    assert not (spool_dir / good.name).exists()  # uploaded and done


def test_every_rank_reports_its_spool_empty_when_it_closes(
    noauth_server: RestartableServer, tmp_path: Path
):
    """Rank 1 never sends the final status, but its last counts still reach the run's client
    health (the earlier heartbeat's 20 waiting groups stayed on the run page for good)."""
    rank0 = monitor(noauth_server.url, tmp_path / "r0", rank=0, world_size=2, launch_id="two-ranks")
    run_id = rank0.run_id
    rank1 = monitor(noauth_server.url, tmp_path / "r1", rank=1, world_size=2, launch_id="two-ranks",
                    run_id=run_id)  # fmt: skip
    ranks = [rank0, rank1]
    for mon in ranks:
        mon.log_groups(0, step_rewards(0))
        assert mon.flush(30), mon.last_error
    with noauth_server.api() as api:  # what a heartbeat said while rank 1's queue was full
        body = {"attempt": 1, "rank": 1, "spooled_groups": 20}
        api.post(f"/api/v1/runs/{run_id}/heartbeat", json=body).raise_for_status()
        assert api.get(f"/api/v1/runs/{run_id}").json()["client"]["spooled_groups"] == 20
        for mon in reversed(ranks):
            mon.close(timeout=10)
        run = api.get(f"/api/v1/runs/{run_id}").json()
    assert run["client"]["spooled_groups"] == 0 and run["status"] == "finished"


def test_sync_to_a_server_that_never_answers_stops_after_the_first_file(tmp_path: Path):
    """One file's whole timeout without an answer: the other files are not tried (each took
    the whole timeout, silently), and say so."""
    for name in ("a", "b", "c"):
        offline = Monitor(None, None, run_name=name, spool_dir=tmp_path / "spool")
        offline.log_groups(0, step_rewards(0))
        offline.close(timeout=5)
    t0 = time.monotonic()
    result = sync(tmp_path / "spool", f"http://127.0.0.1:{free_port()}", None, timeout=2.0)
    assert time.monotonic() - t0 < 6.0
    assert result["failed"] and result["files"] == 3 and result["remaining_groups"] == 3 * 8
    assert sum("not tried (the server did not answer in 2 s)" in e for e in result["errors"]) == 2
    assert sum("gave up: ConnectError" in e for e in result["errors"]) == 1, result["errors"]


def test_random_faults_on_every_endpoint_store_every_group_once(
    noauth_server: RestartableServer, tmp_path: Path
):
    proxy = FlakyProxy(noauth_server.url, fail_first=0, chaos=0.3)
    try:
        mon = monitor(proxy.url, tmp_path, batch_interval_s=0.05, heartbeat_s=0.2)
        for step in range(30):
            mon.log_groups(step, step_rewards(step))
            time.sleep(0.01)
        assert mon.flush(60), mon.last_error
        mon.close(timeout=30)
    finally:
        proxy.close()
    assert proxy.faults > 5
    assert mon.spooled_groups == 0 and mon.dead_letter_batches == 0
    points = noauth_server.metrics(mon.run_id)
    assert [p["step"] for p in points] == list(range(30))
    assert all(p["n_groups"] == 8 for p in points)
    assert {p["attempt"] for p in points} == {1}  # retried run creation kept one attempt


def test_close_says_the_run_was_refused_not_that_the_server_was_unreachable(tmp_path: Path, caplog):
    """A wrong key: the server answers 401 to the run, and the warning at close names that
    refusal (it used to blame the network), with the groups kept in the spool to sync."""
    from tests.helpers.server import start_server

    srv = start_server(f"sqlite:///{tmp_path / 'auth.db'}", tmp_path)  # auth on, no keys
    try:
        mon = Monitor(srv.url, "vtg_" + "x" * 40, spool_dir=tmp_path / "spool", run_name="k")
        mon.log_groups(0, [[1.0, 0.0]] * 3)
        mon.close(timeout=5)
    finally:
        srv.stop()
    message = next(r.getMessage() for r in caplog.records if "not on the server yet" in r.message)
    assert f"server {srv.url} refused the run: HTTP 401" in message, message
    assert "not reachable" not in message
    assert mon.spooled_groups == 3


def test_close_says_when_only_the_runs_end_is_left(tmp_path: Path, caplog):
    """Every group on the server, the server gone before the finish: close said nothing and the
    run stayed `running`; it now says so, and `vantage sync` sends the end."""
    from tests.helpers.cli import run_cli
    from tests.helpers.server import start_server

    url = f"sqlite:///{tmp_path / 'end.db'}"
    srv = start_server(url, tmp_path, "--insecure-no-auth")
    mon = Monitor(srv.url, None, spool_dir=tmp_path / "spool", run_name="end", heartbeat_s=60)
    mon.log_groups(0, [[1.0, 0.0]])
    assert mon.flush(20)
    srv.stop()
    mon.close(timeout=3)
    (said,) = [r.getMessage() for r in caplog.records if "run's end" in r.getMessage()]
    assert "every group is on the server, but the run's end (finished) is not on" in said, said
    assert f"vantage sync {mon.spool_path}" in said, said
    srv = start_server(url, tmp_path, "--insecure-no-auth", log_name="again.log")
    try:
        run_cli("sync", str(mon.spool_path), "--server", srv.url)
        assert httpx.get(f"{srv.url}/api/v1/runs/{mon.run_id}").json()["status"] == "finished"
    finally:
        srv.stop()


def test_close_does_not_say_dropped_groups_are_on_the_server(tmp_path: Path, caplog):
    """Every group dropped (a full spool, no server ever reached): close said "every group is
    on the server" (a trial)."""
    mon = monitor(f"http://127.0.0.1:{free_port()}", tmp_path, spool_max_bytes=200)
    mon.log_groups(0, step_rewards(0, p=16, g=8))
    assert wait_for(lambda: mon.dropped_groups == 16, 10)
    mon.close(timeout=0)
    (said,) = [r.getMessage() for r in caplog.records if "run's end" in r.getMessage()]
    assert "no group is left to send (16 were dropped" in said, said
    assert "every group is on the server" not in said


def test_a_revoked_key_keeps_the_data_in_the_spool_for_sync(tmp_path: Path, caplog, monkeypatch):
    """A 401 refuses the key, not the batch: the batch stays in the spool (flush() is False),
    and `vantage sync` with a good key uploads it. It was a dead letter that nothing resent,
    while flush() said True (found by a fresh-user trial)."""
    from tests.helpers.cli import create_key, run_cli
    from tests.helpers.server import start_server

    url = f"sqlite:///{tmp_path}/k.db"
    run_cli("db", "upgrade", "--database-url", url)
    temp, good = create_key(url, "ingest,read", "temp"), create_key(url, "ingest,read", "good")
    srv = start_server(url, tmp_path)
    from vantage.client import worker as worker_module

    monkeypatch.setattr(worker_module, "OUTAGE_WARN_S", 0.5)
    try:
        mon = Monitor(srv.url, temp, run_name="revoked", spool_dir=tmp_path / "spool")
        mon.log_groups(1, [[0, 1]])
        assert mon.flush(20)
        run_cli("keys", "revoke", "temp", "--database-url", url)
        mon.log_groups(2, [[0, 1]])
        mon.log_groups(3, [[1, 1]])
        assert not mon.flush(3)
        # the server answers: it refuses the key, it has not "failed" (a trial)
        lasting = [r.getMessage() for r in caplog.records if " for " in r.getMessage()]
        assert any("has refused the API key for" in m for m in lasting), lasting
        assert not any("has failed for" in m for m in lasting), lasting
        assert mon.dead_letter_batches == 0 and mon.spooled_groups == 2
        t0 = time.monotonic()
        mon.close(timeout=60)
        assert time.monotonic() - t0 < 15  # it waited all 60 s for a key that stays revoked
        # the close warning names the refused key, not the network (a trial)
        left = next(r.getMessage() for r in caplog.records if "not on the server yet" in r.message)
        assert f"server {srv.url} refuses the API key: HTTP 401" in left, left
        synced = run_cli("sync", str(mon.spool_path), "--server", srv.url, "--api-key", good)
        assert json.loads(synced.stdout.strip().splitlines()[-1])["sent_groups"] == 2
        points = httpx.get(
            f"{srv.url}/api/v1/runs/{mon.run_id}/metrics",
            headers={"Authorization": f"Bearer {good}"},
        ).json()["points"]
        assert [p["step"] for p in points] == [1, 2, 3]
    finally:
        srv.stop()


def test_close_without_a_time_limit_waits_for_the_server(
    noauth_server: RestartableServer, tmp_path: Path
):
    """close(timeout=math.inf) raised OverflowError (a trial); it now waits until all is sent,
    and a timeout of NaN or below 0 spools at once."""
    mon = monitor(noauth_server.url, tmp_path)
    for step in range(3):
        mon.log_groups(step, step_rewards(step))
    mon.close(timeout=float("inf"))
    assert mon.spooled_groups == 0 and [p["step"] for p in noauth_server.metrics(mon.run_id)] == [
        0,
        1,
        2,
    ]
    for timeout in (float("nan"), -1.0):
        late = Monitor(None, run_name="no-wait", spool_dir=str(tmp_path / "s2"))
        late.log_groups(0, step_rewards(0))
        t0 = time.monotonic()
        assert late.flush(timeout) is False
        late.close(timeout=timeout)
        assert time.monotonic() - t0 < 1.0 and late.spooled_groups == 8


def test_close_with_no_time_then_exit_spools_everything(tmp_path: Path):
    """close(timeout=0) right before the process exits lost about a fifth of 12,000 groups: the
    exit handler stopped the sender while it was still spooling (a trial)."""
    script = (
        "from vantage.client import Monitor\n"
        f"mon = Monitor(server=None, run_name='x', spool_dir={str(tmp_path)!r})\n"
        "for s in range(1, 3001):\n"
        "    mon.log_groups(s, [[0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 1], [1, 0, 0, 1]])\n"
        "    mon.log_scalars(s, {'loss': 1 / s})\n"
        "mon.close(timeout=0)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, timeout=120)
    (path,) = tmp_path.glob(f"*{SPOOL_SUFFIX}")
    spool = Spool(path)
    try:
        assert spool.pending_groups == 12_000 and spool.dropped_groups == 0
    finally:
        spool.close()


def test_close_without_waiting_says_the_sender_goes_on(
    noauth_server: RestartableServer, tmp_path: Path, caplog
):
    """close(timeout=0) returns at once, but the sender goes on sending while the process lives,
    so the spool file that the warning names may be sent and gone by the time a user runs the
    sync it suggests (a trial): the warning says so."""
    mon = monitor(noauth_server.url, tmp_path)
    for step in range(3):
        mon.log_groups(step, step_rewards(step))
    mon.close(timeout=0)
    message = next(r.getMessage() for r in caplog.records if "not on the server yet" in r.message)
    assert "the sender goes on while this process lives" in message, message
    deadline = time.monotonic() + 20
    while len(noauth_server.metrics(mon.run_id)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [p["step"] for p in noauth_server.metrics(mon.run_id)] == [0, 1, 2]


def test_sync_leaves_a_spool_that_a_live_monitor_is_writing(
    noauth_server: RestartableServer, tmp_path: Path
):
    """`vantage sync` of the spool folder replayed and deleted the file of a trainer still
    running against a dead server: everything it logged afterwards was lost (two trials). A
    live Monitor holds its file; sync names it and leaves it, and uploads it once the trainer
    has ended. A second Monitor of the same run, launch and rank spools to a file of its own."""
    spool_dir = tmp_path / "spool"
    twin = Monitor(None, None, run_name="twin", launch_id="l1", spool_dir=spool_dir)
    other = Monitor(None, None, run_id=twin.run_id, launch_id="l1", spool_dir=spool_dir)
    assert other.spool_path != twin.spool_path
    for m in (twin, other):
        m.close(timeout=1)
        m.spool_path.unlink(missing_ok=True)

    trainer = f"""
import random, sys
from vantage.client import Monitor
def rewards(step):
    rng = random.Random(step)
    return [[float(rng.random() < 0.5) for _ in range(4)] for _ in range(8)]
mon = Monitor("http://127.0.0.1:{free_port()}", None, run_name="still-training",
              spool_dir={str(spool_dir)!r})
for step in range(3):
    mon.log_groups(step, rewards(step))
print(mon.run_id, flush=True)
sys.stdin.readline()  # the test syncs meanwhile
for step in range(3, 6):
    mon.log_groups(step, rewards(step))
mon.close(timeout=1)
"""
    proc = subprocess.Popen([sys.executable, "-c", trainer], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    run_id = proc.stdout.readline().strip()
    vantage = str(Path(sys.executable).with_name("vantage"))
    synced = subprocess.run([vantage, "sync", str(spool_dir), "--server", noauth_server.url],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    proc.communicate("go on\n", timeout=120)
    # not a failure (a cron sync of a shared folder exits 0); the file is named and left
    assert synced.returncode == 0, synced.stdout + synced.stderr
    result = json.loads(synced.stdout.strip().splitlines()[-1])
    assert (result["sent_groups"], result["errors"]) == (0, []), result
    assert len(result["in_use"]) == 1 and "a running process holds" in synced.stderr
    result = sync(spool_dir, noauth_server.url, None)  # the trainer has ended
    assert (result["sent_groups"], result["failed"]) == (48, False), result
    assert [p["n_groups"] for p in noauth_server.metrics(run_id)] == [8] * 6
