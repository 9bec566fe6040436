"""A real ``trl.GRPOTrainer`` on a tiny model built from a config, on CPU, wired to a real server
through ``vantage.client.integrations.trl.attach``: for every step the ACR Vantage stores equals
the ``frac_reward_zero_std`` TRL logs, and commands from the server reach the trainer."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from vantage.client import Monitor  # noqa: E402
from vantage.client.integrations.trl import _CallbackMixin, attach  # noqa: E402

from tests.helpers.server import RestartableServer, free_port  # noqa: E402

CHARS = list("0123456789+-*= ")


def tiny_model_and_tokenizer() -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, **{c: i + 3 for i, c in enumerate(CHARS)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<bos>",
                                  eos_token="<eos>")  # fmt: skip
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=64, tie_word_embeddings=True, pad_token_id=0,
                      bos_token_id=1, eos_token_id=2)  # fmt: skip
    return LlamaForCausalLM(cfg), tok


def sure_or_parity(completions, prompts=None, **kw):
    """Constant 1 for prompts starting with 1 or 2 (collapsed groups), else a coin-like 0/1."""
    return [
        1.0 if p[0] in "12" else float(len(c) % 2)
        for p, c in zip(prompts, completions, strict=True)
    ]


def has_one(completions, prompts=None, **kw):
    return [
        0.0 if p[0] in "12" else float("1" in c) for p, c in zip(prompts, completions, strict=True)
    ]


def grpo_trainer(tmp_path: Path, max_steps: int) -> GRPOTrainer:
    model, tok = tiny_model_and_tokenizer()
    prompts = [f"{a}+{b}=" for a in range(10) for b in range(10)]
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=32, num_generations=4,
        max_completion_length=6, logging_steps=1, max_steps=max_steps, use_cpu=True,
        report_to=[], learning_rate=1e-3, reward_weights=[1.0, 0.5], save_strategy="no",
        disable_tqdm=True, seed=0,
    )  # fmt: skip
    return GRPOTrainer(model=model, reward_funcs=[sure_or_parity, has_one], args=args,
                       train_dataset=Dataset.from_dict({"prompt": prompts}),
                       processing_class=tok)  # fmt: skip


def test_stored_acr_equals_trl_frac_reward_zero_std(
    noauth_server: RestartableServer, tmp_path: Path
):
    trainer = grpo_trainer(tmp_path, max_steps=8)
    mon = Monitor(noauth_server.url, None, run_name="trl", spool_dir=tmp_path / "spool")
    callback = attach(trainer, mon, log_samples=2)
    trainer.train()
    mon.close(timeout=30)
    assert callback.rewards.logged_steps == list(range(1, 9))
    # log_samples=2: two prompts a step with their completions, collapsed groups first
    with noauth_server.api() as api:
        got = api.get(f"/api/v1/runs/{mon.run_id}/samples", params={"limit": 200}).json()
    samples = got["samples"]
    assert sorted(s["step"] for s in samples) == sorted(list(range(1, 9)) * 2)
    for s in samples:
        assert s["prompt"][0] in "0123456789" and s["prompt"].endswith("=")
        assert len(s["completions"]) == len(s["rewards"]) == 4
    assert any(s["prompt"][0] in "12" and len(set(s["rewards"])) == 1 for s in samples)
    trl = {h["step"]: h for h in trainer.state.log_history if "frac_reward_zero_std" in h}
    points = {p["step"]: p for p in noauth_server.metrics(mon.run_id)}
    assert sorted(points) == sorted(trl) == list(range(1, 9))
    for step, h in trl.items():
        p = points[step]
        assert p["n_groups"] == p["n_valid"] == 8
        assert p["acr"] == pytest.approx(h["frac_reward_zero_std"], abs=1e-9), step
        assert p["reward_mean"] == pytest.approx(h["reward"], abs=1e-5)
        # TRL's logged scalars arrive too, under the same step
        assert p["scalars"]["frac_reward_zero_std"] == pytest.approx(h["frac_reward_zero_std"])
        # the canonical names (docs/design.md §5); kl only with beta > 0 (TRL's default is 0)
        assert {"loss", "grad_norm", "entropy"} <= p["scalars"].keys()
        assert p["scalars"]["entropy"] == pytest.approx(h["entropy"])
    assert any(0 < points[s]["acr"] < 1 for s in points)  # a meaningful comparison


def test_the_callback_sends_non_finite_scalars_as_they_are():
    """TRL logs None for a metric whose every value in the window was NaN (its `log` drops NaN
    values before averaging): it is sent as NaN, as a NaN loss is, never dropped."""
    sent: list[tuple[int, dict, dict]] = []

    class Recorder:
        def log_scalars(self, step, scalars, **kw):  # noqa: ANN001, ANN003, ANN202
            sent.append((step, scalars, kw))

    state = type("State", (), {"global_step": 7, "is_world_process_zero": True})()
    callback = _CallbackMixin(Recorder())  # type: ignore[arg-type]
    logs = {"loss": float("nan"), "grad_norm": float("inf"), "kl": None, "entropy": 0.25,
            "learning_rate": 1e-3, "eval_kl": None, "flag": True, "note": "x"}  # fmt: skip
    callback.on_log(None, state, None, logs=logs)
    (step, train, _), (_, evals, kw) = sent
    assert step == 7 and kw == {"split": "eval"}
    assert train.keys() == {"loss", "grad_norm", "kl", "entropy", "learning_rate"}
    assert math.isnan(train["loss"]) and train["grad_norm"] == math.inf
    assert math.isnan(train["kl"]) and train["entropy"] == 0.25
    assert evals.keys() == {"kl"} and math.isnan(evals["kl"])


def test_commands_reach_the_trainer_and_are_acked(noauth_server: RestartableServer, tmp_path: Path):
    trainer = grpo_trainer(tmp_path, max_steps=500)
    mon = Monitor(noauth_server.url, None, run_name="trl-stop", spool_dir=tmp_path / "spool",
                  heartbeat_s=0.2)  # fmt: skip
    callback = attach(trainer, mon)
    assert mon.flush(20)  # the run exists
    with noauth_server.api() as api:
        ids = []
        for body in (
            {"type": "set_sampling", "params": {"temperature": 0.7}},
            {"type": "set_mitigation", "params": {"mode": "aapo"}},
            {"type": "stop", "params": {}},
        ):
            r = api.post(f"/api/v1/runs/{mon.run_id}/commands", json=body)
            assert r.status_code == 201, r.text
            ids.append(r.json()["command_id"])
        t0 = time.monotonic()
        trainer.train()
        assert time.monotonic() - t0 < 60
        stopped_at = trainer.state.global_step
        assert stopped_at < 500
        # each handled once, at a step boundary; the stop at the step where training stopped
        got = {cid: (status, step) for cid, status, step in callback.applied}
        assert len(callback.applied) == 3 and got[ids[2]] == ("applied", stopped_at)
        assert got[ids[0]][0] == "applied" and got[ids[1]][0] == "rejected"
        assert trainer.temperature == 0.7 and trainer.generation_config.temperature == 0.7
        mon.close(timeout=30)
        log = {
            c["command_id"]: c
            for c in api.get(f"/api/v1/runs/{mon.run_id}/commands").json()["commands"]
        }
        assert [log[i]["status"] for i in ids] == ["applied", "rejected", "applied"]
        assert [log[i]["acked_step"] for i in ids] == [got[i][1] for i in ids]
        assert "does not implement aapo" in log[ids[1]]["detail"]


DDP_SCRIPT = """
import json, sys
from pathlib import Path
sys.path.insert(0, str(Path(sys.argv[5]).parents[1]))  # the repository root, for tests.client
from tests.client.test_trl_integration import has_one, sure_or_parity, tiny_model_and_tokenizer
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from vantage.client import Monitor
from vantage.client.integrations.trl import attach

server, spool, out, run_id = sys.argv[1:5]
model, tok = tiny_model_and_tokenizer()
prompts = [f"{a}+{b}=" for a in range(10) for b in range(10)]
# 6 completions per process and groups of 4: the middle group of every step spans both processes
args = GRPOConfig(
    output_dir=str(Path(out).parent / "trl-out"), per_device_train_batch_size=6,
    num_generations=4, max_completion_length=6, logging_steps=1, max_steps=4, use_cpu=True,
    report_to=[], learning_rate=1e-3, reward_weights=[1.0, 0.5], save_strategy="no",
    disable_tqdm=True, seed=0,
)
trainer = GRPOTrainer(model=model, reward_funcs=[sure_or_parity, has_one], args=args,
                      train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=tok)
mon = Monitor(server, None, run_name="trl-ddp", run_id=run_id, spool_dir=spool)
callback = attach(trainer, mon)
trainer.train()
mon.close(timeout=30)
if mon.rank == 0:
    Path(out).write_text(json.dumps({
        "log_history": trainer.state.log_history, "logged_steps": callback.rewards.logged_steps,
        "attempt": mon.attempt, "world_size": mon.world_size,
    }))
"""


def test_two_processes_gather_groups_that_span_processes(
    noauth_server: RestartableServer, tmp_path: Path
):
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    out, run_id = tmp_path / "out.json", str(uuid.uuid4())
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    proc = subprocess.run(
        [torchrun, "--nproc_per_node", "2", "--master_port", str(free_port()), str(script),
         noauth_server.url, str(tmp_path / "spool"), str(out), run_id, str(Path(__file__).parent)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # rank 1's Monitor is not used, and it says so (each rank's own made an empty run: a trial)
    assert "attach() on rank 1 was given a Monitor" in proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["attempt"] == 1
    assert result["logged_steps"] == [1, 2, 3, 4]
    trl = {h["step"]: h for h in result["log_history"] if "frac_reward_zero_std" in h}
    points = {p["step"]: p for p in noauth_server.metrics(run_id)}
    assert sorted(points) == sorted(trl) == [1, 2, 3, 4]
    for step, h in trl.items():
        assert points[step]["n_groups"] == 3  # whole groups, gathered from both processes
        assert points[step]["acr"] == pytest.approx(h["frac_reward_zero_std"], abs=1e-6)
        assert points[step]["reward_mean"] == pytest.approx(h["reward"], abs=1e-5)
