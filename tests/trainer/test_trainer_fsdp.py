"""FSDP2 sharding (``fsdp: true``) through torchrun: 2 CPU processes with gloo."""

import pytest
import torch
from vantage.trainer.config import load_config
from vantage.trainer.distributed import Distributed
from vantage.trainer.models import char_tokenizer, tiny_llama
from vantage.trainer.sharding import load_optimizer_state

from tests.helpers.trainer import small_config
from tests.trainer.test_trainer_distributed import torchrun


def test_sharded_training_matches_data_parallel_and_resumes_exactly(tmp_path):
    ranks = torchrun(tmp_path, worker="fsdp_worker.py")
    rank0 = ranks[0]
    assert rank0["sharded"] and rank0["straight"]["reference_sharded"]
    # each rank holds about half of the weights
    assert [r["local_numel"] for r in ranks] != [rank0["full_numel"]] * 2
    assert sum(r["local_numel"] for r in ranks) == rank0["full_numel"]
    # the ranks agree on every step (the same pooled numbers) and on the accuracy
    for run in ("dp", "straight", "split"):
        assert ranks[0][run]["history"] == ranks[1][run]["history"], run
    # sharded, the first two steps are data parallel's: the same samples, loss, KL and grad
    # norm (summed gradients), and the same weights to float rounding
    dp, sharded = rank0["dp"], rank0["straight"]
    assert [h[:3] for h in sharded["history"][:2]] == [h[:3] for h in dp["history"]]
    for h_sharded, h_dp in zip(sharded["history"][:2], dp["history"], strict=True):
        assert h_sharded[3:] == pytest.approx(h_dp[3:], rel=1e-4, abs=1e-6)
    assert sharded["at_step_2"].keys() == dp["weights"].keys()
    for name, value in dp["weights"].items():
        assert sharded["at_step_2"][name] == pytest.approx(value, rel=1e-4, abs=1e-4), name
    assert sharded["weights"] != sharded["at_step_2"]  # steps 3 and 4 trained on
    # stopped after 2 steps and resumed from the gathered checkpoint: exactly the straight run
    split = rank0["split"]
    assert split["start_step"] == 2
    assert split["history"] == sharded["history"]
    assert split["weights"] == sharded["weights"]
    assert all(isinstance(k, str) for k in split["optimizer_keys"])  # saved by parameter name


def test_an_unsharded_run_resumes_an_optimizer_state_saved_by_name(tmp_path):
    """A run may resume without fsdp what a sharded run saved (by parameter name), and the
    reverse goes through the same conversion."""
    cfg = load_config(small_config(tmp_path))
    torch.manual_seed(0)
    model = tiny_llama(cfg, char_tokenizer())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[1, 5, 6, 7]])).logits.sum().backward()
    optimizer.step()
    by_index = optimizer.state_dict()
    names = [n for n, _ in model.named_parameters()]
    by_name = {
        "state": {names[i]: s for i, s in by_index["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]}
                         for g in by_index["param_groups"]],
    }  # fmt: skip
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)
    load_optimizer_state(model, fresh, by_name)
    restored = fresh.state_dict()
    assert restored["state"].keys() == by_index["state"].keys()
    for i, s in by_index["state"].items():
        assert torch.equal(restored["state"][i]["exp_avg"], s["exp_avg"])
        assert torch.equal(restored["state"][i]["exp_avg_sq"], s["exp_avg_sq"])


def test_fsdp_refuses_the_vllm_backend(tmp_path):
    with pytest.raises(ValueError, match="fsdp: true works with backend hf only"):
        load_config(small_config(tmp_path, fsdp=True, backend="vllm"))


def test_counts_are_reduced_on_the_cpu_without_a_process_group():
    d = Distributed()
    assert d.device == torch.device("cpu")
    assert d.sum([1, 2.5]) == [1, 2.5] and d.max([3.0]) == [3.0]
