"""The trainer's one config: a dataclass with defaults; YAML and ``--set key=value`` override it."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from vantage.client.schema import (
    MAX_GROUP_SIZE,
    MAX_GROUPS_PER_REQUEST,
    MITIGATION_DEFAULTS,
    MITIGATION_NUMBERS,
    RunCreate,
    temperature_problem,
)
from vantage.client.transport import server_url_problem

from .mitigation import mitigation_modes

__all__ = ["TrainConfig", "load_config", "apply_overrides", "CONFIG_DIR", "bundled_config"]

CONFIG_DIR = Path(__file__).parent / "configs"


@dataclass
class TrainConfig:
    # ---- run
    run_name: str = "arith-tiny"  # name shown on the server and dashboard
    output_dir: str = "runs/arith-tiny"  # checkpoints, reference, summary; runs/<run_name> if unset
    seed: int = 0  # seeds Python, torch (rank r adds r), the task and the prompt sampler
    device: str = "auto"  # "auto" (CUDA when present), "cpu" or "cuda"
    dtype: str = "float32"  # parameters: "float32" or "bfloat16" (bf16 is for GPUs)
    torch_threads: int = 0  # torch.set_num_threads; 0 leaves torch's default
    fsdp: bool = False  # under torchrun: shard the policy (and reference) with FSDP2; bf16 on CUDA

    # ---- policy model
    model_source: str = "tiny"  # "tiny" (built from the fields below), "hf", "gguf" or "smollm2"
    model_path: str | None = None  # "hf": checkpoint folder; "gguf": a .gguf file or its folder
    gguf_file: str | None = None  # "gguf": the file name inside model_path when it is a folder
    tiny_hidden_size: int = 256  # tiny Llama: width (256 → ~3.2M parameters)
    tiny_layers: int = 4  # tiny Llama: decoder layers
    tiny_heads: int = 4  # tiny Llama: attention heads
    tiny_intermediate_size: int = 688  # tiny Llama: MLP width
    tiny_max_positions: int = 128  # tiny Llama: longest prompt + completion in tokens
    chat_template: bool = False  # wrap prompts in the tokenizer's chat template (instruct models)
    init_checkpoint: str | None = None  # start GRPO from this saved policy folder (skips SFT)

    # ---- task and data
    task: str = "arithmetic"  # "arithmetic" (procedural), "jsonl" (GSM8K format), "reasoning_gym"
    arith_max_operand: int = 20  # the difficulty knob: operands are drawn from 0..this
    arith_terms: int = 2  # operands per problem (2 → "a+b=")
    arith_operators: str = "+"  # operators to draw from, any of "+-*"
    data_path: str | None = None  # "jsonl": a file of {"question", "answer" ending "#### N"}
    eval_data_path: str | None = None  # "jsonl": held-out file; else the last eval_size rows
    reasoning_gym_task: str = "basic_arithmetic"  # "reasoning_gym": dataset name
    prompt_template: str = "{question}"  # a question's prompt; arithmetic also has {expression}
    eval_size: int = 128  # held-out problems for greedy accuracy

    # ---- rewards
    reward_min: float = 0.0  # reward of a wrong answer; AVSPO/AAPO and the server use the bounds
    reward_max: float = 1.0  # reward of a right answer
    math_verify: bool = False  # use the math-verify package for equivalence (optional extra)

    # ---- SFT warm start (tiny model; without warmup and clipping it stalls below 10%)
    sft_steps: int = 0  # 0 skips the warm start
    sft_batch_size: int = 64  # problems per SFT step
    sft_lr: float = 1e-3  # peak AdamW learning rate
    sft_warmup_steps: int = 50  # linear warmup steps
    sft_grad_clip: float = 1.0  # grad-norm clip

    # ---- GRPO
    steps: int = 200  # GRPO optimizer steps (counted from 1)
    prompts_per_step: int = 16  # P: groups per step on each rank
    group_size: int = 8  # G: completions per prompt
    temperature: float = 1.0  # sampling temperature (a set_sampling command changes it)
    top_p: float = 1.0  # nucleus sampling
    max_new_tokens: int = 8  # completion length limit in tokens
    lr: float = 1e-4  # AdamW learning rate
    weight_decay: float = 0.0  # AdamW weight decay
    adam_betas: tuple[float, float] = (0.9, 0.99)  # AdamW betas
    warmup_steps: int = 0  # linear learning-rate warmup over GRPO steps
    grad_clip: float = 1.0  # grad-norm clip
    micro_batch_size: int = 0  # completions per forward/backward chunk; 0 = the whole step at once
    num_iterations: int = 1  # policy updates per batch of rollouts (μ); >1 makes the clip bite
    eps_low: float = 0.2  # clipped surrogate: ratio ≥ 1 − eps_low
    eps_high: float = 0.28  # clipped surrogate: ratio ≤ 1 + eps_high (DAPO's clip-higher)
    kl_beta: float = 0.0  # weight of the k3 KL to the reference policy; 0 skips the reference pass
    scale_rewards: str = "group"  # grpo's std: "group", "batch" or "none" (TRL's option)

    # ---- mitigation (a set_mitigation command changes these mid-run)
    mitigation: str = "none"  # "none" (plain grpo), "avspo", "aapo" or "dapo"
    avspo_threshold: str = MITIGATION_DEFAULTS["threshold"]  # fixed, adaptive (τ) or single (K=1)
    avspo_alpha: float = MITIGATION_DEFAULTS["alpha"]  # K = max(1, min(G, ⌈G·ACR^α⌉))
    avspo_tau0: float = MITIGATION_DEFAULTS["tau"]  # adaptive threshold's start
    avspo_eta: float = MITIGATION_DEFAULTS["eta"]  # adaptive threshold's step size
    aapo_delta_low: float = MITIGATION_DEFAULTS["delta_low"]  # AAPO margin clip, low
    aapo_delta_high: float = MITIGATION_DEFAULTS["delta_high"]  # AAPO margin clip, high
    max_gen_batches: int = MITIGATION_DEFAULTS["max_gen_batches"]  # DAPO: batches a step samples

    # ---- generation backend
    backend: str = "hf"  # "hf" (transformers generate) or "vllm" (the vllm extra, GPU)
    vllm_gpu_memory_utilization: float = 0.3  # vLLM colocated with training on one GPU

    # ---- evaluation, checkpoints, progress
    eval_every: int = 25  # held-out greedy accuracy every N steps (and at the end); 0 = only end
    checkpoint_every: int = 0  # save every N steps; 0 = only at the end and on checkpoint/stop
    resume: bool = True  # continue from output_dir's latest checkpoint when there is one
    progress: bool = True  # tqdm bar with step, reward, ACR and ETA (rank 0)

    # ---- monitoring (no server → training runs unmonitored)
    server: str | None = None  # Vantage server URL; env VANTAGE_SERVER when unset; "none": none
    api_key: str | None = None  # ingest key; env VANTAGE_API_KEY when unset
    project: str | None = None  # server project
    run_id: str | None = None  # resume monitoring of this run (a checkpoint remembers it)
    log_samples: int = 0  # prompts a step sends with completions and rewards (0: none; §5 Samples)

    def __post_init__(self) -> None:
        if isinstance(self.server, str) and self.server.strip().lower() == "none":
            self.server = "none"  # unmonitored even when VANTAGE_SERVER is set
        else:
            self.server = self.server or os.environ.get("VANTAGE_SERVER") or None
        self.api_key = self.api_key or os.environ.get("VANTAGE_API_KEY") or None
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the field when a value cannot work."""
        choices = {
            "model_source": ("tiny", "hf", "gguf", "smollm2"),
            "task": ("arithmetic", "jsonl", "reasoning_gym"),
            "mitigation": mitigation_modes(),
            "avspo_threshold": ("fixed", "adaptive", "single"),
            "scale_rewards": ("group", "batch", "none"),
            "backend": ("hf", "vllm"),
            "dtype": ("float32", "bfloat16"),
            "device": ("auto", "cpu", "cuda"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}; got {getattr(self, name)!r}")
        for name, low, high in _RANGES:
            value = getattr(self, name)
            if not (low <= value <= high):  # also refuses NaN
                bounds = f"at least {low}" if high == math.inf else f"from {low} to {high}"
                raise ValueError(f"{name} must be {bounds}; got {value!r}")
        for name in _POSITIVE:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be above 0; got {getattr(self, name)!r}")
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.name} must be a finite number; got {value!r}")
        if not self.arith_operators or set(self.arith_operators) - set("+-*"):
            raise ValueError(f"arith_operators must be some of '+-*'; got {self.arith_operators!r}")
        if self.aapo_delta_low > self.aapo_delta_high:
            raise ValueError("aapo_delta_low must not exceed aapo_delta_high")
        try:  # as the tasks fill it: "{foo}" raised KeyError when the data loaded
            self.prompt_template.format(question="1+1=", expression="1+1")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"prompt_template {self.prompt_template!r} cannot be filled ({exc!r}); it may "
                "use {question} (and, for arithmetic, {expression}); write {{ and }} for braces"
            ) from None
        if problem := temperature_problem(self.temperature):  # the range set_sampling takes
            raise ValueError(problem)
        self._validate_shapes()
        if self.reward_max <= self.reward_min:
            raise ValueError("reward_max must exceed reward_min")
        if self.task == "jsonl" and not self.data_path:
            raise ValueError("task jsonl needs data_path (a GSM8K-format JSONL file)")
        if self.fsdp and self.backend == "vllm":
            raise ValueError("fsdp: true works with backend hf only (vLLM loads whole weights)")
        if self.model_source in ("hf", "gguf") and not self.model_path:
            raise ValueError(f"model_source {self.model_source} needs model_path")
        self._validate_identity()
        # a server that is no URL trained unmonitored into a spool, said only at the end
        if self.server not in (None, "none") and (problem := server_url_problem(self.server)):
            raise ValueError(
                f"{problem} (config server, else VANTAGE_SERVER); give one such as "
                "http://127.0.0.1:8000, or none to train unmonitored"
            )

    def _validate_identity(self) -> None:
        """The run's name, project and id as the server takes them: one it would refuse would
        turn monitoring off for the whole run, with no spool to sync later."""
        try:
            RunCreate(name=self.run_name, project=self.project, run_id=self.run_id)
        except ValidationError as exc:
            config_name = {"name": "run_name"}
            raise ValueError(
                "; ".join(
                    f"{config_name.get(str(e['loc'][0]), e['loc'][0])}: {e['msg']}"
                    for e in exc.errors()
                )
                + " (as the Vantage server takes it)"
            ) from None

    def _validate_shapes(self) -> None:
        """The checks that torch or transformers would otherwise make later, with a traceback:
        AdamW's betas, the tiny model's heads and positions."""
        betas = tuple(self.adam_betas)
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"adam_betas must be two numbers in [0, 1); got {list(betas)}")
        if self.model_source == "tiny":
            if self.tiny_hidden_size % self.tiny_heads:
                raise ValueError(
                    f"tiny_hidden_size ({self.tiny_hidden_size}) must be a multiple of "
                    f"tiny_heads ({self.tiny_heads})"
                )
            if self.tiny_max_positions <= self.max_new_tokens:
                raise ValueError(
                    f"tiny_max_positions ({self.tiny_max_positions}) must exceed max_new_tokens "
                    f"({self.max_new_tokens}): a prompt and its completion must fit"
                )

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("api_key", None)  # never ship a secret into the run's config on the server
        return out


# (field, lowest, highest) of the numbers that have a range (inclusive).
_RANGES = (
    *((name, 0, math.inf) for name in (
        "torch_threads", "sft_steps", "sft_warmup_steps", "steps", "warmup_steps",
        "micro_batch_size", "eval_every", "checkpoint_every",
        "eps_low", "eps_high", "kl_beta", "weight_decay",
    )),
    *((name, 1, math.inf) for name in (
        "tiny_hidden_size", "tiny_layers", "tiny_heads", "tiny_intermediate_size",
        "sft_batch_size", "max_new_tokens", "num_iterations", "arith_max_operand",
        "eval_size",  # the accuracy at the start and the end is always measured
    )),
    # a rank's groups of one step fit one request to the server (and P·G rollouts are
    # generated at once)
    ("prompts_per_step", 1, MAX_GROUPS_PER_REQUEST),
    ("log_samples", 0, 1_000),  # the Monitor's samples_per_step takes at most 1,000
    ("tiny_max_positions", 2, math.inf),
    # within float32's range (3.4e38), where AdamW computes: a larger lr overflows inside it
    ("lr", 0, 1e30),
    ("sft_lr", 0, 1e30),
    ("arith_terms", 2, math.inf),  # a problem is a sum of at least two numbers
    ("group_size", 2, MAX_GROUP_SIZE),  # the server's limit on one group's completions
    ("top_p", 0, 1),
    ("vllm_gpu_memory_utilization", 0, 1),
    ("seed", 0, 2**32 - 1),  # numpy's seeds; 2**64 overflowed inside torch
    # what the server takes in a set_mitigation (the dashboard's forms start at these values)
    *((field, *MITIGATION_NUMBERS[param][:2]) for field, param in (
        ("avspo_alpha", "alpha"), ("avspo_eta", "eta"), ("avspo_tau0", "tau"),
        ("aapo_delta_low", "delta_low"), ("aapo_delta_high", "delta_high"),
        ("max_gen_batches", "max_gen_batches"),
    )),
)  # fmt: skip
# Numbers that must be above 0.
_POSITIVE = ("temperature", "top_p", "lr", "sft_lr", "grad_clip", "sft_grad_clip", "avspo_alpha")

_FIELDS = {f.name: f for f in fields(TrainConfig)}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_KIND_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "tuple": "numbers",
}


def _coerce(name: str, value: Any) -> Any:
    """``value`` as the field's type; raises ValueError naming the field for a value of another
    kind (a fraction for an integer, a word for a number, a number for a switch)."""
    kind = str(_FIELDS[name].type)
    if value is None:
        if "None" not in kind:  # `--set steps=` reads as null
            raise ValueError(f"{name} needs a value")
        return None
    try:
        if kind.startswith("tuple"):
            return tuple(_number(v) for v in value)
        if kind.startswith("bool"):
            return _switch(value)
        if kind.startswith("int"):
            return _integer(value)
        if kind.startswith("float"):
            return _number(value)
    except (TypeError, ValueError):
        wanted = _KIND_WORDS[kind.split(" ")[0].split("[")[0]]
        raise ValueError(f"{name} must be {wanted}; got {value!r}") from None
    if kind.startswith("str") and isinstance(value, (dict, list)):
        raise ValueError(f"{name} must be a string; got {value!r}")
    return str(value) if kind.startswith("str") else value


def _switch(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
        return value.lower() in _TRUE
    raise ValueError(value)


def _integer(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(value)
    return int(value)


def _number(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(value)
    return float(value)


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error (PyYAML
    keeps the last silently, so `steps: 100` further down a file undid an edit above it)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str | int | float | bool | None):  # `? [a]` gave a TypeError
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"a key must be a name, not a {type(key).__name__}",
                    key_node.start_mark,
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _override_value(raw: str) -> Any:
    """An override's value read as a YAML scalar (``3``, ``true``, ``[0.9, 0.99]``), or the
    text itself when it is no YAML (``{question} =`` raised the parser's traceback)."""
    if not raw.strip():
        return None
    try:
        return yaml.load(raw, Loader=_UniqueKeyLoader)
    except yaml.YAMLError:
        return raw


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` strings (values parsed as YAML scalars) onto a dict of fields."""
    out, given = dict(values), {}
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if key not in _FIELDS:
            raise ValueError(
                f"unknown config field {key!r}; see vantage.trainer.config.TrainConfig"
            )
        if key in given:  # `--set steps=1 --set steps=2` trained 2 steps without a word
            raise ValueError(f"override of {key!r} given twice: {given[key]!r} and {item!r}")
        given[key] = item
        out[key] = _override_value(raw)
    return out


def bundled_config(name: str) -> Path:
    """Path of a config shipped in trainer/configs (``arith-tiny`` or ``arith-tiny.yaml``)."""
    path = CONFIG_DIR / (name if name.endswith(".yaml") else f"{name}.yaml")
    if not path.exists():
        known = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
        raise FileNotFoundError(f"no bundled config {name!r}; bundled: {known}")
    return path


def load_config(
    source: str | os.PathLike[str] | dict[str, Any] | TrainConfig | None = None,
    overrides: list[str] | None = None,
) -> TrainConfig:
    """Build a TrainConfig from a YAML path, a bundled config name, a dict or a config, then apply
    ``key=value`` overrides. Unknown keys raise ValueError naming them."""
    if isinstance(source, TrainConfig):
        values = dataclasses.asdict(source)
    elif isinstance(source, dict):
        values = dict(source)
    elif source is None:
        values = {}
    else:
        path = Path(source)
        if not path.exists() and not path.suffix:
            path = bundled_config(str(source))
        if not path.exists():
            raise FileNotFoundError(f"config file {path} does not exist")
        if not path.is_file():
            raise ValueError(f"{path} is not a file (give a YAML config file)")
        try:
            values = yaml.load(path.read_text(), Loader=_UniqueKeyLoader) or {}
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
            problem = getattr(exc, "problem", None) or type(exc).__name__
            raise ValueError(f"{path} is not valid YAML: {problem}{at}") from None
        if not isinstance(values, dict):
            raise ValueError(f"{path}: a config file must be a mapping of field: value")
        # A config of its own gets a run name of its own, and so (below) a folder of its own:
        # it never resumes the checkpoint another config left in the default folder.
        values.setdefault("run_name", path.stem)
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise ValueError(f"unknown config fields {unknown}; see vantage.trainer.config.TrainConfig")
    values = apply_overrides(values, overrides or [])
    # Unless given, the folder follows the final run name, so `--set run_name=x` is a run of its
    # own in runs/x rather than a resume of the file's run under another name.
    if "output_dir" not in values:
        name = str(values.get("run_name", TrainConfig.run_name))
        if not name.strip(". ") or "/" in name or "\\" in name:
            raise ValueError(
                f"run_name {name!r} cannot name a folder under runs/ (no '/', not only dots); "
                "give output_dir to put the run elsewhere"
            )
        values["output_dir"] = f"runs/{name}"
    return TrainConfig(**{k: _coerce(k, v) for k, v in values.items()})
