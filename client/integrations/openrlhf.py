"""Vantage for OpenRLHF's PPO/GRPO trainer (docs/design.md §5; tested with openrlhf 0.11.2)::

    python -m vantage.client.integrations.openrlhf <openrlhf.cli.train_ppo_ray's arguments>

with ``VANTAGE_SERVER``, ``VANTAGE_API_KEY``, ``VANTAGE_RUN_NAME`` (default ``openrlhf``) and
``VANTAGE_PROJECT`` set, or in code of your own: ``patch()`` in the process that runs the
``PPOTrainer`` (a Ray actor: pass ``worker_process_setup_hook=SETUP_HOOK`` in ``ray.init``'s
``runtime_env``), and ``configure(monitor)`` there if you build the Monitor yourself.

The seam. OpenRLHF's loggers are built inside ``BasePPOTrainer.__init__`` from ``args.logger``
and cannot be swapped, and its custom reward function file (``--reward.remote_url x.py``) is
called one completion at a time inside the vLLM engines, where no group is whole. The groups are
whole in one place: ``RemoteExperienceMaker.compute_advantages_and_returns(experiences)``, which
puts the rewards back in prompt order by ``Experience.index`` and reshapes them to
``(-1, n_samples_per_prompt)`` before every group-relative estimator. ``patch()`` wraps three
methods of the PPO trainer's process (each keeps its result; monitoring failures are logged once
and training goes on):

- ``BasePPOTrainer.train_step(rollout_samples, global_step)``: notes the step being made,
  ``global_step + 1`` (what the step's logs go under);
- ``RemoteExperienceMaker.compute_advantages_and_returns``: after OpenRLHF's own work, logs each
  group (its ``n_samples_per_prompt`` rewards, after OpenRLHF's length penalties, as its
  estimator reads them) with ``log_groups``; then polls the run's commands and rejects each with
  a reason (OpenRLHF has no seam to change its advantages or sampling from outside);
- ``BasePPOTrainer.save_logs_and_checkpoints(global_step, logs_dict)``: sends the step's numeric
  logs (every ``logging_steps``, as OpenRLHF's loggers) under OpenRLHF's names, and
  ``policy_loss``, ``actor_grad_norm``, ``kl`` and ``entropy_loss`` again as ``loss``,
  ``grad_norm``, ``kl`` and ``entropy``; non-finite values as they are.

Evaluation logs (``PPOTrainer.evaluate``, a method of the Ray actor class itself) are not sent.
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..monitor import Monitor

__all__ = [
    "CANONICAL_SCALARS",
    "SETUP_HOOK",
    "VantageOpenRLHF",
    "configure",
    "experience_groups",
    "main",
    "patch",
    "setup_worker",
    "state",
]

log = logging.getLogger("vantage.client")

SETUP_HOOK = "vantage.client.integrations.openrlhf.setup_worker"
# canonical name → OpenRLHF's (docs/design.md §5): policy_loss is the PPO/GRPO loss per token,
# actor_grad_norm the norm before clipping, kl the per-token KL to the reference model (when
# there is one), entropy_loss the mean per-token entropy (logged when --actor.entropy_coef is set).
CANONICAL_SCALARS = {
    "loss": "policy_loss",
    "grad_norm": "actor_grad_norm",
    "kl": "kl",
    "entropy": "entropy_loss",
}
_PATCHED = "__vantage_openrlhf__"


def experience_groups(experiences: Sequence[Any], n_samples_per_prompt: int) -> list[list[float]]:
    """The rewards of a batch of OpenRLHF ``Experience``s as groups of ``n_samples_per_prompt``,
    in OpenRLHF's own order: ``rewards[index] = cat(rewards)``, then consecutive blocks (what
    ``compute_advantages_and_returns`` reshapes to ``(-1, n)``). ValueError when the rewards do
    not divide into groups."""
    positions = [int(i) for exp in experiences for i in exp.index]
    values = [float(r) for exp in experiences for r in exp.rewards.tolist()]
    if len(positions) != len(values) or n_samples_per_prompt < 1:
        raise ValueError(f"{len(values)} rewards for {len(positions)} indices")
    if len(values) % n_samples_per_prompt:
        raise ValueError(f"{len(values)} rewards do not divide into groups of "
                         f"n_samples_per_prompt={n_samples_per_prompt}")  # fmt: skip
    ordered = [math.nan] * len(values)
    for position, value in zip(positions, values, strict=True):
        ordered[position] = value
    n = n_samples_per_prompt
    return [ordered[i : i + n] for i in range(0, len(ordered), n)]


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(value, "ndim", None) == 0:
        try:
            return float(value)
        except (TypeError, ValueError):
            return None
    return None


def step_scalars(logs: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of one ``logs_dict`` (``generated_samples`` and other text left out), with the
    canonical names added."""
    out = {str(k): n for k, v in logs.items() if (n := _number(v)) is not None}
    for canonical, name in CANONICAL_SCALARS.items():
        if name in out:
            out.setdefault(canonical, out[name])
    return out


class VantageOpenRLHF:
    """The state behind the patched methods: the Monitor, the step being made, failures said."""

    def __init__(self, monitor: Monitor | None = None) -> None:
        self.monitor = monitor
        self._monitor_tried = monitor is not None
        self.step: int | None = None  # set by train_step
        self._counter = 0
        self.logged_steps: list[int] = []
        self.rejected: list[tuple[str, int]] = []
        self._said: set[str] = set()

    def _failure(self, what: str) -> None:
        if what not in self._said:
            self._said.add(what)
            log.exception("vantage: %s failed; training goes on (logged once)", what)

    def _monitor(self) -> Monitor | None:
        if not self._monitor_tried:
            self._monitor_tried = True
            try:
                from ..monitor import Monitor  # noqa: PLC0415

                self.monitor = Monitor(
                    run_name=os.environ.get("VANTAGE_RUN_NAME") or "openrlhf",
                    project=os.environ.get("VANTAGE_PROJECT") or None,
                )
            except Exception:  # noqa: BLE001
                self._failure("building a Monitor from VANTAGE_SERVER and VANTAGE_API_KEY")
        return self.monitor

    def begin_step(self, global_step: int) -> None:
        """``train_step(…, global_step)`` is making step ``global_step + 1``."""
        self.step = int(global_step) + 1

    def log_experiences(self, experiences: Sequence[Any], args: Any) -> None:
        """Log the batch's groups under the step being made, then answer the run's commands."""
        try:
            if self.step is None:  # not through train_step: count
                self._counter += 1
                step = self._counter
            else:
                step = self.step
            monitor = self._monitor()
            if monitor is None:
                return
            groups = experience_groups(experiences, int(args.rollout.n_samples_per_prompt))
            monitor.log_groups(step, groups)
            self.logged_steps.append(step)
            for cmd in monitor.poll_commands():
                self.rejected.append((cmd.command_id, step))
                monitor.ack(cmd.command_id, "rejected", step, f"{cmd.type} is not available in "
                            "OpenRLHF runs: Vantage only watches them")  # fmt: skip
        except Exception:  # noqa: BLE001
            self._failure("logging OpenRLHF's groups")

    def log_train(self, global_step: int, logs: Mapping[str, Any] | None) -> None:
        """Send one step's numeric logs (canonical names added)."""
        try:
            monitor = self._monitor()
            scalars = step_scalars(logs or {})
            if monitor is not None and scalars:
                monitor.log_scalars(int(global_step), scalars)
        except Exception:  # noqa: BLE001
            self._failure("sending OpenRLHF's logs")


_state = VantageOpenRLHF()


def state() -> VantageOpenRLHF:
    """The instance the patched methods report to."""
    return _state


def configure(monitor: Monitor | None) -> VantageOpenRLHF:
    """Report to ``monitor`` from now on (a fresh state; None builds one from ``VANTAGE_*``)."""
    global _state
    _state = VantageOpenRLHF(monitor)
    return _state


def _wrap(cls: type, name: str, make: Any) -> None:
    method = getattr(cls, name)
    if not getattr(method, _PATCHED, False):
        wrapped = functools.wraps(method)(make(method))
        setattr(wrapped, _PATCHED, True)
        setattr(cls, name, wrapped)


def _train_step(method: Any) -> Any:
    def train_step(self: Any, rollout_samples: Any, global_step: int, *a: Any, **kw: Any) -> Any:
        _state.begin_step(global_step)
        return method(self, rollout_samples, global_step, *a, **kw)

    return train_step


def _compute_advantages(method: Any) -> Any:
    def compute_advantages_and_returns(self: Any, experiences: Any, *a: Any, **kw: Any) -> Any:
        out = method(self, experiences, *a, **kw)
        _state.log_experiences(out, self.strategy.args)
        return out

    return compute_advantages_and_returns


def _save_logs(method: Any) -> Any:
    def save_logs_and_checkpoints(self: Any, global_step: int, logs_dict: Any = None,
                                  *a: Any, **kw: Any) -> Any:  # fmt: skip
        try:
            every = self.args.logger.logging_steps
        except AttributeError:
            every = 1
        if every and global_step % every == 0:
            _state.log_train(global_step, logs_dict)
        return method(self, global_step, logs_dict, *a, **kw)

    return save_logs_and_checkpoints


_warned: set[str] = set()


def patch() -> bool:
    """Wrap OpenRLHF's three methods (idempotent). False, with a one-time warning, when
    OpenRLHF's trainer cannot be imported or lacks them (0.11.2 is tested)."""
    try:
        from openrlhf.trainer.ppo_trainer import BasePPOTrainer  # noqa: PLC0415
        from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker  # noqa: PLC0415

        for cls, name in ((BasePPOTrainer, "train_step"),
                          (BasePPOTrainer, "save_logs_and_checkpoints"),
                          (RemoteExperienceMaker, "compute_advantages_and_returns")):  # fmt: skip
            if not callable(getattr(cls, name, None)):
                raise AttributeError(f"{cls.__name__}.{name} is missing")
    except Exception as exc:  # noqa: BLE001 - an ImportError (flash_attn on CPU) or an old one
        problem = f"{type(exc).__name__}: {exc}"
        if problem not in _warned:
            _warned.add(problem)
            log.warning("vantage: OpenRLHF's trainer is not hooked: %s", problem)
        return False
    _wrap(BasePPOTrainer, "train_step", _train_step)
    _wrap(BasePPOTrainer, "save_logs_and_checkpoints", _save_logs)
    _wrap(RemoteExperienceMaker, "compute_advantages_and_returns", _compute_advantages)
    return True


def setup_worker() -> None:
    """Ray's ``worker_process_setup_hook``: ``patch()`` in every worker (never raises)."""
    patch()


def ray_runtime_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``ray.init``'s ``runtime_env`` for the launcher: OpenRLHF 0.11.2's own environment
    defaults (``train_ppo_ray.train`` sets them when it starts Ray itself), the ``VANTAGE_*``
    variables, and the setup hook."""
    env = os.environ if environ is None else environ
    env_vars = {
        "TOKENIZERS_PARALLELISM": env.get("TOKENIZERS_PARALLELISM", "true"),
        "NCCL_DEBUG": env.get("NCCL_DEBUG", "WARN"),
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": env.get("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1"),
    }
    env_vars.update({k: v for k, v in env.items() if k.startswith("VANTAGE_")})
    return {"env_vars": env_vars, "worker_process_setup_hook": SETUP_HOOK}


def main(argv: Sequence[str] | None = None) -> None:
    """Start Ray with ``ray_runtime_env()`` (unless it is up), then run
    ``openrlhf.cli.train_ppo_ray`` with ``argv`` (default: this command's arguments)."""
    import runpy  # noqa: PLC0415

    import ray  # noqa: PLC0415

    if ray.is_initialized():
        log.warning("vantage: Ray is already up; patch() runs only where its setup hook says")
    else:
        ray.init(runtime_env=ray_runtime_env())
    sys.argv = ["openrlhf.cli.train_ppo_ray", *(sys.argv[1:] if argv is None else argv)]
    runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    from vantage.client.integrations.openrlhf import main as _main  # the importable copy

    _main()
