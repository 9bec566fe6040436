"""A log_groups call whose rewards are not numbers costs only its own groups (found by a
fresh-user trial: it used to lose every step batched with it); so does any value of a log_* call
that the server would refuse, as the server refuses a whole record (one rank's step)."""

from __future__ import annotations

import re

import httpx
import pytest
from vantage.client import Monitor, checks

from tests.helpers.client import queue_refused_record
from tests.helpers.server import start_server


def test_unreadable_rewards_drop_only_their_call(tmp_path, caplog):
    srv = start_server(f"sqlite:///{tmp_path}/m.db", tmp_path, "--insecure-no-auth")
    try:
        mon = Monitor(srv.url, None, run_name="bad-call", spool_dir=str(tmp_path / "spool"))
        for step in range(5):
            mon.log_groups(step, [[1, 1], [1, 0]])
        mon.log_groups(5, [[[1, 0], [0, 1]]])  # one level too deep
        mon.log_groups(6, [["a", "b"]])  # strings
        mon.log_groups(2**70, [[1, 1]])  # a step the server cannot take (found by a trial too)
        mon.log_effective(2**64, n_valid=1, n_zero_advantage=0)
        mon.log_scalars(-1, {"loss": 1.0})
        for step in (7, 8):
            mon.log_groups(step, [[1, 1], [1, 0]])
        mon.close(timeout=20)
        points = httpx.get(f"{srv.url}/api/v1/runs/{mon.run_id}/metrics").json()["points"]
        by_step = {p["step"]: p for p in points}
        for step in (0, 1, 2, 3, 4, 7, 8):
            assert by_step[step]["n_groups"] == 2 and by_step[step]["acr"] == 0.5
        assert all(by_step.get(s, {"n_groups": 0})["n_groups"] == 0 for s in (5, 6))
        assert mon.dropped_groups == 1  # the strings; the deeper input is refused in the call
        assert "dropped this call's 1 group (other calls are kept)" in caplog.text
    finally:
        srv.stop()


def test_a_dead_letter_reaches_the_server_before_finish(tmp_path):
    """The server's client-health counters hear of a batch the server refused even when the run
    finishes before the next periodic heartbeat (found by a fresh-user trial)."""
    srv = start_server(f"sqlite:///{tmp_path}/d.db", tmp_path, "--insecure-no-auth")
    try:
        mon = Monitor(srv.url, None, run_name="dead", spool_dir=str(tmp_path / "spool"))
        queue_refused_record(mon, 1)
        mon.close(timeout=20)
        assert mon.dead_letter_batches == 1
        run = httpx.get(f"{srv.url}/api/v1/runs/{mon.run_id}").json()
        assert run["client"]["dead_letter_batches"] == 1 and run["status"] == "finished"
    finally:
        srv.stop()


def _bad_calls(mon: Monitor) -> None:
    """One call per value the server refuses in a record, all at step 5 (found by a trial)."""
    mon.log_scalars(5, {"n" * 200: 1.0})
    mon.log_scalars(5, {"": 1.0})
    mon.log_groups(5, [[1, 0]], prompt_ids=["p" * 200])
    mon.log_groups(5, [[1, 0]], group_ids=["g\x00"])
    mon.log_groups(5, [[1, 0]], split="é")
    mon.log_groups(5, [[1, 0]], rank=3)  # world_size is 1
    mon.log_effective(5, n_valid=1, n_zero_advantage=2)
    mon.log_effective(5, n_valid=2**40, n_zero_advantage=0)
    deep: list = []
    for _ in range(40):
        deep = [deep]
    mon.log_effective(5, n_valid=1, n_zero_advantage=0, mitigation={"mode": "avspo", "k": deep})
    mon.log_effective(5, n_valid=1, n_zero_advantage=0, mitigation={"mode": "x" * 5000})
    mon.log_effective(5, n_valid=1, n_zero_advantage=0, mitigation={"threshold": "fixed"})


def test_values_the_server_would_refuse_cost_only_their_call(tmp_path):
    srv = start_server(f"sqlite:///{tmp_path}/v.db", tmp_path, "--insecure-no-auth")
    try:
        mon = Monitor(srv.url, None, run_name="bad-values", spool_dir=str(tmp_path / "spool"))
        for step in range(8):
            mon.log_groups(step, [[1, 1, 1, 1], [0, 1, 0, 1]])
            mon.log_scalars(step, {"loss": 1.0, "kl": 0.5} if step != 5 else {"loss": 1.0})
        _bad_calls(mon)
        mon.log_scalars(5, {"kl": 0.5, "x" * 129: 2.0})  # the bad name alone is skipped
        mon.log_scalars(5, {"kl": 0.5, "lr": "1e-6"})  # and a text value alone (was stored)
        mon.close(timeout=20)
        assert mon.dead_letter_batches == 0
        assert mon.stats["rejected_calls"] == 13
        points = httpx.get(f"{srv.url}/api/v1/runs/{mon.run_id}/metrics").json()["points"]
        assert [p["step"] for p in points] == list(range(8))
        for p in points:
            assert p["n_groups"] == 2 and p["acr"] == 0.5
            assert p["scalars"] == {"loss": 1.0, "kl": 0.5} and p["acr_effective"] is None
    finally:
        srv.stop()


def test_strict_raises_each_in_the_call_and_after_close(tmp_path):
    mon = Monitor(None, run_name="strict", spool_dir=str(tmp_path / "spool"), strict=True)
    calls = [
        lambda: mon.log_scalars(5, {"n" * 200: 1.0}),
        lambda: mon.log_scalars(5, {"": 1.0}),
        lambda: mon.log_scalars(0, {"x": "str"}),
        lambda: mon.log_scalars(0, {"x": object()}),
        lambda: mon.log_groups(5, [[1, 0]], prompt_ids=["p" * 200]),
        lambda: mon.log_groups(5, [[1, 0]], split="é"),
        lambda: mon.log_groups(5, [[1, 0]], rank=1),
        lambda: mon.log_effective(5, n_valid=1, n_zero_advantage=2),
        lambda: mon.log_groups("3", [[1, 0]]),  # a string step was read as 3 (a trial)
        lambda: mon.log_scalars(None, {"loss": 1.0}),
        lambda: mon.log_effective(5, n_valid="2", n_zero_advantage=0),
    ]
    for call in calls:
        with pytest.raises((TypeError, ValueError)):
            call()
    with pytest.raises(TypeError, match="step must be an integer, not str '3'"):
        mon.log_groups("3", [[1, 0]])
    # they said "dictionary update sequence element #0 …" and "is 5,023 bytes as JSON" (a trial)
    with pytest.raises(TypeError, match=r"^mitigation must be a mapping such as \{'mode': "):
        mon.log_effective(5, n_valid=1, n_zero_advantage=0, mitigation="avspo")
    with pytest.raises(ValueError, match=r"^mitigation is 5,\d+ bytes as JSON; at most 4,096"):
        mon.log_effective(
            5, n_valid=1, n_zero_advantage=0, mitigation={"mode": "a", "x": "y" * 5000}
        )
    mon.log_groups(1, [[1, 0]], split="eval.gsm8k", prompt_ids=["p" * 128])
    mon.close(timeout=1)
    for call in (
        lambda: mon.log_groups(2, [[1, 0]]),
        lambda: mon.log_scalars(2, {"loss": 1.0}),
        lambda: mon.ack("c", "applied", 2),
    ):
        with pytest.raises(ValueError, match="closed"):
            call()


def test_logging_after_close_is_said_not_silent(tmp_path, caplog):
    mon = Monitor(None, run_name="late", spool_dir=str(tmp_path / "spool"))
    mon.close(timeout=1)
    mon.log_groups(1, [[1, 0]])
    mon.log_effective(1, n_valid=1, n_zero_advantage=0)
    assert mon.stats["rejected_calls"] == 2
    assert "the monitor is closed" in caplog.text


def test_a_config_nan_reaches_the_server_as_its_string(tmp_path):
    srv = start_server(f"sqlite:///{tmp_path}/c.db", tmp_path, "--insecure-no-auth")
    try:
        config = {"lr": float("nan"), "betas": (0.9, float("inf")), "name": "x", (1, 2): {3: 4}}
        mon = Monitor(srv.url, None, config=config, spool_dir=str(tmp_path / "spool"))
        mitigation = {"mode": "avspo", "tau": float("-inf"), 7: "k"}
        mon.log_effective(0, n_valid=1, n_zero_advantage=0, mitigation=mitigation)
        mon.close(timeout=20)
        run = httpx.get(f"{srv.url}/api/v1/runs/{mon.run_id}").json()
        assert run["config"] == {
            "lr": "NaN", "betas": [0.9, "Infinity"], "name": "x", "(1, 2)": {"3": 4}
        }  # fmt: skip
        assert run["mitigation_reported"] == {"mode": "avspo", "tau": "-Infinity", "7": "k"}
        # a config the server refuses (over 64 KiB) is left out with a warning, not the run
        wide = Monitor(srv.url, None, config={"data": list(range(30_000))},
                       spool_dir=str(tmp_path / "spool3"))  # fmt: skip
        wide.log_groups(0, [[1, 0]])
        wide.close(timeout=20)
        run = httpx.get(f"{srv.url}/api/v1/runs/{wide.run_id}").json()
        assert run["config"] == {"vantage": "config not sent (config is 168,900 bytes as JSON; "
                                 "at most 65,536 (the run's hyperparameters))"}  # fmt: skip
        assert run["last_step"] == 0
    finally:
        srv.stop()
    # a tuple key raised orjson's "Dict key must a type serializable" (a trial); a list or a
    # string is no config
    for wrong in ([1, 2], "lr=1"):
        with pytest.raises(TypeError, match="config must be a mapping"):
            Monitor(None, config=wrong, spool_dir=str(tmp_path / "spool2"))
    # an integer beyond orjson's range raised its TypeError out of Monitor() (a trial); one
    # within it but beyond int64 left the whole config out (a trial): each is sent as its text,
    # as the server asks, and so is one in a mitigation
    for seed in (2**63, 2**64, -(2**70)):
        assert checks.config_json({"seed": seed, "lr": 0.1}) == {"seed": str(seed), "lr": 0.1}
        wide = checks.mitigation_json({"mode": "avspo", "k": [seed]})
        assert wide == {"mode": "avspo", "k": [str(seed)]}
        Monitor(None, config={"seed": seed}, spool_dir=str(tmp_path / "spool4")).close()
    assert checks.config_json({"seed": 2**63 - 1, "f": True}) == {"seed": 2**63 - 1, "f": True}


def test_a_scalar_past_float64_is_sent_as_infinity(tmp_path):
    """10**400 raised OverflowError in the sender and lost the whole batch around it, while
    flush() said True (found by a fresh-user trial); then it was skipped alone. It is sent as
    Infinity, as the server reads the JSON number 1e400: a non-finite scalar is never dropped."""
    srv = start_server(f"sqlite:///{tmp_path}/o.db", tmp_path, "--insecure-no-auth")
    try:
        mon = Monitor(srv.url, None, run_name="overflow", spool_dir=str(tmp_path / "spool"))
        mon.log_groups(1, [[0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 1]])
        mon.log_scalars(1, {"loss": 0.5})
        mon.log_scalars(1, {"big": 10**400})
        mon.log_groups(2, [[0, 1, 0, 1]])
        mon.log_scalars(2, {"eval_acc": None})  # null, as the API takes it (it was skipped)
        # a reward beyond 64 bits is sent as a float, as the server reads it, and one beyond
        # float64 as Infinity, an invalid group, as the server takes 1e400 (the call's groups
        # were dropped: trials)
        mon.log_groups(3, [[2**80, 2**80], [0, 1]], group_ids=["wide", "narrow"])
        mon.log_groups(3, [[2**63, 2**63], [10**400, 0]], group_ids=["int64", "past float64"])
        assert mon.flush(20)
        mon.close(timeout=20)
        points = httpx.get(f"{srv.url}/api/v1/runs/{mon.run_id}/metrics").json()["points"]
        assert [(p["step"], p["n_groups"]) for p in points] == [(1, 3), (2, 1), (3, 4)]
        assert (points[2]["n_invalid"], points[2]["n_collapsed"], points[2]["n_valid"]) == (1, 2, 3)
        assert mon.dropped_groups == 0
        assert points[0]["scalars"] == {"loss": 0.5, "big": "Infinity"}
        assert points[1]["scalars"] == {"eval_acc": None}
    finally:
        srv.stop()


def test_a_check_of_two_arguments_names_them():
    """`Monitor(reward_min=1, reward_max=0)` said "Monitor: : Value error, ..."."""
    with pytest.raises(ValueError, match=r"^Monitor: arguments: Value error, reward_min 1.0 must"):
        Monitor(None, run_name="bounds", reward_min=1, reward_max=0)


def test_repeated_group_ids_in_one_call_are_refused():
    mon = Monitor(None, run_name="dup", strict=True)
    with pytest.raises(ValueError, match="group_ids repeat"):
        mon.log_groups(1, [[0, 1], [1, 1]], group_ids=["a", "a"])
    mon.close(timeout=1)


def test_close_with_a_status_it_cannot_send_says_so(caplog):
    mon = Monitor(None, run_name="status")
    mon.close(timeout=1, status="done")
    assert "takes 'finished', 'failed' or None, not 'done'" in caplog.text
    strict = Monitor(None, run_name="status", strict=True)
    with pytest.raises(ValueError, match="not 'done'"):
        strict.close(timeout=1, status="done")
    strict.close(timeout=1)


def test_a_bad_close_argument_still_closes_and_sends_everything(tmp_path, caplog):
    """close(timeout=None) raised TypeError after marking the monitor closed, so nothing was
    ever sent; close(status="bogus") said "ignored" but closed (both found by a trial)."""
    srv = start_server(f"sqlite:///{tmp_path}/k.db", tmp_path, "--insecure-no-auth")
    try:
        runs = []
        for timeout, status in ((None, "finished"), ("x", "finished"), (20, "bogus")):
            mon = Monitor(srv.url, None, run_name="close", spool_dir=str(tmp_path / "spool"))
            for step in range(3):
                mon.log_groups(step, [[1, 0]])
            mon.close(timeout=timeout, status=status)
            mon.close()  # a no-op now
            run = httpx.get(f"{srv.url}/api/v1/runs/{mon.run_id}").json()
            runs.append((run["last_step"], run["status"], mon.spooled_groups))
        assert runs == [(2, "finished", 0), (2, "finished", 0), (2, "running", 0)]
        assert "closing with the default timeout of 30 s" in caplog.text
        assert "not 'bogus'; closing without marking the run" in caplog.text
        assert "ignored" not in caplog.text
    finally:
        srv.stop()


def test_input_the_server_would_refuse_is_refused_in_the_call(tmp_path):
    """Found by a trial: a mask of 0.5 or 2 was sent as 1, rewards "1" as 1.0, and
    prompt_ids="ab" as the ids 'a' and 'b'."""
    mon = Monitor(None, run_name="strict", spool_dir=str(tmp_path / "spool"), strict=True)
    cases = [
        ({"mask": [[0.5, 1]]}, [[1, 0]], "mask values are 1 (keep) or 0 (drop), not 0.5"),
        ({"mask": [[2, 0]]}, [[1, 0]], "not 2"),
        ({}, [["1", "0"]], "rewards are numbers or None, not the string '1'"),
        ({"prompt_ids": "ab"}, [[1, 0], [0, 1]], "not the string 'ab'"),
        ({"group_ids": "ab"}, [[1, 0], [0, 1]], "one id per group"),
        ({}, [{"n": 8, "mean": 0.5}], "compact stats"),
    ]
    for kwargs, rewards, says in cases:
        with pytest.raises((TypeError, ValueError), match=re.escape(says)):
            mon.log_groups(1, rewards, **kwargs)
    mon.log_groups(1, [[1, 0]], mask=[[True, False]])
    mon.log_groups(1, [[1, 0]], mask=[[1.0, 0.0]])
    mon.close(timeout=0)
    assert mon.spooled_groups == 2


def test_a_full_queue_says_so(tmp_path, caplog):
    mon = Monitor(None, run_name="full", spool_dir=str(tmp_path / "spool"), max_queue_groups=3)
    mon.log_groups(1, [[1, 0]] * 4)  # more than the queue holds: dropped, and said
    mon.log_groups(2, [[1, 0]] * 2)
    mon.close(timeout=5)
    assert mon.dropped_groups == 4 and mon.spooled_groups == 2
    assert "groups dropped" in caplog.text and "max_queue_groups" in caplog.text


def test_any_error_of_a_call_is_skipped_and_constructor_errors_are_one_line(tmp_path, caplog):
    """A meta tensor's NotImplementedError escaped log_groups into the training loop; a bad
    run_name raised pydantic's model dump; 10**400 printed its 401 digits (a trial)."""
    torch = pytest.importorskip("torch")
    mon = Monitor(None, run_name="odd", spool_dir=str(tmp_path / "spool"))
    mon.log_groups(5, torch.zeros((2, 3), device="meta"))
    mon.log_groups(1, [[[0, 1]]])
    mon.log_scalars(1, {"big": [10**400]})  # no number: skipped, its repr shortened
    mon.flush(2)
    mon.close(timeout=0)
    assert "Cannot copy out of meta tensor" in caplog.text and "not deeper" in caplog.text
    assert "0" * 401 not in caplog.text and "scalar 'big' is [1000" in caplog.text
    for name, says in ((None, "run_name must be text"), ("", "name: String should have")):
        with pytest.raises((TypeError, ValueError), match=f"^Monitor: {says}"):
            Monitor(None, run_name=name, spool_dir=str(tmp_path / "spool2"))
