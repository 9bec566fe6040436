"""Pure parts of alerting, without a server: window metrics against the client's reference
implementation, reward_drop by hand, webhook target checks."""

from __future__ import annotations

import random

import orjson
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session
from vantage.client.acr import window_metrics
from vantage.server.alerts.metrics import Window, reward_drop, series_values
from vantage.server.alerts.targets import RefusedTarget, check_target
from vantage.server.db import make_engine
from vantage.server.migrate import upgrade
from vantage.server.models import Run, Step


def test_reward_drop_by_hand():
    unit = (0.0, 1.0)  # reward_min, reward_max
    assert reward_drop([0.8] * 5, unit) is None  # no earlier 5-step mean yet
    # best 5-step mean 0.8, latest 5-step mean (0.8·2 + 0.2·3)/5 = 0.44 → (0.8−0.44)/0.8 = 0.45
    assert reward_drop([0.8] * 10 + [0.2] * 3, unit) == pytest.approx(0.45)
    assert reward_drop([0.8] * 10 + [0.2] * 5, unit) == pytest.approx(0.75)
    assert reward_drop([0.8] * 10 + [0.2] * 5, (0.2, 1.0)) == pytest.approx(1.0)  # to the floor
    assert reward_drop([0.0] * 10, unit) is None  # nothing to drop from


def test_reward_drop_needs_a_tenth_of_the_range_to_lose():
    """A reward hovering just above reward_min (0.03 to 0.06 of a 0-1 range) lost "half its
    height" every few steps, and the built-in rule fired and resolved 14 times in 300 steps."""
    assert reward_drop([0.06] * 10 + [0.02] * 5, (0.0, 1.0)) is None
    assert reward_drop([0.1] * 10 + [0.02] * 5, (0.0, 1.0)) == pytest.approx(0.8)
    assert reward_drop([0.06] * 10 + [0.02] * 5, (0.0, 0.1)) == pytest.approx(2 / 3)  # its range


def test_reward_drop_of_huge_rewards_is_finite_or_none():
    """Five reward_means near the float64 limit overflowed math.fsum, and the OverflowError
    stopped every rule of the run (found by a new-user trial with rewards of 1e308)."""
    top = 1.7976931348623157e308
    assert reward_drop([top] * 10 + [0.0] * 5, (0.0, top)) == 1.0
    assert reward_drop([top] * 10 + [top / 2] * 5, (0.0, 1.0)) == 0.5
    assert reward_drop([top] * 10 + [0.0] * 5, (-top, top)) == 0.5  # best − reward_min: 2·top
    assert reward_drop([top] * 10 + [-top] * 5, (0.0, top)) == 2.0  # best − m5: 2·top
    assert reward_drop([5e-324] * 10 + [0.0] * 5, (0.0, 5e-324)) == 1.0  # subnormal


def test_series_values_match_window_metrics(tmp_path):
    url = f"sqlite:///{tmp_path / 'w.db'}"
    upgrade(url)
    engine = make_engine(url)
    rng = random.Random(7)
    rows = []
    with Session(engine) as s:
        s.add(Run(id="r", name="r", tags=[], client_health={}))
        for step in range(1, 161):
            valid = rng.randint(0, 8)
            collapsed = rng.randint(0, valid)
            acr = collapsed / valid if valid else None
            reward = rng.random()
            rows.append({"acr": acr, "n_collapsed": collapsed, "n_valid": valid, "reward": reward})
            s.add(
                Step(
                    run_id="r",
                    split="train",
                    step=step,
                    attempt=1,
                    ranks=[0],
                    acc={},
                    effective_by_rank={},
                    scalars={},
                    n_valid=valid,
                    n_collapsed=collapsed,
                    acr=acr,
                    reward_mean=reward,
                )
            )
        s.commit()
        run = s.get(Run, "r")
        needs = {"acr_pooled", "acr_100", "acr_ema", "acr_volatility", "acr_streak", "reward_drop"}
        rewards = [r["reward"] for r in rows]
        # Batches and single steps, on short histories (read whole) and long ones: all match
        # the reference implementation.
        early, _ = series_values(s, run, "train", list(range(1, 41)), needs)
        late, _ = series_values(s, run, "train", list(range(90, 161)), needs)
        for step in (1, 5, 30, 40, 61, 90, 100, 120, 160):
            expected = window_metrics(rows[:step])
            batch = early if step <= 40 else late if step >= 90 else {}
            single, _ = series_values(s, run, "train", [step], needs)
            for got in [g[step] for g in (batch, single) if step in g]:
                for name, value in expected.items():
                    assert got[name] == pytest.approx(value), (step, name)
                assert got["reward_drop"] == pytest.approx(
                    reward_drop(rewards[:step][-25:], (0.0, 1.0))
                )
        # The fast path: walking on from a kept window (through its JSON form) in chunks.
        by_step = {r.step: r for r in s.scalars(select(Step).where(Step.run_id == "r"))}
        window, step = Window(), 1
        while step <= 160:
            chunk = [by_step[k] for k in range(step, min(step + rng.randint(1, 9), 161))]
            got = window.walk(chunk, needs, (0.0, 1.0))
            window = Window.load(orjson.loads(orjson.dumps(window.dump())))
            for r in chunk:
                for name, value in window_metrics(rows[: r.step]).items():
                    assert got[r.step][name] == pytest.approx(value), (r.step, name)
                expected_drop = reward_drop(rewards[: r.step][-25:], (0.0, 1.0))
                assert got[r.step]["reward_drop"] == pytest.approx(expected_drop)
            step += len(chunk)
        # A streak longer than what one read covers.
        s.add(Run(id="long", name="long", tags=[], client_health={}))
        for step in range(1, 151):
            s.add(
                Step(
                    run_id="long",
                    split="train",
                    step=step,
                    attempt=1,
                    ranks=[0],
                    acc={},
                    effective_by_rank={},
                    scalars={},
                    n_valid=2,
                    n_collapsed=1,
                    acr=0.5,
                )
            )
        s.commit()
        got = series_values(s, s.get(Run, "long"), "train", [150], {"acr_streak"})[0][150]
        assert got["acr_streak"] == 150
    engine.dispose()


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1]:8080/",
        "http://[::ffff:169.254.1.1]/",
        "http://metadata.google.internal/",
        "http://100.100.100.200/",
        "http://[fd00:ec2::254]/",
        "http://168.63.129.16/machine",  # Azure's WireServer
        "file:///etc/passwd",
        "http:///nohost",
        # what the sender could never call (it retried each for an hour: a trial)
        "http://fd00:ec2::254/x",  # IPv6 without brackets
        "http://127.0.0.1:99999/x",
        "http://127.0.0.1:0/x",
        "http://127.0.0.1:x/y",
        " http://127.0.0.1:9/x",
        "http://127.0.0.1:9/a b",
    ],
)
def test_refused_webhook_targets(url):
    with pytest.raises(RefusedTarget):
        check_target(url, None)


def test_webhook_allow_list():
    assert check_target("http://127.0.0.1:9/hook", None)
    allow = "https://hooks.slack.com/,10.0.0.0/8,*.example.com,127.0.0.1"
    for ok in (
        "https://hooks.slack.com/services/T/B/X",
        "http://10.1.2.3/x",
        "https://alerts.example.com/x",
        "http://127.0.0.1:9/hook",
    ):
        assert check_target(ok, allow) == ok
    for bad in ("https://evil.test/x", "http://192.168.1.1/x", "http://hooks.slack.com.evil.test/"):
        with pytest.raises(RefusedTarget, match="VANTAGE_WEBHOOK_ALLOW"):
            check_target(bad, allow)


def test_a_run_that_keeps_failing_logs_its_traceback_once(caplog, tmp_path):
    """The periodic pass retries a failing run every few seconds; a trial saw the same
    traceback repeat for as long as the server ran."""
    from vantage.server.alerts import Evaluator
    from vantage.server.settings import Settings

    ev = Evaluator(Settings(database_url=f"sqlite:///{tmp_path / 'unused.db'}"))
    for _ in range(3):
        ev._failed("r1", OverflowError("intermediate overflow in fsum"), "periodic alert pass")
    ev._failed("r1", KeyError("other"), "periodic alert pass")
    ev._failed("r2", OverflowError("intermediate overflow in fsum"), "alert evaluation")
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert [r.getMessage() for r in tracebacks] == [
        "periodic alert pass failed for run r1",
        "periodic alert pass failed for run r1",
        "alert evaluation failed for run r2",
    ]
    again = [r.getMessage() for r in caplog.records if "failed again" in r.getMessage()]
    assert len(again) == 2 and "OverflowError" in again[0]
