"""A group's prompt encoded once: generation and the training forward give the plain numbers."""

import torch
from vantage.trainer.config import load_config
from vantage.trainer.loss import completion_logits
from vantage.trainer.models import char_tokenizer, tiny_llama
from vantage.trainer.rollout import HFBackend, encode_prompts, shared_prompt_cache
from vantage.trainer.sft import lm_inputs

from tests.helpers.trainer import small_config

# prompts of different lengths, so rows are left-padded by different amounts
QUESTIONS = ["1+2=", "13+4=", "7+18=", "5+5="]


def _model(tmp_path):
    cfg = load_config(small_config(tmp_path))
    tokenizer = char_tokenizer()
    torch.manual_seed(0)
    return tiny_llama(cfg, tokenizer).eval(), tokenizer


def test_generation_with_the_shared_prompt_cache_draws_the_plain_completions(tmp_path):
    model, tokenizer = _model(tmp_path)
    ids, mask = encode_prompts(tokenizer, QUESTIONS, False, torch.device("cpu"))
    assert shared_prompt_cache(model, ids, mask, 3)  # it applies here
    assert shared_prompt_cache(model, ids, mask, 1) == {}  # nothing to share

    def plain(do_sample):
        return model.generate(
            input_ids=ids.repeat_interleave(3, 0), attention_mask=mask.repeat_interleave(3, 0),
            max_new_tokens=6, do_sample=do_sample, top_k=0, pad_token_id=tokenizer.pad_token_id,
            eos_token_id=[tokenizer.eos_token_id],
        )[:, ids.shape[1]:]  # fmt: skip

    backend = HFBackend(tokenizer)
    for temperature in (0.0, 1.0):
        torch.manual_seed(7)
        shared = backend.generate(model, QUESTIONS, 3, temperature, 1.0, 6)
        torch.manual_seed(7)
        expected = plain(temperature > 0)
        assert torch.equal(shared.completion_ids, expected)


def test_the_training_forward_with_a_shared_prefix_gives_the_plain_logits_and_grads(tmp_path):
    model, tokenizer = _model(tmp_path)
    torch.manual_seed(1)
    rollouts = HFBackend(tokenizer).generate(model, QUESTIONS, 3, 1.0, 1.0, 6)
    model.train()
    params = list(model.parameters())
    rows = slice(2, 11)  # starts and ends inside a group
    shared = completion_logits(model, rollouts, rows)
    shared_grads = torch.autograd.grad((shared.square()).sum(), params)
    inputs = lm_inputs(
        rollouts.prompt_ids[rows], rollouts.prompt_mask[rows],
        rollouts.completion_ids[rows], rollouts.completion_mask[rows],
    )  # fmt: skip
    width = rollouts.completion_ids.shape[1]
    plain = model(**inputs).logits[:, -width - 1 : -1]
    plain_grads = torch.autograd.grad((plain.square()).sum(), params)
    assert shared.shape == plain.shape
    torch.testing.assert_close(shared, plain, rtol=1e-5, atol=1e-5)
    for a, b in zip(shared_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
