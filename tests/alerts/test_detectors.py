"""The built-in training-health detectors (docs/detectors.md) on a real server and database,
fed over HTTP: a healthy noisy run fires none of them, and each fault fires its own rule within
a few steps of where it begins (and no other detector). Their suggested commands are offered,
never issued; their recommended action reaches the alert listing and the webhook body."""

from __future__ import annotations

import logging
import math
import random
import statistics

import pytest

from tests.helpers.alerts import Receiver
from tests.helpers.api import new_run, post_steps
from tests.helpers.cli import create_key, run_cli
from tests.helpers.polling import wait_until
from tests.helpers.postgres import database_for
from tests.helpers.server import start_server

DETECTORS = (
    "entropy_collapse",
    "kl_spike",
    "grad_norm_spike",
    "loss_non_finite",
    "reward_variance_spike",
    "reward_out_of_range",
)
STEPS = 80  # a healthy run's
FAULT = 30  # the step each fault begins at (the warmup is the first 20 steps), ...
AFTER = 8  # ... and how many steps a faulty run goes on


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request, tmp_path_factory):
    url, drop = database_for(request.param, tmp_path_factory.mktemp("detectors-db"))
    run_cli("db", "upgrade", "--database-url", url)
    srv = start_server(url, tmp_path_factory.mktemp("detectors-logs"))
    srv.keys = {"all": create_key(url, "ingest,read,control,admin", "all")}
    srv.database_url = url
    yield srv
    srv.stop()
    if drop is not None:
        drop()


@pytest.fixture
def api(server):
    with server.client("all") as client:
        yield client


def healthy_step(rng: random.Random, step: int) -> dict:
    """A noisy, healthy GRPO step: 16 groups of 8 continuous rewards around 0.5, entropy
    slowly falling, KL slowly rising, a log-normal gradient norm, a noisy loss."""
    groups = [[rng.gauss(0.5, 0.1) for _ in range(8)] for _ in range(16)]
    scalars = {
        "entropy": (2.0 - 0.004 * step) * rng.uniform(0.97, 1.03),
        "kl": (0.01 + 0.0004 * step) * rng.uniform(0.9, 1.1),
        "grad_norm": math.exp(rng.gauss(0.0, 0.2)),
        "loss": rng.gauss(0.1, 0.05),
    }
    return {"step": step, "groups": groups, "scalars": scalars}


def with_fault(record: dict, fault: str | None, rng: random.Random) -> dict:
    """``record`` with ``fault`` from step FAULT on (entropy collapse, KL and gradient spikes,
    a NaN loss, rewards split into two clusters, rewards above reward_max)."""
    step, scalars = record["step"], record["scalars"]
    if fault is None or step < FAULT:
        return record
    if fault == "entropy_collapse":
        scalars["entropy"] *= 0.25
    elif fault == "kl_spike" and step == FAULT:
        scalars["kl"] *= 10
    elif fault == "grad_norm_spike" and step == FAULT:
        scalars["grad_norm"] = 25.0
    elif fault == "loss_non_finite" and step == FAULT:
        scalars["loss"] = "NaN"
    elif fault == "reward_variance_spike":  # half the completions found an exploit
        record["groups"] = [
            [rng.gauss(0.9, 0.02) if k % 2 else rng.gauss(0.3, 0.02) for k in range(8)]
            for _ in range(16)
        ]
    elif fault == "reward_out_of_range":  # a reward scaled past its declared range
        record["groups"] = [[r + 0.45 for r in g] for g in record["groups"]]
    return record


def feed(api, fault: str | None, seed: int) -> dict:
    """A run, one request a step, with ``fault`` from step FAULT (AFTER steps more); without
    one, STEPS steps."""
    rng = random.Random(seed)
    run = new_run(api, name=f"detectors-{fault or 'healthy'}")
    for step in range(1, (STEPS if fault is None else FAULT + AFTER) + 1):
        record = with_fault(healthy_step(rng, step), fault, rng)
        post_steps(api, run, [record])
    return run


def detector_alerts(api, run_id: str) -> dict[str, list[dict]]:
    alerts = api.get("/api/v1/alerts", params={"run_id": run_id}).json()["alerts"]
    out: dict[str, list[dict]] = {}
    for a in alerts:
        if a["rule"] in DETECTORS:
            out.setdefault(a["rule"], []).append(a)
    return out


def test_a_healthy_noisy_run_fires_no_detector(api):
    for seed in (1, 2):
        run = feed(api, None, seed)
        assert detector_alerts(api, run["run_id"]) == {}


@pytest.mark.parametrize("fault", DETECTORS)
def test_each_fault_fires_its_own_detector_within_a_few_steps(api, fault):
    run = feed(api, fault, seed=7)
    fired = detector_alerts(api, run["run_id"])
    assert set(fired) == {fault}, fired
    (alert,) = fired[fault]
    assert FAULT <= alert["fired_step"] <= FAULT + 5, alert
    assert alert["recommended_action"]
    if fault == "loss_non_finite":
        assert alert["severity"] == "critical"
    # suggested, never issued: built-ins carry no mitigation (docs/design.md §6)
    commands = api.get(f"/api/v1/runs/{run['run_id']}/commands").json()["commands"]
    assert commands == []
    suggested = {
        "entropy_collapse": {"type": "set_sampling", "params": {"temperature": 1.2}},
        "grad_norm_spike": {"type": "checkpoint", "params": {}},
        "loss_non_finite": {"type": "stop", "params": {}},
    }.get(fault)
    if alert["state"] == "firing":
        assert alert["suggested_command"] == suggested


def test_a_spike_inside_the_warmup_fires_nothing(api):
    rng = random.Random(3)
    run = new_run(api, name="warmup")
    for step in range(1, 41):
        record = healthy_step(rng, step)
        if step == 12:
            record["scalars"]["grad_norm"] = 50.0
        post_steps(api, run, [record])
    assert detector_alerts(api, run["run_id"]) == {}


def test_the_first_change_after_exact_zeros_fires_no_z_score(api):
    """A fully collapsed GRPO step logs kl, grad_norm and loss as exact 0: a baseline of
    zeros has no spread, so neither the first change after them nor a ramp up from 0 fires."""
    rng = random.Random(4)
    run = new_run(api, name="zeros")
    for step in range(1, 46):
        record = healthy_step(rng, step)
        ramp = max(0, step - 29)  # 0 up to step 29, then 1, 2, 3, ...
        record["scalars"].update(kl=1e-6 * ramp, grad_norm=0.3 * bool(ramp), loss=0.0)
        post_steps(api, run, [record])
    assert detector_alerts(api, run["run_id"]) == {}


def test_out_of_range_rewards_are_counted_and_named_with_the_runs_bounds(api, server):
    rules = {r["name"]: r for r in api.get("/api/v1/alert-rules").json()["rules"]}
    rule = rules["reward_out_of_range"]
    receiver = Receiver()
    try:
        r = api.put(f"/api/v1/alert-rules/{rule['id']}", json={"notify": [receiver.url]})
        assert r.status_code == 200, r.text
        run = new_run(api, name="bounds", reward_min=-1.0, reward_max=2.0)
        answer = post_steps(api, run, [{"step": 1, "groups": [[5, 5, 5, 5], [-3, 2, 1, 0]]}])
        assert answer["steps"][0]["n_out_of_range"] == 5
        post_steps(api, run, [{"step": 2, "groups": [[0, 1, 0, 1]]}])
        points = api.get(f"/api/v1/runs/{run['run_id']}/metrics").json()["points"]
        assert [p["n_out_of_range"] for p in points] == [5, 0]
        # the rule is built in: another run of this module's server may fire it too
        assert wait_until(lambda: mine(receiver.messages, run), 15), receiver.messages
        (body,) = mine(receiver.messages, run)
        assert body["rule"] == "reward_out_of_range" and body["step"] == 1
        assert "[-1, 2]" in body["recommended_action"], body["recommended_action"]
    finally:
        api.put(f"/api/v1/alert-rules/{rule['id']}", json={"notify": []})
        receiver.close()


def mine(messages: list[dict], run: dict) -> list[dict]:
    """The messages about ``run``."""
    return [m for m in messages if m["run_id"] == run["run_id"]]


def _sarle(values: list[float]) -> float:
    """Sarle's bimodality coefficient of ``values`` (docs/detectors.md), two-pass, exact sums."""
    n = len(values)
    mean = math.fsum(values) / n
    m2, m3, m4 = (math.fsum((v - mean) ** k for v in values) / n for k in (2, 3, 4))
    g1 = m3 / m2**1.5 * math.sqrt(n * (n - 1)) / (n - 2)
    g2 = ((n + 1) * (m4 / m2**2 - 3) + 6) * (n - 1) / ((n - 2) * (n - 3))
    return (g1 * g1 + 1) / (g2 + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3)))


def test_reward_std_and_bimodality_do_not_depend_on_the_bounds(api):
    """The statistics were power sums of reward − reward_min: wide bounds lost every digit
    (bounds ±1e8 gave a std of 0, ±1e308 null). Two ranks' records of one step merge."""
    rng = random.Random(11)
    groups = [[rng.random() for _ in range(8)] for _ in range(8)]
    flat = [r for g in groups for r in g]
    std = statistics.stdev(flat)
    for bound in (1.0, 1e6, 1e8, 1e308):
        run = new_run(api, name=f"bounds-{bound:g}", reward_min=-bound, reward_max=bound)
        records = [
            {"step": 1, "rank": rank, "groups": groups[4 * rank : 4 * rank + 4]} for rank in (0, 1)
        ]
        post_steps(api, run, records)
        (point,) = api.get(f"/api/v1/runs/{run['run_id']}/metrics").json()["points"]
        assert point["reward_std"] == pytest.approx(std, rel=1e-12), bound
        assert point["reward_bimodality"] == pytest.approx(_sarle(flat), rel=1e-9), bound
    # values near the largest float: scaled, so nothing overflows
    run = new_run(api, name="huge", reward_min=-1.7e308, reward_max=1.7e308)
    huge = [1e308, -1e308, 1.5e308, -1.5e308, 5e307, 0.0]
    post_steps(api, run, [{"step": 1, "groups": [huge]}])
    (point,) = api.get(f"/api/v1/runs/{run['run_id']}/metrics").json()["points"]
    scaled = [v / 1e300 for v in huge]
    assert point["reward_std"] == pytest.approx(statistics.stdev(scaled) * 1e300, rel=1e-12)
    assert point["reward_bimodality"] == pytest.approx(_sarle(scaled), rel=1e-9)


def test_detector_fields_are_optional_and_validated(api):
    plain = api.post(
        "/api/v1/alert-rules",
        json={"name": "plain-0014", "metric": "acr", "op": ">", "threshold": 0.5},
    ).json()
    assert (plain["comparison"], plain["warmup_steps"], plain["alert_cooldown_steps"]) == (
        "absolute",
        0,
        0,
    )
    assert plain["recommended_action"] is None and plain["suggested_command"] is None
    bad = api.post(
        "/api/v1/alert-rules",
        json={"name": "bad", "metric": "acr", "op": ">", "threshold": 1, "comparison": "median"},
    )
    assert bad.status_code == 422
    bad = api.post(
        "/api/v1/alert-rules",
        json={
            "name": "bad",
            "metric": "acr",
            "op": ">",
            "threshold": 1,
            "suggested_command": {"type": "set_sampling", "params": {}},
        },
    )
    assert bad.status_code == 422 and "temperature" in bad.text
    # a rule that could never fire is refused; one whose range decides it is taken with a warning
    base = {"name": "bad", "op": ">", "threshold": 1}
    for body, field, said in (
        ({"metric": "scalars.kl", "comparison": "zscore", "baseline_steps": 9}, "baseline_steps",
         "baseline_steps 10 or more"),
        ({"metric": "stale", "comparison": "zscore"}, "comparison", "cannot watch stale"),
        ({"metric": "acr", "recommended_action": "check {reward_mn} and {reward_max}"},
         "recommended_action", "{reward_mn}"),
    ):  # fmt: skip
        bad = api.post("/api/v1/alert-rules", json={**base, **body})
        assert bad.status_code == 422, bad.text
        (detail,) = bad.json()["detail"]
        assert detail["loc"][-1] == field and said in detail["msg"], detail
    r = api.put(f"/api/v1/alert-rules/{plain['id']}", json={"comparison": "zscore"})
    assert r.status_code == 200, r.text  # baseline_steps 20 by default
    r = api.put(f"/api/v1/alert-rules/{plain['id']}", json={"baseline_steps": 5})
    assert r.status_code == 422 and "baseline_steps 10 or more" in r.text
    relative = {"metric": "scalars.entropy", "comparison": "relative", "op": "<"}
    r = api.put(f"/api/v1/alert-rules/{plain['id']}", json={**relative, "threshold": -0.5})
    assert r.status_code == 200 and "never holds" in r.json()["warning"], r.text
    r = api.put(f"/api/v1/alert-rules/{plain['id']}", json={"threshold": 0.5})
    assert "warning" not in r.json(), r.text
    api.delete(f"/api/v1/alert-rules/{plain['id']}")


def test_the_monitor_warns_once_naming_the_bounds(server, tmp_path, caplog):
    from vantage.client import Monitor

    key = server.keys["all"]
    with caplog.at_level(logging.WARNING, logger="vantage.client"):
        mon = Monitor(server.url, key, run_name="warned", spool_dir=tmp_path / "spool")
        try:
            mon.log_groups(1, [[0, 2, 2, 0], [1, 0, 1, 0]])
            assert mon.flush(30)
            mon.log_groups(2, [[3, 3, 0, 0]])
            assert mon.flush(30)
        finally:
            mon.close(timeout=10)
    said = [r.getMessage() for r in caplog.records if "outside the run's bounds" in r.getMessage()]
    assert len(said) == 1, said
    assert "2 reward(s) of step 1" in said[0] and "[0, 1]" in said[0]
    assert "Monitor(reward_min=..., reward_max=...)" in said[0]
