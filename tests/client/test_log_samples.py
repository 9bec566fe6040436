"""``Monitor.log_samples`` against a real `vantage serve` (docs/design.md §5 'Samples'): text
cut with a marker, a few per step, bad calls skipped and counted, never a crash."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from vantage.client import Monitor
from vantage.client.sample_outbox import SampleOutbox
from vantage.client.samples import MAX_SAMPLE_CHARS, truncate
from vantage.client.throttle import Throttle
from vantage.client.transport import Transport

from tests.helpers.server import RestartableServer


def test_truncate_keeps_the_start_and_says_how_much_was_cut():
    text, cut = truncate("a" * 5000, 100)
    assert cut and len(text) <= 100
    assert text.startswith("a" * 70) and text.endswith(
        f"[{5000 - text.index('…'):,} characters cut]"
    )
    assert truncate("short", 100) == ("short", False)


def test_samples_reach_the_server_cut_counted_and_never_raised(
    noauth_server: RestartableServer, tmp_path: Path
):
    mon = Monitor(
        noauth_server.url, None, run_name="samples", spool_dir=tmp_path, samples_per_step=2
    )
    mon.log_groups(3, [[1.0, 1.0]], prompt_ids=["p7"])
    mon.log_samples(3, "2+2=", ["4", "x" * 10_000], [1.0, float("nan")], prompt_id="p7")
    mon.log_samples(3, "3+3=", ["6"], [1], prompt_id=8)
    mon.log_samples(3, "4+4=", ["8"], [1])  # a third at step 3: over samples_per_step
    mon.log_samples(4, "bad", ["a", "b"], [1.0])  # one reward for two completions
    mon.log_samples(4, "bad", "ab", [1.0, 0.0])  # a string is no list of completions
    mon.log_samples(4, None, ["a"], [1.0])  # no prompt text
    mon.close(timeout=20)
    assert mon.samples_sent == 2 and mon.samples_dropped == 1
    assert mon.stats["rejected_calls"] == 3
    with httpx.Client(base_url=noauth_server.url) as api:
        got = api.get(f"/api/v1/runs/{mon.run_id}/samples", params={"prompt_id": "p7"}).json()
    (sample,) = got["samples"]
    assert sample["prompt"] == "2+2=" and sample["rewards"] == [1.0, "NaN"]
    long = sample["completions"][1]
    assert len(long) <= MAX_SAMPLE_CHARS and long.endswith("characters cut]")


def test_strict_raises_a_bad_call(tmp_path: Path):
    mon = Monitor(None, run_name="strict", spool_dir=tmp_path, strict=True)
    with mon, pytest.raises(ValueError, match="1 rewards for 2 completions"):
        mon.log_samples(1, "p", ["a", "b"], [1.0])


def test_samples_a_server_refuses_are_dropped_and_counted_once(noauth_server: RestartableServer):
    """A 404 (a server older than this client has no samples endpoint; here, no such run)
    drops what waits and every later sample, each counted; nothing raises."""
    outbox = SampleOutbox(Throttle())
    for _ in range(3):
        outbox.add(1, "train", 0, 8, "p", ["a"], [1.0])
    with Transport(noauth_server.url) as transport:
        assert outbox.send(transport, "no-such-run", 1) is None
    assert outbox.dropped == 3 and outbox.sent == 0 and not outbox.waiting
    assert outbox.put({"step": 2}) is False and outbox.dropped == 4
