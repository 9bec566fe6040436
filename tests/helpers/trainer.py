"""Shared pieces of the trainer tests: a small, fast configuration and a recording Monitor.

The recording Monitor implements the documented ``vantage.client.Monitor`` interface
(docs/design.md §5) and keeps every call, so the tests can check what the trainer sent and feed it
commands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def small_config(output_dir: str | Path, **overrides: Any) -> dict[str, Any]:
    """A ~100k-parameter tiny Llama on one-digit sums: seconds per run on one CPU thread."""
    config = {
        "run_name": "test",
        "output_dir": str(output_dir),
        "seed": 0,
        "device": "cpu",
        "torch_threads": 1,
        "model_source": "tiny",
        "tiny_hidden_size": 64,
        "tiny_layers": 2,
        "tiny_heads": 2,
        "tiny_intermediate_size": 128,
        "tiny_max_positions": 32,
        "task": "arithmetic",
        "arith_max_operand": 9,
        "eval_size": 16,
        "sft_steps": 0,
        "sft_batch_size": 32,
        "sft_lr": 3e-3,
        "sft_warmup_steps": 10,
        "steps": 4,
        "prompts_per_step": 4,
        "group_size": 4,
        "max_new_tokens": 4,
        "lr": 1e-3,
        "eval_every": 0,
        "progress": False,
    }
    config.update(overrides)
    return config


class RecordingMonitor:
    """Implements Monitor's documented interface and records every call; ``script`` maps a poll
    number (1 = the first poll) to the commands that poll returns."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.run_id = kwargs.get("run_id")
        self.groups: list[tuple[int, list[list[float]], list[str] | None]] = []
        self.effective: list[tuple[int, dict[str, int]]] = []
        self.mitigations: list[tuple[int, dict | None]] = []  # (step, reported mitigation)
        self.scalars: list[tuple[int, dict[str, float]]] = []
        self.acks: list[tuple[str, str, int, str | None]] = []
        self.script: dict[int, list[dict[str, Any]]] = {}
        self.polls = 0
        self.closed: str | None = None

    def log_groups(self, step, rewards, group_ids=None, mask=None, prompt_ids=None):
        self.groups.append((step, [list(map(float, r)) for r in rewards], prompt_ids))

    def log_effective(self, step, n_valid, n_zero_advantage, n_virtual=0, mitigation=None):
        self.mitigations.append((step, mitigation))
        self.effective.append(
            (
                step,
                {"n_valid": n_valid, "n_zero_advantage": n_zero_advantage, "n_virtual": n_virtual},
            )
        )

    def log_scalars(self, step, scalars):
        self.scalars.append((step, dict(scalars)))

    def poll_commands(self):
        self.polls += 1
        return self.script.get(self.polls, [])

    def ack(self, command_id, status, step, detail=None):
        self.acks.append((command_id, status, step, detail))

    def close(self, timeout: float = 30.0, status: str | None = "finished"):
        self.closed = status

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(
            json.dumps(
                {
                    "kwargs": {k: v for k, v in self.kwargs.items() if k != "config"},
                    "groups": self.groups,
                    "effective": self.effective,
                    "scalars": self.scalars,
                    "acks": self.acks,
                    "closed": self.closed,
                }
            )
        )


def recording_monitors() -> tuple[list[RecordingMonitor], Any]:
    """A monitor factory for ``train(..., monitor_factory=...)`` and the list of the
    RecordingMonitors it made, in order."""
    monitors: list[RecordingMonitor] = []

    def factory(**kwargs: Any) -> RecordingMonitor:
        monitors.append(RecordingMonitor(**kwargs))
        return monitors[-1]

    return monitors, factory
