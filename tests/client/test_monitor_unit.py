"""The Monitor's parts that need no server: input conversion, default group ids, the bounded
queue, request packing under the §4 limits, the spool, backoff and launch ids."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vantage.client import Monitor, derive_launch_id
from vantage.client.schema import StepsBatch
from vantage.client.spool import Spool
from vantage.client.transport import (
    Backoff,
    Outage,
    _retry_after,
    encode_groups,
    pack_records,
    server_url_problem,
    steps_body,
)


def offline(tmp_path: Path, **kw) -> Monitor:
    return Monitor(None, None, run_name="unit", spool_dir=tmp_path, **kw)


def spooled_records(path: Path) -> list[dict]:
    spool = Spool(path)
    out = []
    while (row := spool.head()) is not None:
        out.extend(orjson.loads(row.body))
        spool.delete(row)
    spool.close()
    return out


def test_import_needs_no_torch_numpy_dash_or_db_driver():
    code = (
        "import sys, vantage.client, vantage.client.integrations.trl\n"
        "bad = [m for m in ('torch', 'numpy', 'dash', 'sqlalchemy', 'psycopg', 'trl') "
        "if m in sys.modules]\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_inputs_tensor_ndarray_ragged_lists_and_bools(tmp_path: Path):
    mon = offline(tmp_path)
    mon.log_groups(1, torch.tensor([[1.0, 0.0], [0.5, 0.5]]))
    mon.log_groups(1, np.array([[1, 1], [0, 0]], dtype=np.int64))
    mon.log_groups(1, [[1.0, 0.0, 1.0], [0.25], (0.0, 1.0)])  # ragged
    mon.log_groups(1, [torch.tensor([1.0, 1.0, 1.0]), np.array([0.0, 1.0])])
    mon.log_groups(1, torch.tensor([[True, False]]), mask=torch.tensor([[1, 0]]))
    mon.log_groups(1, [[np.float32(0.5), None, float("nan")]], prompt_ids=["p"])
    mon.close(timeout=2)
    (rec,) = spooled_records(mon.spool_path)
    assert rec["step"] == 1 and rec["rank"] == 0 and rec["world_size"] == 1
    groups = rec["groups"]
    # default ids continue a per-(step, split, rank) counter across calls
    assert [g["group_id"] for g in groups] == [str(i) for i in range(11)]
    assert [g["rewards"] for g in groups] == [
        [1.0, 0.0], [0.5, 0.5], [1, 1], [0, 0], [1.0, 0.0, 1.0], [0.25], [0.0, 1.0],
        [1.0, 1.0, 1.0], [0.0, 1.0], [1.0, 0.0], [0.5, None, None],
    ]  # fmt: skip
    assert groups[9]["rewards"] == [1.0, 0.0] and groups[9]["mask"] == [1, 0]
    assert groups[10]["rewards"] == [0.5, None, None] and groups[10]["prompt_id"] == "p"
    StepsBatch.model_validate_json(steps_body(1, orjson.dumps([rec])))  # the server would take it


def test_a_prompt_id_of_none_is_no_prompt_id(tmp_path: Path, caplog):
    """prompt_ids=[None, ...] made a prompt named "None" that pooled every such group in the
    prompts view (a trial); a group_id of None is refused, naming it."""
    mon = offline(tmp_path)
    mon.log_groups(1, [[1.0, 0.0], [1.0, 1.0]], prompt_ids=[None, 7])
    mon.log_groups(1, [[1.0, 0.0]], group_ids=[None])
    mon.close(timeout=2)
    (rec,) = spooled_records(mon.spool_path)
    assert [g.get("prompt_id") for g in rec["groups"]] == [None, "7"]
    assert "group_ids[0] is None" in caplog.text


def test_a_scalar_tensor_that_requires_grad_is_read_without_a_warning(tmp_path: Path):
    """A loss tensor still in its graph made torch warn from inside the Monitor."""
    import warnings

    loss = (torch.tensor([2.0], requires_grad=True) * 0.25).sum()
    mon = offline(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mon.log_scalars(0, {"loss": loss})
        mon.close(timeout=2)
    (rec,) = spooled_records(mon.spool_path)
    assert rec["scalars"] == {"loss": 0.5}


def test_later_edits_of_the_input_do_not_change_what_is_sent(tmp_path: Path):
    mon = offline(tmp_path)
    rewards = [[1.0, 0.0]]
    tensor = torch.tensor([[1.0, 1.0]])
    mon.log_groups(0, rewards)
    mon.log_groups(0, tensor)
    rewards[0][0] = 7.0
    tensor[0, 0] = 7.0
    mon.close(timeout=2)
    (rec,) = spooled_records(mon.spool_path)
    assert [g["rewards"] for g in rec["groups"]] == [[1.0, 0.0], [1.0, 1.0]]


def test_ids_counters_are_per_step_split_and_rank(tmp_path: Path):
    mon = offline(tmp_path, world_size=2)
    mon.log_groups(3, [[1, 0]])
    mon.log_groups(3, [[1, 0]], split="eval")
    mon.log_groups(3, [[1, 0]], rank=1)
    mon.log_groups(3, [[1, 0]], group_ids=["a"])
    mon.log_groups(3, [[1, 0]])
    mon.log_scalars(3, {"loss": torch.tensor(0.25), "bad": "x", "pair": [1, 2]})
    assert mon.stats["rejected_calls"] == 2  # each skipped scalar, in the call
    mon.log_effective(3, n_valid=2, n_zero_advantage=1, mitigation={"mode": "aapo", "m": 1})
    mon.close(timeout=2)
    recs = {(r["split"], r["rank"]): r for r in spooled_records(mon.spool_path)}
    assert [g["group_id"] for g in recs[("train", 0)]["groups"]] == ["0", "a", "1"]
    assert [g["group_id"] for g in recs[("eval", 0)]["groups"]] == ["0"]
    assert [g["group_id"] for g in recs[("train", 1)]["groups"]] == ["0"]
    assert recs[("train", 0)]["scalars"] == {"loss": 0.25}
    assert recs[("train", 0)]["effective"] == {"n_valid": 2, "n_zero_advantage": 1, "n_virtual": 0}
    assert recs[("train", 0)]["mitigation"] == {"mode": "aapo", "m": 1}  # what is in effect


def test_bad_shapes_are_skipped_not_raised(tmp_path: Path):
    mon = offline(tmp_path)
    mon.log_groups(0, [1.0, 0.0])  # 1-D: logged and skipped, never raised into training
    mon.log_groups("x", [[1.0, 0.0]])
    mon.log_groups(0, None)
    mon.log_effective(0, n_valid="many", n_zero_advantage=0)
    assert mon.stats["rejected_calls"] == 4
    mon.close(timeout=1)


def test_bad_shapes_raise_at_once_when_strict(tmp_path: Path):
    mon = offline(tmp_path, strict=True)
    with pytest.raises(TypeError):
        mon.log_groups(0, [1.0, 0.0])
    with pytest.raises(TypeError):
        mon.log_groups(0, torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError):
        mon.log_groups(0, [[1.0]], group_ids=["a", "b"])
    # rewards are read in the background, and strict reads them in the call as well
    with pytest.raises((TypeError, ValueError)):
        mon.log_groups(0, [["a", 1.0]])
    with pytest.raises(ValueError, match="mask has 1 entries for 2 rewards"):
        mon.log_groups(0, [[1.0, 0.0]], mask=[[1]])
    mon.log_groups(0, [[1.0, 0.0]])
    mon.close(timeout=1)
    assert [len(r["groups"]) for r in spooled_records(mon.spool_path)] == [1]  # the good call


def test_full_queue_drops_and_counts_never_blocks(tmp_path: Path):
    mon = offline(tmp_path, max_queue_groups=100, batch_interval_s=60)
    t0 = time.perf_counter()
    for step in range(50):
        mon.log_groups(step, [[1.0, 0.0]] * 10)
    assert time.perf_counter() - t0 < 0.5
    assert mon.dropped_groups > 0
    mon.close(timeout=2)
    kept = sum(len(r["groups"]) for r in spooled_records(mon.spool_path))
    assert kept + mon.dropped_groups == 500


def test_spool_order_cap_dead_letter_and_reopen(tmp_path: Path):
    path = tmp_path / "s.vantage-spool"
    spool = Spool(path, max_bytes=100)
    assert spool.append(b"[1]", 1) and spool.append(b"[2]", 2) and spool.append(b"[3]", 3)
    assert not spool.append(b"x" * 200, 7)  # over the cap: dropped and counted
    assert spool.dropped_groups == 7 and spool.pending_groups == 6
    head = spool.head()
    spool.replace_head(head, [(b"[1.1]", 0), (b"[1.2]", 1)])  # bisected in place
    spool.dead_letter(spool.head(), 422, "bad")
    spool.set_meta("run", {"run_id": "r"})
    spool.close()
    spool = Spool(path, max_bytes=100)
    assert spool.dropped_groups == 7 and spool.dead_letter_batches == 1
    bodies = []
    while (row := spool.head()) is not None:
        bodies.append(row.body)
        spool.delete(row)
    assert bodies == [b"[1.2]", b"[2]", b"[3]"]
    assert spool.dead_letters()[0]["records"] == [1.1]
    assert spool.get_meta("run") == {"run_id": "r"}
    assert not spool.close(remove_if_clean=True)  # dead letters and drops are kept
    assert path.exists()


def test_closing_an_offline_monitor_names_the_spool_to_sync(tmp_path: Path, caplog):
    mon = offline(tmp_path)
    (said,) = [r.getMessage() for r in caplog.records if "no server" in r.getMessage()]
    assert "VANTAGE_SERVER" in said and str(mon.spool_path) in said  # a forgotten env var shows
    mon.log_groups(0, [[1.0, 0.0]] * 3)
    mon.close(timeout=2)
    message = next(r.getMessage() for r in caplog.records if "not on the server yet" in r.message)
    assert "): no server;" in message
    # this run's file: the folder may hold other runs' spools
    assert f"vantage sync {mon.spool_path} --server URL --api-key KEY" in message


def test_outage_warns_after_a_while_then_rarely_and_says_when_it_ended():
    outage = Outage(warn_after_s=15, repeat_s=600)
    assert [outage.failed(t) for t in (100, 105, 114.9)] == [None, None, None]
    assert outage.failed(115) == 15
    assert outage.failed(200) is None and outage.failed(715) == 615
    assert outage.succeeded(720) == 620
    assert outage.succeeded(721) is None  # nothing to report: no outage
    assert outage.failed(800) is None and outage.succeeded(801) is None  # too short to report
    assert outage.failed(900) is None and outage.failed(915) == 15  # a new outage's own clock


@pytest.mark.parametrize(
    "url",
    ["127.0.0.1:8000", "localhost:8000", "not a url", "ftp://h/x", "http://",
     # pages' addresses: a 404 for /api/v1/api/v1/runs, a 401 asking to log in (a trial)
     "http://h:8000/api/v1", "http://h:8000/dashboard/", "http://h:8000 "],
)  # fmt: skip
def test_a_server_url_that_cannot_work_is_said_at_once_and_the_run_goes_on(tmp_path, caplog, url):
    assert server_url_problem(url) is not None
    mon = Monitor(url, None, run_name="u", spool_dir=tmp_path)
    (error,) = [
        r.getMessage() for r in caplog.records if "recording to the spool" in r.getMessage()
    ]
    assert repr(url) in error and "http://" in error, error
    mon.log_groups(0, [[1.0, 0.0]] * 3)
    mon.close(timeout=2)
    message = next(r.getMessage() for r in caplog.records if "not on the server yet" in r.message)
    assert "--server URL" in message and server_url_problem(url) in message, message
    assert mon.spooled_groups == 3
    with pytest.raises(ValueError, match="http:// or https://|give the server.s base URL|spaces"):
        Monitor(url, None, run_name="u", spool_dir=tmp_path / "strict", strict=True)


def test_close_counts_every_unconfirmed_group_queued_or_spooled(tmp_path: Path, caplog):
    """A server that never answers (a socket that listens but never accepts) confirms nothing:
    close(timeout=0)'s warning counts every group, those still queued in memory too (it
    counted the spool only, a fraction of them: a trial), and does not call the server down."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        mon = Monitor(url, None, run_name="silent", spool_dir=tmp_path, request_timeout_s=30)
        for step in range(3_000):  # 12,000 groups in records too many to spool in 0.1 s
            mon.log_groups(step, [[1.0, 0.0]] * 4)
        mon.close(timeout=0)
        said = [r.getMessage() for r in caplog.records if "not on the server yet" in r.message]
        assert said and said[0].startswith("vantage: 12000 group(s) are not on the server yet")
        assert "close's timeout (0 s) passed" in said[0], said
    finally:
        silent.close()


EXIT_BEHIND_A_SLOW_REQUEST = """
import socket, sys
from vantage.client import Monitor
silent = socket.socket()
silent.bind(("127.0.0.1", 0))
silent.listen(64)  # listens, never accepts: the sender's request waits its 30 s
mon = Monitor(f"http://127.0.0.1:{silent.getsockname()[1]}", None, run_name="slow",
              spool_dir=sys.argv[1], request_timeout_s=30)
for step in range(3_000):
    mon.log_groups(step, [[1.0, 0.0]] * 4)
mon.close(timeout=0)
"""


def test_exit_right_after_close_keeps_every_group_and_the_end_behind_a_slow_request(tmp_path):
    """close(timeout=0) and exit while the sender waits on a request that outlasts the exit's
    grace: the queue and rank 0's final status were lost with the process (7,000 of 12,000
    groups, and the run stayed `running` after `vantage sync`: a trial). Now the exiting thread
    spools them itself."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", EXIT_BEHIND_A_SLOW_REQUEST, str(tmp_path)],
                   check=True, timeout=120)  # fmt: skip
    assert time.monotonic() - t0 < 60
    (path,) = tmp_path.glob("*.vantage-spool")
    spool = Spool(path)
    try:
        assert spool.pending_groups == 12_000
        assert spool.get_meta("finish") == "finished"
    finally:
        spool.close()


def test_usable_server_urls_pass():
    for url in ("http://127.0.0.1:8000", "https://vantage.example.com/", "http://[::1]:8000",
                "https://example.com/vantage/"):  # fmt: skip
        assert server_url_problem(url) is None, url
    said = server_url_problem("https://example.com/vantage/api/v1/")
    assert said.endswith("ends in /api/v1: give the server's base URL, which Vantage adds "
                         "/api/v1/... to (https://example.com/vantage)"), said  # fmt: skip


def test_the_sync_hint_at_close_can_be_pasted(tmp_path: Path, caplog):
    folder = tmp_path / "my spool"
    mon = Monitor(None, None, run_name="u", spool_dir=folder)
    mon.log_groups(0, [[1.0, 0.0]])
    mon.close(timeout=2)
    message = next(r.getMessage() for r in caplog.records if "not on the server yet" in r.message)
    assert f"vantage sync '{mon.spool_path}' --server URL" in message, message


def test_clean_spool_file_is_removed_on_close(tmp_path: Path):
    mon = Monitor(None, None, spool_dir=tmp_path)
    mon.close(timeout=1)
    assert not mon.spool_path.exists()


group_sizes = st.lists(st.integers(min_value=1, max_value=40), min_size=0, max_size=60)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(group_sizes, min_size=1, max_size=6),
    st.integers(2, 50),
    st.integers(600, 5000),
    st.integers(1, 4),
)
def test_packing_respects_limits_and_keeps_order(records, max_groups, max_bytes, max_records):
    recs = []
    expected = []
    for step, sizes in enumerate(records):
        groups = [{"group_id": f"{step}-{i}", "rewards": [0.5] * n} for i, n in enumerate(sizes)]
        expected += [(step, g["group_id"]) for g in groups]
        header = {"step": step, "rank": 0, "scalars": {"loss": 1.0}}
        recs.append((header, encode_groups(groups, chunk_groups=2)))
    bodies = pack_records(recs, max_groups=max_groups, max_bytes=max_bytes, max_records=max_records)
    seen = []
    scalars_per_step: dict[int, int] = {}
    for body, n in bodies:
        assert len(body) <= max_bytes
        decoded = orjson.loads(body)
        assert sum(len(r["groups"]) for r in decoded) == n <= max_groups
        assert len(decoded) <= max_records
        for r in decoded:
            seen += [(r["step"], g["group_id"]) for g in r["groups"]]
            scalars_per_step[r["step"]] = scalars_per_step.get(r["step"], 0) + ("scalars" in r)
    assert seen == expected
    assert all(v == 1 for v in scalars_per_step.values()) and len(scalars_per_step) == len(records)


def test_packing_at_the_real_limits():
    groups = [{"group_id": str(i), "rewards": [0.123456789] * 16} for i in range(25_000)]
    bodies = pack_records([({"step": 0}, encode_groups(groups))])
    assert [n for _, n in bodies] == [10_000, 10_000, 5_000]
    big = [{"group_id": str(i), "rewards": [0.123456789] * 4096} for i in range(200)]
    bodies = pack_records([({"step": 1}, encode_groups(big))])
    assert all(len(b) < 8 * 1024 * 1024 for b, _ in bodies) and len(bodies) > 1
    assert sum(n for _, n in bodies) == 200
    scalars_only = [({"step": s, "scalars": {"loss": 0.5}}, []) for s in range(25_000)]
    bodies = pack_records(scalars_only)
    assert [len(orjson.loads(b)) for b, _ in bodies] == [10_000, 10_000, 5_000]


def test_backoff_grows_jittered_capped_and_honours_retry_after():
    b = Backoff()
    delays = [b.next_delay() for _ in range(12)]
    assert 0.25 <= delays[0] <= 0.5 and 0.5 <= delays[1] <= 1.0
    assert all(15.0 <= d <= 30.0 for d in delays[8:])
    b.reset()
    assert b.next_delay(retry_after=7.0) == 7.0
    assert _retry_after("3") == 3.0 and _retry_after("soon") is None


def test_launch_id_derivation(monkeypatch):
    for var in ("VANTAGE_LAUNCH_ID", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(var, raising=False)
    a, b = derive_launch_id(), derive_launch_id()
    assert a != b  # a fresh UUID each time without any hint
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # plain torchrun: every launch "none-0"
    assert derive_launch_id() != derive_launch_id()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert derive_launch_id() == "job7-2"
    monkeypatch.setenv("VANTAGE_LAUNCH_ID", "from-vantage-train")
    assert derive_launch_id() == "from-vantage-train"
    assert derive_launch_id("explicit") == "explicit"


DIST_SCRIPT = """
import os, sys, torch, torch.distributed as dist
for v in ("VANTAGE_LAUNCH_ID", "TORCHELASTIC_RUN_ID"):
    os.environ.pop(v, None)
dist.init_process_group("gloo", init_method=sys.argv[1], rank=int(sys.argv[2]), world_size=2)
from vantage.client import Monitor
mon = Monitor(None, None, spool_dir=sys.argv[3])
print("LAUNCH", mon.rank, mon.world_size, mon.launch_id)
mon.close(timeout=1)
if dist.get_rank() == 0:  # a Monitor on one rank only must not wait for the others
    again = Monitor(None, None, spool_dir=sys.argv[3])
    print("AGAIN", again.launch_id)
    again.close(timeout=1)
dist.barrier()
dist.destroy_process_group()
"""


def test_launch_id_is_broadcast_by_torch_distributed(tmp_path: Path):
    init = f"file://{tmp_path / 'rendezvous'}"
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("TORCHELASTIC")}
    env.pop("VANTAGE_LAUNCH_ID", None)
    procs = [
        subprocess.Popen([sys.executable, "-c", DIST_SCRIPT, init, str(r), str(tmp_path / str(r))],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for r in (0, 1)
    ]  # fmt: skip
    outs = [p.communicate(timeout=120)[0] for p in procs]
    lines = [next(ln for ln in o.splitlines() if ln.startswith("LAUNCH")).split() for o in outs]
    assert [ln[1:3] for ln in lines] == [["0", "2"], ["1", "2"]]
    assert lines[0][3] == lines[1][3]
    again = next(ln for ln in outs[0].splitlines() if ln.startswith("AGAIN")).split()[1]
    assert again == lines[0][3]  # the same launch


def test_trl_reward_wrapper_weighted_sum_and_designated_function(tmp_path: Path):
    from types import SimpleNamespace

    from vantage.client.integrations.trl import VantageRewards, prompt_id

    def acc(prompts, completions, **kw):
        return [1.0 if c.endswith("!") else 0.0 for c in completions]

    def fmt(prompts, completions, **kw):
        return [None if c == "?" else 0.5 for c in completions]

    state = SimpleNamespace(global_step=6)
    prompts = ["p1"] * 2 + ["p2"] * 2
    completions = ["a!", "b", "?", "c"]
    summed = offline(tmp_path / "sum")
    wrapped = VantageRewards(summed, [acc, fmt], reward_weights=[1.0, 2.0], num_generations=2)
    assert [f.__name__ for f in wrapped.reward_funcs] == ["acc", "fmt"]
    for f in wrapped.reward_funcs:
        f(prompts=prompts, completions=completions, trainer_state=state)
    only = offline(tmp_path / "one")
    designated = VantageRewards(only, [acc, fmt], num_generations=2, log_func="acc")
    assert designated.reward_funcs[1] is fmt  # only the designated function is wrapped
    designated.reward_funcs[0](prompts=prompts, completions=completions, trainer_state=state)
    summed.close(timeout=2)
    only.close(timeout=2)
    (rec,) = spooled_records(summed.spool_path)
    assert rec["step"] == 7  # global_step + 1, as TRL logs it
    # TRL's nansum: "?" was scored by acc only (0) → 0.0; each group is one prompt's 2 completions
    assert [g["rewards"] for g in rec["groups"]] == [[2.0, 1.0], [0.0, 1.0]]
    assert [g["prompt_id"] for g in rec["groups"]] == [prompt_id("p1"), prompt_id("p2")]
    (rec,) = spooled_records(only.spool_path)
    assert [g["rewards"] for g in rec["groups"]] == [[1.0, 0.0], [0.0, 0.0]]


def test_close_is_bounded_with_a_long_queue_and_no_server(tmp_path: Path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens here once closed
    mon = Monitor(dead, None, spool_dir=tmp_path, max_queue_groups=10_000_000)
    rewards = torch.rand(64, 16)
    for step in range(3000):  # 192,000 groups, far more than can be spooled in the timeout
        mon.log_groups(step, rewards)
    t0 = time.monotonic()
    mon.close(timeout=1.0)
    assert time.monotonic() - t0 < 1.5
    assert mon.spooled_groups > 0  # what it had time for is on disk


def test_rejected_calls_are_all_counted_and_the_log_says_when_it_goes_quiet(tmp_path: Path, caplog):
    """Five warnings of each kind, then every 1,000th: a kind that went quiet no longer hides
    the first warnings of another (a trial's later bad calls vanished without a word)."""
    mon = offline(tmp_path)
    for _ in range(7):
        mon.log_groups(2**63, [[1.0, 0.0]])  # a step beyond int64
    mon.log_groups(1, None)  # another kind
    mon.log_scalars(2**63, {"a": 1.0})
    mon.ack("c1", "weird", 3)  # never raised into the training loop
    mon.close(timeout=2)
    said = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert len(said) == 8 and mon.stats["rejected_calls"] == 10
    assert "only every 1,000th of this kind is logged" in said[4] and "1,000th" not in said[0]
    assert said[1].endswith("[warning 2 of this kind]"), said[1]
    assert "log_groups(step=1)" in said[5] and "log_scalars" in said[6] and "ack('c1')" in said[7]
    # Another mistake of the same call and type is its own kind (a trial's later bad calls of
    # log_groups vanished after five others); the same mistake at another step is not.
    caplog.clear()
    other = offline(tmp_path / "two")
    for step in range(7):
        other.log_groups(step, [[1.0, 0.0]], split="a b")
    other.log_groups(7, [[1.0, 0.0]], rank=5)
    other.close(timeout=1)
    said = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert sum("split" in m for m in said) == 5 and "rank 5" in said[-1]
    with pytest.raises(ValueError, match="weird"):
        offline(tmp_path / "strict", strict=True).ack("c1", "weird", 3)


def test_scalars_and_masks_that_cannot_be_sent_are_named(tmp_path: Path, caplog):
    """Dropped where the server would refuse the batch, and said so: a mask of the wrong size
    in the call (the sender thread found it, later), a scalar that is no number in the
    background."""
    mon = offline(tmp_path)
    mon.log_scalars(4, {"loss": 0.5, "kl": "x", "n": None, "gn": float("nan")})
    for _ in range(7):  # one mask entry for two rewards, as a loop would repeat it
        mon.log_groups(4, [[1.0, 0.0]], mask=[[1]])
    mon.log_groups(4, [[0.0, 1.0, 1.0]])
    mon.close(timeout=2)
    said = " | ".join(r.getMessage() for r in caplog.records)
    assert "scalar 'kl' is the text 'x', not a number" in said and "'n'" not in said
    ignored = [r for r in caplog.records if "log_groups(step=4) ignored" in r.getMessage()]
    assert len(ignored) == 5 and "mask has 1 entries for 2 rewards" in said  # then quiet
    (rec,) = spooled_records(mon.spool_path)
    # kept, as JSON can carry them: NaN as its text, None as null (the API's "no value")
    assert rec["scalars"] == {"loss": 0.5, "n": None, "gn": "NaN"}
    assert [g["rewards"] for g in rec["groups"]] == [[0.0, 1.0, 1.0]]


def test_a_step_whose_only_call_was_dropped_sends_nothing(tmp_path: Path):
    """It reached the server as an empty point (n_groups 0) in the step's chart."""
    mon = offline(tmp_path)
    mon.log_groups(3, [[1.0, 0.0]], mask=[[1]])  # dropped in the background
    mon.log_scalars(3, {"loss": "x"})  # refused in the call
    mon.log_groups(4, [[0.0, 1.0]])
    mon.close(timeout=2)
    assert [r["step"] for r in spooled_records(mon.spool_path)] == [4]


def test_ranks_of_one_launch_share_a_run_without_a_run_id(tmp_path: Path):
    """Two ranks given one launch_id but no run_id registered two runs, each with half the
    groups (a trial): the run id follows from the launch, name and project."""

    def mon(rank: int, **kw: object) -> Monitor:
        args = {"run_name": "r", "launch_id": "L1", "rank": rank, "world_size": 2, **kw}
        m = Monitor(None, spool_dir=str(tmp_path / f"s{rank}{len(kw)}"), **args)
        m.close(timeout=0)
        return m

    assert mon(0).run_id == mon(1).run_id
    assert mon(0).run_id != mon(0, run_name="other").run_id
    assert mon(0, run_id="mine").run_id == "mine"


def test_a_heartbeat_counts_a_backlog_not_a_batch_in_flight(tmp_path: Path):
    """A healthy trainer's heartbeat counted the groups on their way to the server, so its run
    showed "N spooled" as if the server were behind; a backlog is said while the server fails
    or beyond one batch."""
    mon = offline(tmp_path, batch_groups=20)

    def health_after(step: int, groups: int) -> int:
        waiting = mon.spooled_groups + groups
        mon.log_groups(step, [[0.0, 1.0]] * groups)
        deadline = time.monotonic() + 10
        while mon.spooled_groups < waiting:  # the sender moves them to the spool
            assert time.monotonic() < deadline, (step, mon.spooled_groups, mon._worker.queued)
            time.sleep(0.02)
        return orjson.loads(mon._worker.health())["spooled_groups"]

    try:
        assert health_after(0, 12) == 0  # within a batch, with nothing failing: in flight
        mon._worker.outage.failed(time.monotonic())
        assert health_after(1, 2) == 14  # while the server fails, every waiting group
        mon._worker.outage.succeeded(time.monotonic())
        assert health_after(2, 12) == 26  # more than a batch waits
    finally:
        mon.close(timeout=0)


def test_help_shows_the_parameters_of_the_log_calls():
    """help(Monitor.log_groups) showed `*args, **kwargs` (a trial)."""
    import inspect

    params = inspect.signature(Monitor.log_groups).parameters
    assert {"group_ids", "mask", "prompt_ids", "split", "rank"} <= set(params)
    assert "mitigation" in inspect.signature(Monitor.log_effective).parameters
    assert "split" in inspect.signature(Monitor.log_scalars).parameters
    assert "[P, G]" in Monitor.log_groups.__doc__ and "strict" in Monitor.log_groups.__doc__


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [({"batch_groups": 0}, "batch_groups must be above 0"),
     ({"batch_interval_s": float("nan")}, "batch_interval_s must be above 0"),
     ({"max_queue_groups": -1}, "max_queue_groups must be above 0"),
     ({"run_id": ""}, "run_id is empty"),
     ({"request_timeout_s": -1}, "request_timeout_s must be above 0"),
     ({"spool_max_bytes": -5}, "spool_max_bytes must be above 0")],
)  # fmt: skip
def test_constructor_arguments_that_cannot_work_raise(tmp_path: Path, kwargs, said):
    """batch_groups=0 was taken and ignored, run_id="" read as no run_id (a trial)."""
    with pytest.raises(ValueError, match=said):
        Monitor(None, run_name="c", spool_dir=tmp_path, **kwargs)


def test_flat_rewards_are_split_by_group_size(tmp_path: Path, caplog):
    """TRL's rewards are P·G flat values, prompt by prompt: they were refused as "a 1-D
    input" though the Monitor knew the run's group_size (a trial)."""
    mon = offline(tmp_path, group_size=2)
    mon.log_groups(0, torch.tensor([1.0, 0.0, 1.0, 1.0]))  # the Monitor's group_size
    mon.log_groups(0, np.array([0, 0, 0, 1, 1, 1]), group_size=3)  # the call's
    mon.log_groups(0, [1.0, 0.0], mask=[1, 0])
    mon.log_groups(0, [1.0, 0.0, 1.0])  # not whole groups: refused, said
    mon.log_groups(0, [[1.0, 0.0, 1.0]])  # [P, G] as before, any G
    mon.close(timeout=2)
    (rec,) = spooled_records(mon.spool_path)
    assert [g["rewards"] for g in rec["groups"]] == [
        [1.0, 0.0], [1.0, 1.0], [0, 0, 0], [1, 1, 1], [1.0, 0.0], [1.0, 0.0, 1.0]
    ]  # fmt: skip
    assert rec["groups"][4]["mask"] == [1, 0]
    assert "rewards has 3 values, not whole groups of group_size 2" in caplog.text
    plain = offline(tmp_path / "plain", strict=True)
    with pytest.raises(TypeError, match="or give group_size"):
        plain.log_groups(0, [1.0, 0.0])


def test_a_whole_float_group_size_is_taken_and_a_bad_mask_refused_in_the_caller(tmp_path: Path):
    """`group_size=4.0` failed with Python's own error about slicing; a mask whose groups have
    other sizes than the rewards' was found on the sender thread, and the call's groups
    dropped there, later (trials): both are decided in the call."""
    mon = offline(tmp_path, strict=True)
    mon.log_groups(0, [1.0, 0.0, 1.0, 1.0], group_size=4.0)
    with pytest.raises(ValueError, match="group_size must be a whole number"):
        mon.log_groups(0, [1.0, 0.0, 1.0, 1.0], group_size=2.5)
    for size in (0, -1):  # "outside [0, 65536]" though 0 is refused too (a trial)
        with pytest.raises(ValueError, match=rf"group_size {size} is outside \[1, 65536\]"):
            mon.log_groups(0, [1.0, 0.0], group_size=size)
    whole = offline(tmp_path / "m", group_size=4.0)  # the Monitor's too
    assert whole.group_size == 4
    whole.close(timeout=2)
    with pytest.raises(ValueError, match="group_size must be a whole number"):
        offline(tmp_path / "n", group_size=2.5)
    for mask in ([[1, 1, 0]], torch.ones(1, 3), np.ones((1, 3))):
        with pytest.raises(ValueError, match="group 0: mask has 3 entries for 4 rewards"):
            mon.log_groups(1, torch.ones(1, 4), mask=mask)
    mon.log_groups(2, [[1.0, 0.0], [1.0]], mask=[[1, 0], [1]])  # ragged alike: taken
    mon.close(timeout=2)
    records = spooled_records(mon.spool_path)
    assert [g["rewards"] for r in records for g in r["groups"]] == [
        [1.0, 0.0, 1.0, 1.0],
        [1.0, 0.0],
        [1.0],
    ]


@pytest.mark.parametrize(
    "rewards",
    [torch.ones(2, 3), np.ones((2, 3)), [[1.0, 0.0, 1.0], [1.0, 1.0]], [[1.0, 0.0, 1.0]] * 2],
)
def test_rows_that_contradict_the_calls_group_size_are_refused(tmp_path: Path, rewards):
    """A [P, G] input with group_size=4 was sent as groups of 3 (or ragged), the call's
    group_size ignored (a trial)."""
    mon = offline(tmp_path, strict=True, group_size=3)  # the Monitor's may differ from rows
    with pytest.raises(ValueError, match="group_size is 4"):
        mon.log_groups(0, rewards, group_size=4)
    mon.log_groups(0, [[1.0, 0.0], [1.0, 1.0, 0.0]])  # ragged rows, no group_size: taken
    mon.close(timeout=2)
    (rec,) = spooled_records(mon.spool_path)
    assert [len(g["rewards"]) for g in rec["groups"]] == [2, 3]
