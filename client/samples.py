"""Completion samples: what the model answered for a prompt (``Monitor.log_samples``), on the
wire of ``POST /api/v1/runs/{run_id}/samples`` (docs/design.md §4, §5 'Samples').

Samples are opt-in and few (a handful of prompts per step), and they are diagnostics, not the
metrics of record: they travel on an endpoint of their own, never inside a step batch, so that
a server that does not know them (older than this client) refuses only them (a 404, counted
and dropped), never the groups. Long text is cut on the client to the limits below with a
marker saying how much was cut (`truncate`); the server refuses text past the limits (422).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, Strict, model_validator

from .inputs import as_float
from .schema import (
    MAX_COUNT,
    MAX_ID_CHARS,
    MAX_RANK,
    MAX_STEP,
    PromptId,
    ScalarValue,
    Split,
    _Strict,
    storable_scalar,
    storable_text,
    text,
)

# Characters kept of a prompt and of each completion: a long chain of thought is cut, its start
# kept. 4,000 characters is about 1,000 tokens, enough to see what the model did.
MAX_SAMPLE_CHARS = 4_000
MAX_SAMPLE_COMPLETIONS = 64  # completions of one prompt (a group) a sample keeps
MAX_SAMPLES_PER_REQUEST = 256
TRUNCATED = "… [{n:,} characters cut]"


def truncate(value: str, limit: int = MAX_SAMPLE_CHARS) -> tuple[str, bool]:
    """``value`` cut to at most ``limit`` characters, its end replaced by a marker naming how
    many characters were cut (``"… [1,234 characters cut]"``); and whether it was cut."""
    if len(value) <= limit:
        return value, False
    # the marker's own length depends on how much is cut: try the longest it can be
    marker = TRUNCATED.format(n=len(value))
    keep = max(0, limit - len(marker))
    return value[:keep] + TRUNCATED.format(n=len(value) - keep), True


SampleText = text(MAX_SAMPLE_CHARS)


class SampleIn(_Strict):
    """One prompt's completions and their rewards at one step."""

    step: Annotated[int, Strict(), Field(ge=0, le=MAX_STEP)]
    """The training step the completions were sampled for."""
    split: Split = "train"
    """As a step record's split."""
    rank: Annotated[int, Strict(), Field(ge=0, le=MAX_RANK)] = 0
    """The sending process."""
    seq: Annotated[int, Strict(), Field(ge=0, le=MAX_COUNT)] = 0
    """The sample's number within (step, split, rank) of its attempt: a sample sent again under
    its number is a duplicate, stored once."""
    prompt_id: PromptId | None = None
    """The prompt's id, as the groups carry it (GET .../prompts lists them)."""
    prompt: SampleText
    """The prompt's text, at most 4,000 characters (the client cuts longer ones)."""
    completions: Annotated[list[SampleText], Field(min_length=1, max_length=MAX_SAMPLE_COMPLETIONS)]
    """The completions' text, each at most 4,000 characters; at most 64."""
    rewards: Annotated[list[ScalarValue], Field(max_length=MAX_SAMPLE_COMPLETIONS)]
    """One reward per completion: a number, null, or NaN/Infinity/-Infinity (as JSON tokens or
    as those strings; stored as the strings)."""

    @model_validator(mode="after")
    def _one_reward_each(self) -> SampleIn:
        if len(self.rewards) != len(self.completions):
            raise ValueError(
                f"{len(self.rewards)} rewards for {len(self.completions)} completions; send "
                "one reward per completion"
            )
        return self


class SamplesBatch(_Strict):
    """Body of ``POST /api/v1/runs/{run_id}/samples``."""

    attempt: Annotated[int, Strict(), Field(ge=1, le=MAX_COUNT)]
    """The attempt POST /runs answered for this launch."""
    samples: Annotated[list[SampleIn], Field(max_length=MAX_SAMPLES_PER_REQUEST)]
    """At most 256 samples (and 8 MiB) a request."""


def build_sample(
    step: int,
    split: str,
    rank: int,
    seq: int,
    prompt: Any,
    completions: Any,
    rewards: Any,
    prompt_id: Any = None,
) -> tuple[dict[str, Any], bool]:
    """The body of one sample as `SampleIn` takes it, from a ``log_samples`` call: text past
    MAX_SAMPLE_CHARS cut (`truncate`), the first MAX_SAMPLE_COMPLETIONS completions kept,
    rewards as numbers (non-finite ones as their strings). Returns (body, whether anything was
    cut). TypeError for text that is not a string, or a lone string of completions (it would
    be one completion per character); ValueError for a count mismatch or an unusable prompt
    id."""
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a string, not {type(prompt).__name__}")
    if isinstance(completions, str | bytes):
        raise TypeError("completions must be a list of strings, not one string")
    texts = list(completions)
    if not texts:
        raise ValueError("completions is empty; send at least one")
    if isinstance(rewards, str | bytes):
        raise TypeError("rewards must be a list of numbers, not a string")
    if hasattr(rewards, "tolist"):  # a tensor or an array: its numbers, not its elements
        rewards = rewards.tolist()
    values = list(rewards)
    if len(values) != len(texts):
        raise ValueError(
            f"{len(values)} rewards for {len(texts)} completions; send one reward per completion"
        )
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise TypeError(f"completions[{bad}] is {type(texts[bad]).__name__}, not a string")
    cut = len(texts) > MAX_SAMPLE_COMPLETIONS
    texts, values = texts[:MAX_SAMPLE_COMPLETIONS], values[:MAX_SAMPLE_COMPLETIONS]
    prompt, prompt_cut = truncate(storable_text(prompt, "prompt"))
    kept = []
    for i, t in enumerate(texts):
        t, t_cut = truncate(storable_text(t, f"completions[{i}]"))
        kept.append(t)
        cut = cut or t_cut
    body: dict[str, Any] = {
        "step": step,
        "split": split,
        "rank": rank,
        "seq": seq,
        "prompt": prompt,
        "completions": kept,
        "rewards": [_reward(i, r) for i, r in enumerate(values)],
    }
    if prompt_id is not None:
        body["prompt_id"] = _prompt_id(prompt_id)
    return body, cut or prompt_cut


def _reward(index: int, value: Any) -> float | str | None:
    if value is None:
        return None
    if isinstance(value, bool | str | bytes):
        raise TypeError(f"rewards[{index}] is {value!r}, not a number")
    try:
        return storable_scalar(as_float(value))
    except (TypeError, ValueError):
        raise TypeError(f"rewards[{index}] is {value!r}, not a number") from None


def _prompt_id(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TypeError(f"prompt_id must be a string or an integer, not {value!r}")
    text = str(value)
    if len(text) > MAX_ID_CHARS:
        raise ValueError(f"prompt_id has {len(text)} characters; at most {MAX_ID_CHARS}")
    return storable_text(text, "prompt_id")
