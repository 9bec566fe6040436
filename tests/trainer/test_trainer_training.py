"""GRPO end to end on a small model: monitoring, commands, checkpoints, resume, AAPO, KL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from vantage.client.acr import summarize_rewards
from vantage.client.commands import Command
from vantage.trainer.commands import apply_command
from vantage.trainer.run import fit, setup, train

from tests.helpers.trainer import RecordingMonitor, recording_monitors, small_config


def scripted_factory(script, log):
    def factory(**kwargs):
        mon = RecordingMonitor(**kwargs)
        mon.script = script
        log.append(mon)
        return mon

    return factory


def test_commands_after_a_checkpoint_at_one_boundary_are_in_the_final_checkpoint(
    warm_policy, tmp_path
):
    """checkpoint, set_sampling, stop at one step boundary: the stop's save holds the new
    temperature (it used to reuse the checkpoint command's save of that step)."""
    script = {
        3: [
            {"command_id": "k1", "type": "checkpoint", "params": {}},
            {"command_id": "k2", "type": "set_sampling", "params": {"temperature": 0.5}},
            {"command_id": "k3", "type": "stop", "params": {}},
        ]
    }
    log: list[RecordingMonitor] = []
    cfg = small_config(tmp_path / "run", init_checkpoint=warm_policy, steps=10)
    summary = train(cfg, [], monitor_factory=scripted_factory(script, log))
    assert summary["stopped"] and summary["steps_completed"] == 2
    assert [a[1] for a in log[0].acks] == ["applied"] * 3
    state = torch.load(Path(summary["checkpoint"]) / "state.pt", weights_only=False)
    assert state["temperature"] == 0.5 and {"k1", "k2", "k3"} <= set(state["seen_commands"])


def test_streams_to_the_monitor_and_obeys_commands(warm_policy, tmp_path):
    avspo = {"command_id": "c1", "type": "set_mitigation", "params": {"mode": "avspo"}}
    script = {
        # poll 1 is the boundary before step 1; poll k + 1 the boundary after step k
        3: [
            avspo,
            {"command_id": "c2", "type": "set_sampling", "params": {"temperature": 0.7}},
            {"command_id": "c3", "type": "launch_rockets", "params": {}},
            {"command_id": "c4", "type": "set_mitigation", "params": {"mode": "ppo"}},
            {"command_id": "c6", "type": "set_sampling", "params": {"temperature": 0}},
        ],
        4: [avspo],  # delivered again (at-least-once): applied only once
        5: [{"command_id": "c5", "type": "stop", "params": {}}],
    }
    log: list[RecordingMonitor] = []
    cfg = small_config(tmp_path / "run", init_checkpoint=warm_policy, steps=10, eval_every=2)
    summary = train(cfg, [], monitor_factory=scripted_factory(script, log))
    (mon,) = log

    assert mon.kwargs["run_id"] == summary["run_id"]
    assert mon.kwargs["rank"] == 0 and mon.kwargs["world_size"] == 1
    assert mon.kwargs["reward_min"] == 0.0 and mon.kwargs["reward_max"] == 1.0
    assert mon.kwargs["trainer_eps"] == 1e-4 and "api_key" not in mon.kwargs["config"]
    # stop after step 4: checkpoint, summary says stopped, the monitor closed as finished
    assert summary["stopped"] and summary["steps_completed"] == 4
    assert (Path(summary["checkpoint"]) / "state.pt").exists()
    assert mon.closed == "finished"
    acks = {a[0]: a[1:3] for a in mon.acks}
    assert acks == {
        "c1": ("applied", 2),
        "c2": ("applied", 2),
        "c3": ("rejected", 2),
        "c4": ("rejected", 2),
        "c6": ("rejected", 2),  # greedy sampling would collapse every group
        "c5": ("applied", 4),
    }
    assert [a[0] for a in mon.acks].count("c1") == 1
    details = dict((a[0], a[3]) for a in mon.acks)
    assert "unknown command type" in details["c3"] and "from 0.01 to 10" in details["c6"]

    # raw rewards of every step, [P, G], with prompt ids
    assert [g[0] for g in mon.groups] == [1, 2, 3, 4]
    for _, rewards, prompt_ids in mon.groups:
        assert len(rewards) == 4 and all(len(r) == 4 for r in rewards)
        assert len(prompt_ids) == 4 and all("+" in p for p in prompt_ids)
    history = {r["step"]: r for r in summary["history"]}
    assert [history[s]["mitigation"] for s in (1, 2, 3, 4)] == ["none", "none", "avspo", "avspo"]
    reported = dict(mon.mitigations)  # what the trainer says is in effect, step by step
    assert [reported[s]["mode"] for s in (1, 2, 3, 4)] == ["none", "none", "avspo", "avspo"]
    assert reported[3] == {"mode": "avspo", "threshold": "fixed", "alpha": 0.5, "eta": 0.01}
    assert [history[s]["temperature"] for s in (2, 3)] == [1.0, 0.7]

    # effective statistics after mitigation; AVSPO leaves no zero-advantage group behind
    effective = dict(mon.effective)
    for step, rewards, _ in mon.groups:
        collapsed = sum(summarize_rewards(r).cls == "collapsed" for r in rewards)
        acr = collapsed / len(rewards)
        assert history[step]["acr"] == acr
        if step <= 2:
            assert effective[step] == {"n_valid": 4, "n_zero_advantage": collapsed, "n_virtual": 0}
        else:
            assert effective[step]["n_zero_advantage"] == 0
            assert (effective[step]["n_virtual"] > 0) == (collapsed > 0)

    scalars = {}
    for step, values in mon.scalars:
        scalars.setdefault(step, {}).update(values)
    for key in (
        "loss",
        "kl",
        "entropy",
        "reward",
        "lr",
        "temperature",
        "avspo_tau",
        "acr",
        "step_s",
        "time_generate_s",
        "time_train_s",
        "grad_norm",
    ):
        assert key in scalars[1], key
    assert "eval_accuracy" in scalars[2] and "eval_accuracy" in scalars[4]
    # reward_std, the dashboard's band around the reward mean (the demo showed none: a trial)
    for step, rewards, _ in mon.groups:
        every = torch.tensor(rewards, dtype=torch.float64)
        assert scalars[step]["reward_std"] == pytest.approx(every.std(correction=0).item())
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps_completed"] == 4


class Broken:
    """A monitor whose every method raises."""

    run_id = "broken"

    def __getattr__(self, name):
        def fail(*args, **kwargs):
            raise ConnectionError(f"{name}: server on fire")

        return fail


def test_monitoring_trouble_never_stops_training(warm_policy, tmp_path):
    cfg = small_config(tmp_path / "a", init_checkpoint=warm_policy, steps=2)
    assert train(cfg, [], monitor_factory=lambda **kw: Broken())["steps_completed"] == 2

    def refuses(**kwargs):
        raise RuntimeError("cannot reach server")

    cfg = small_config(tmp_path / "b", init_checkpoint=warm_policy, steps=2)
    assert train(cfg, [], monitor_factory=refuses)["steps_completed"] == 2


def test_resume_continues_exactly(warm_policy, tmp_path):
    common = {
        "init_checkpoint": warm_policy,
        "mitigation": "avspo",
        "avspo_threshold": "adaptive",
        "avspo_tau0": 0.1,
        "lr": 3e-3,
    }
    straight = train(small_config(tmp_path / "straight", steps=4, **common))

    log: list[RecordingMonitor] = []
    factory = scripted_factory({}, log)
    first = train(small_config(tmp_path / "split", steps=2, **common), monitor_factory=factory)
    second = train(small_config(tmp_path / "split", steps=4, **common), monitor_factory=factory)
    assert first["steps_completed"] == 2 and second["start_step"] == 2
    assert second["steps_completed"] == 4

    def trace(history):
        return [(r["step"], r["reward"], r["acr"], r["avspo_tau"], r["loss"]) for r in history]

    assert trace(first["history"] + second["history"]) == trace(straight["history"])
    # the Monitor continues the same run as a new launch
    assert log[0].kwargs["run_id"] == log[1].kwargs["run_id"] == first["run_id"]
    assert log[1].kwargs["launch_id"] is None
    a = torch.load(Path(straight["checkpoint"]) / "state.pt", weights_only=False)
    b = torch.load(Path(second["checkpoint"]) / "state.pt", weights_only=False)
    assert a["avspo_state"] == b["avspo_state"]
    # another config in that folder is refused before anything is loaded or written
    other = small_config(tmp_path / "split", steps=6, **{**common, "group_size": 3})
    config_json = (tmp_path / "split" / "config.json").read_text()
    with pytest.raises(ValueError, match=r"checkpoint of another config \(group_size 4, here 3\)"):
        setup(other)
    assert (tmp_path / "split" / "config.json").read_text() == config_json
    # so is another project (the server answers 409, and the launch trained into a spool that
    # no sync could upload: a trial); left out, the run keeps its own
    moved = small_config(tmp_path / "split", steps=6, **common, project="elsewhere")
    with pytest.raises(ValueError, match=r"project None, here 'elsewhere': a run's project is"):
        setup(moved)
    assert (tmp_path / "split" / "config.json").read_text() == config_json


def test_a_resume_that_leaves_the_project_out_keeps_it(warm_policy, tmp_path):
    """It wrote None into the checkpoint, and the next resume naming the project was refused
    as "another config" (a trial)."""
    common = {"init_checkpoint": warm_policy, "project": "pA"}
    train(small_config(tmp_path, steps=1, **common))
    kept = train(small_config(tmp_path, steps=2, init_checkpoint=warm_policy))
    assert kept["start_step"] == 1
    assert json.loads((tmp_path / "config.json").read_text())["project"] == "pA"
    assert train(small_config(tmp_path, steps=3, **common))["start_step"] == 2


def test_aapo_reference_is_the_step0_policy(warm_policy, tmp_path):
    # with SFT the step-0 policy is a snapshot saved with the run
    trainer = setup(
        small_config(
            tmp_path / "sft", init_checkpoint=warm_policy, sft_steps=5, steps=2, mitigation="aapo"
        )
    )
    assert json.loads((tmp_path / "sft" / "reference.json").read_text())["kind"] == "snapshot"
    start = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    summary = fit(trainer)
    reference = trainer.ensure_reference().state_dict()
    assert all(torch.equal(reference[k], start[k]) for k in start)
    assert any(not torch.equal(trainer.policy.state_dict()[k], start[k]) for k in start)
    assert [r["mitigation"] for r in summary["history"]] == ["aapo", "aapo"]

    # loaded unchanged from files: the reference points at them, no copy
    setup(small_config(tmp_path / "files", init_checkpoint=warm_policy))
    spec = json.loads((tmp_path / "files" / "reference.json").read_text())
    assert spec["kind"] == "source" and spec["init_checkpoint"] == warm_policy
    assert not (tmp_path / "files" / "reference").exists()


def test_set_mitigation_aapo_mid_run_and_kl(warm_policy, tmp_path, caplog):
    caplog.set_level("INFO", logger="vantage.trainer")
    trainer = setup(
        small_config(tmp_path / "run", init_checkpoint=warm_policy, steps=3, kl_beta=0.1)
    )
    switched = []

    def hook(t, record):
        if record["step"] == 1:
            t.submit_command("set_mitigation", {"mode": "aapo", "delta_high": 0.3})
        if record["step"] == 2:  # above the delta_high in effect: rejected (a trial found it)
            t.submit_command("set_mitigation", {"mode": "aapo", "delta_low": 0.5})
        switched.append(t.mitigation.mode)

    summary = fit(trainer, hooks=[hook])
    history = summary["history"]
    assert history[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference at step 1
    assert history[1]["kl"] > 0
    assert [r["mitigation"] for r in history] == ["none", "aapo", "aapo"]
    assert trainer.mitigation.delta_high == 0.3
    assert summary["commands"][0]["status"] == "applied" and summary["commands"][0]["step"] == 1
    # the ack's detail lists what acts in AAPO, not AVSPO's settings
    assert summary["commands"][0]["detail"] == "mitigation aapo delta_low=-0.2 delta_high=0.3"
    rejected = summary["commands"][1]
    assert rejected["status"] == "rejected" and "would exceed delta_high 0.3" in rejected["detail"]
    assert (trainer.mitigation.delta_low, trainer.mitigation.delta_high) == (-0.2, 0.3)
    # a rejection is a warning (it was INFO, lost among the step lines: a trial)
    levels = {r.getMessage().split(" at step")[0][-8:]: r.levelname for r in caplog.records
              if r.getMessage().startswith("command set_mitigation")}  # fmt: skip
    assert levels == {" applied": "INFO", "rejected": "WARNING"}, levels
    # the ack says the tau it set (a trial's adaptive AVSPO ack left it out); a rejected
    # command sets none of it
    detail = apply_command(trainer, Command("t1", "set_mitigation", {"mode": "avspo", "tau": 0.3}))
    assert detail.endswith(" tau=0.3") and trainer.avspo_state.tau == 0.3
    with pytest.raises(ValueError):
        apply_command(
            trainer, Command("t2", "set_mitigation", {"mode": "aapo", "tau": 0.9, "delta_low": 0.5})
        )
    assert trainer.avspo_state.tau == 0.3


def test_clip_bites_with_several_updates(warm_policy, tmp_path):
    summary = train(
        small_config(
            tmp_path / "run",
            init_checkpoint=warm_policy,
            steps=2,
            num_iterations=3,
            lr=1e-2,
            micro_batch_size=5,
            eps_low=0.01,
            eps_high=0.01,
            scale_rewards="batch",
        )
    )
    assert any(r["clip_fraction"] > 0 for r in summary["history"])


def test_sft_warm_start_learns(tmp_path):
    # 64 held-out sums, not 16: with 16 one machine measured 0.25 where another passed 0.3
    # (one sum decides); with 64 it is ~0.75 after SFT against 0.0 before.
    trainer = setup(small_config(tmp_path / "run", sft_steps=150, eval_size=64))
    assert trainer.sft_stats["sft_loss"] < 0.7
    assert trainer.evaluate() >= 0.4


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_stops_at_the_next_step_with_a_checkpoint(warm_policy, tmp_path, name):
    """A scheduler's SIGTERM ended the trainer as kill -9 would, and Ctrl-C with a traceback:
    no checkpoint, the Monitor never closed, the last step lost (a trial). Either now stops at
    the step boundary."""
    import os
    import signal

    sig = signal.Signals[name]
    monitors, factory = recording_monitors()

    def preempt(trainer, record):
        if trainer.step == 2:
            os.kill(os.getpid(), sig)

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    cfg = small_config(tmp_path, init_checkpoint=warm_policy, steps=6, run_name="preempted")
    summary = train(cfg, [], monitor_factory=factory, hooks=[preempt])
    assert summary["terminated"] and summary["signal"] == name
    assert summary["steps_completed"] == 2
    assert summary["accuracy_final"] is None  # not measured (it said the start's accuracy)
    assert Path(summary["checkpoint"]).exists() and monitors[0].closed == "failed"
    assert {s: signal.getsignal(s) for s in before} == before  # restored
    resumed = train(small_config(tmp_path, init_checkpoint=warm_policy, steps=3), [])
    assert resumed["start_step"] == 2 and not resumed["terminated"]


@pytest.mark.parametrize(
    ("name", "raised"), [("SIGTERM", SystemExit), ("SIGINT", KeyboardInterrupt)]
)
def test_a_second_signal_quits_now_and_marks_the_run_failed(tmp_path, name, raised):
    """A second SIGTERM killed the process at once: the Monitor never closed, and the run read
    "running" until it went stale. It now quits as a second Ctrl-C does, closing the Monitor."""
    import os
    import signal

    sig = signal.Signals[name]
    monitors, factory = recording_monitors()

    def impatient(trainer, record):
        if trainer.step == 2:
            os.kill(os.getpid(), sig)
            os.kill(os.getpid(), sig)

    with pytest.raises(raised) as quit_now:
        train(small_config(tmp_path, steps=6), [], monitor_factory=factory, hooks=[impatient])
    if raised is SystemExit:
        assert quit_now.value.code == 128 + sig
    assert monitors[0].closed == "failed"


def test_a_signal_during_the_first_evaluation_cuts_it_short(warm_policy, tmp_path, monkeypatch):
    """SIGTERM during a large evaluation before the first step: it went on for 78 s, past a
    scheduler's grace, and said "stopping after step 1" (a trial). The evaluation now stops at
    its next chunk, the run at step 0 with a checkpoint."""
    import os
    import signal

    from vantage.trainer import grpo

    calls = []
    generate = grpo.HFBackend.generate

    def signalled(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(grpo.HFBackend, "generate", signalled)
    cfg = small_config(
        tmp_path, init_checkpoint=warm_policy, steps=3, eval_size=256, arith_max_operand=50
    )
    summary = train(cfg, [])
    assert len(calls) <= 2  # of the 4 chunks of 64
    assert summary["terminated"] and summary["signal"] == "SIGTERM"
    assert summary["steps_completed"] == 0 and summary["accuracy_start"] is None
    assert Path(summary["checkpoint"]).exists()


def test_diverged_weights_end_with_one_line_not_a_traceback(tmp_path, capsys):
    """lr=1e9 ended in torch's "probability tensor contains inf/nan" traceback (a trial)."""
    import yaml
    from vantage.trainer.run import main

    path = tmp_path / "diverge.yaml"
    config = small_config(tmp_path / "out", lr=1e9, steps=6, checkpoint_every=1)
    path.write_text(yaml.safe_dump(config))
    assert main([str(path), "--quiet"]) == 1
    assert "the policy's weights diverged" in capsys.readouterr().err
    # no checkpoint holds the diverged weights (one did, so a resume diverged again at once) ...
    from safetensors.torch import load_file

    for weights in (tmp_path / "out" / "checkpoint" / "policy").glob("*.safetensors"):
        assert all(torch.isfinite(t).all() for t in load_file(weights).values()), weights


def test_a_checkpoint_never_saves_weights_that_diverged(tmp_path):
    """lr=1e30 left a checkpoint of NaN weights in place of the last good one, so every resume
    diverged at once (a trial): such weights are refused and the last checkpoint stays."""
    from safetensors.torch import load_file
    from vantage.trainer.checkpoint import WeightsDiverged

    trainer = setup(small_config(tmp_path))
    good = Path(trainer.save_checkpoint())
    with torch.no_grad():
        next(trainer.policy.parameters())[0].fill_(float("nan"))
    trainer.step += 1
    with pytest.raises(WeightsDiverged, match="NaN or infinite"):
        trainer.save_checkpoint()
    for weights in (good / "policy").glob("*.safetensors"):
        assert all(torch.isfinite(t).all() for t in load_file(weights).values())


def test_a_resume_takes_the_settings_changed_since_the_checkpoint(tmp_path, caplog):
    """`--set lr=...` on a resume was ignored: the checkpoint's optimizer and mitigation won
    (a trial). A field the new launch changed applies; one it left alone keeps what the run
    carried (a command's temperature)."""
    caplog.set_level("INFO", logger="vantage.trainer")
    first = train(small_config(tmp_path, steps=2, lr=1e-3, temperature=1.0), [])
    assert first["history"][-1]["lr"] == pytest.approx(1e-3)
    # where a launch starts is said (output_dir is relative to the folder launched from)
    assert (
        f"no checkpoint in {Path(first['output_dir']).resolve()}: a new run starts" in caplog.text
    )
    assert "resuming from" not in caplog.text
    later = small_config(tmp_path, steps=4, lr=2e-4, mitigation="avspo", temperature=1.0)
    resumed = train(later, [])
    assert resumed["start_step"] == 2 and "resuming from" in caplog.text
    assert [r["lr"] for r in resumed["history"]] == pytest.approx([2e-4, 2e-4])
    assert resumed["mitigation"] == "avspo"
    assert "lr 0.001 → 0.0002; mitigation 'none' → 'avspo'" in caplog.text
    # a field outside those (a harder task, more steps) is used as given and said too
    assert "differs from the checkpoint's: steps 2 → 4" in caplog.text
    harder = small_config(tmp_path, steps=5, lr=2e-4, mitigation="avspo", arith_max_operand=50)
    train(harder, [])
    assert "arith_max_operand 9 → 50; steps 4 → 5" in caplog.text


@pytest.mark.parametrize(("name", "status"), [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_signal_during_the_warm_start_ends_with_one_line(tmp_path, name, status):
    """SIGTERM in the SFT warm start killed the trainer without a word, Ctrl-C printed a
    KeyboardInterrupt traceback (a trial): both end with one line and 128 + the signal."""
    import signal
    import subprocess
    import sys
    import time

    import yaml

    config = small_config(tmp_path / "out", sft_steps=1_000_000)
    path = tmp_path / "warm.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        [sys.executable, "-m", "vantage.trainer.run", str(path), "--quiet"],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "out" / "config.json").exists():  # set-up has begun
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(1.0)  # into the warm start
    proc.send_signal(getattr(signal, name))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    assert f"{name} before the first GRPO step" in err and "Traceback" not in err, err


@pytest.mark.parametrize(("name", "status"), [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_signal_while_the_trainer_loads_ends_with_one_line(tmp_path, name, status):
    """`vantage train` spends seconds importing torch and transformers: SIGTERM then ended it
    without a word, Ctrl-C with a KeyboardInterrupt traceback."""
    import signal
    import subprocess
    import sys
    import time

    vantage = str(Path(sys.executable).with_name("vantage"))
    proc = subprocess.Popen(
        [vantage, "train", "arith-tiny", "--set", f"output_dir={tmp_path / 'out'}"],
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)  # the imports take several seconds (7 s here; more under load)
    proc.send_signal(getattr(signal, name))
    try:
        _, err = proc.communicate(timeout=30)
        again = False
    except subprocess.TimeoutExpired:
        # Seen once in CI and once in 14 tries here: a signal at one moment of the imports is
        # lost and loading goes on (a second Ctrl-C ends it). The second one still ends the
        # run in one line, at whichever stage it has reached.
        proc.send_signal(getattr(signal, name))
        _, err = proc.communicate(timeout=60)
        again = True
    assert proc.returncode == status, err
    assert "Traceback" not in err, err
    if again:
        assert f"{name} while loading the trainer" in err or f"{name} before the first" in err
    else:
        assert f"{name} while loading the trainer" in err, err
        assert not (tmp_path / "out").exists()


def test_a_checkpoint_that_cannot_be_written_does_not_end_training(tmp_path, caplog):
    """An output_dir replaced by a file mid-run ended training with NotADirectoryError at the
    next checkpoint (a trial): the failure is logged and the steps go on."""
    import shutil

    out = tmp_path / "out"

    def break_folder(trainer, record):
        if trainer.step == 1:
            shutil.rmtree(out)
            out.write_text("not a folder any more")

    summary = train(small_config(out, steps=3, checkpoint_every=1), [], hooks=[break_folder])
    assert summary["steps_completed"] == 3 and summary["checkpoint"] is None
    assert "could not write the checkpoint of step 1" in caplog.text


def test_the_adaptive_threshold_reports_its_tau(tmp_path):
    """A τ set by command was applied but missing from the mitigation each step reports."""
    monitors, factory = recording_monitors()

    cfg = small_config(tmp_path, steps=2, mitigation="avspo", avspo_threshold="adaptive")
    train(cfg, [], monitor_factory=factory)
    reported = [m for _, m in monitors[0].mitigations]
    assert all(m["mode"] == "avspo" and 0 <= m["tau"] <= 1 for m in reported), reported


def test_the_progress_bar_shows_the_mode_each_step_trained_with(tmp_path, monkeypatch):
    """A command applied after step 4 showed mode=avspo on step 4's line, which trained with
    none (the demo: a trial)."""
    import tqdm.auto

    shown = []
    monkeypatch.setattr(tqdm.auto.tqdm, "set_postfix", lambda bar, **kw: shown.append(kw["mode"]))

    def switch_after_step_2(trainer, record):
        if trainer.step == 2:
            trainer.submit_command("set_mitigation", {"mode": "avspo"})

    train(small_config(tmp_path, steps=4), hooks=[switch_after_step_2])
    assert shown == ["none", "none", "avspo", "avspo"]


def test_log_lines_are_not_written_over_the_progress_bar(tmp_path, capsys):
    """A warning logged while the bar was drawn went on the bar's line ("  50%|#### | 2/4
    [...]WARNING ..."), and the next redraw overwrote it: a trial."""
    import logging
    import sys

    console = logging.StreamHandler(sys.stderr)  # what `vantage train`'s basicConfig adds
    logging.getLogger().addHandler(console)

    def warn_after_step_2(trainer, record):
        if trainer.step == 2:
            logging.getLogger("vantage.test").warning("a line of its own")

    try:
        train(small_config(tmp_path, steps=4, progress=True), hooks=[warn_after_step_2])
    finally:
        logging.getLogger().removeHandler(console)
    err = capsys.readouterr().err
    assert "4/4" in err  # the bar was drawn
    [line] = [ln for ln in err.split("\n") if "a line of its own" in ln]
    assert line.split("\r")[-1] == "a line of its own", repr(line)


def test_a_signal_during_a_finalizer_is_not_lost():
    """An exception raised in a __del__ is printed and dropped by Python: a Ctrl-C that landed
    in one (regex's, while `vantage train` imported) was lost and loading went on (a CI run).
    It is sent again once the finalizer is done, and ends the set-up as any other."""
    import os
    import signal
    import time

    from vantage.trainer.signals import Interrupted, interrupt_on_signals

    class Finalized:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10_000):  # the handler runs here, inside __del__
                pass

    with pytest.raises(Interrupted), interrupt_on_signals():
        Finalized()  # dropped at once: its __del__ receives the signal
        time.sleep(5)
