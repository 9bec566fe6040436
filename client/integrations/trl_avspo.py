"""AVSPO in a TRL run, on command (docs/design.md §5 and §7): ``set_mitigation {mode: avspo}``.

TRL 1.16's ``GRPOTrainer._generate_and_score_completions`` computes the advantages inline and
returns this process's slice of them under ``"advantages"``. ``RemoteAvspo`` wraps that method on
the trainer instance and post-processes its output: each collapsed group's advantages (a group of
``num_generations`` consecutive completions of the gathered batch, every reward equal and
finite) are replaced by AVSPO's, computed from the gathered rewards ``VantageRewards`` already
holds (TRL's own combination of the reward functions), K = max(1, min(G, ⌈G·ACR^α⌉)) virtual
rewards between the group's reward and the far bound entering only its mean and sample std, with
TRL's eps 1e-4: ``(c − μ′)/(σ′ + 1e-4)`` (``c − μ′`` with ``scale_rewards="none"``). Mixed groups
keep TRL's advantages bit for bit, and TRL's ``frac_reward_zero_std`` (from the rewards) stays
equal to Vantage's ACR. The loss TRL computes next reads the replaced advantages.

A command is checked when it arrives (at a step boundary) and takes effect at the next training
generation, where it is acked ``applied`` with the step those groups are logged under; ``mode:
none`` returns to TRL's advantages the same way. Rejected with a reason: a TRL other than 1.16
(the method's output is private API), ``attach(..., log_func=...)`` (the logged rewards are not
TRL's), ``multi_objective_aggregation="normalize_then_sum"`` and ``scale_rewards="batch"``
(no group std to replace). Commands still waiting when training ends are rejected with that
reason. Eval batches are left alone.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import TYPE_CHECKING, Any

from ..avspo import (
    adaptive_tau_update,
    avspo_collapsed_advantage,
    avspo_num_virtual,
    parse_avspo_params,
)

if TYPE_CHECKING:
    from ..commands import Command
    from ..monitor import Monitor

__all__ = ["TESTED_TRL_VERSIONS", "TRL_EPS", "RemoteAvspo"]

log = logging.getLogger("vantage.client")

TESTED_TRL_VERSIONS = ("1.16.",)  # prefixes of trl.__version__ whose private output we rewrite
TRL_EPS = 1e-4  # TRL's eps in GRPO's denominator
ZERO_ADVANTAGE_TOL = 1e-3  # docs/design.md §3
NO_MITIGATION = ("none", "grpo", "off")


def _trl_version() -> str:
    try:
        import trl  # noqa: PLC0415

        return str(trl.__version__)
    except Exception:  # noqa: BLE001
        return "unknown"


class RemoteAvspo:
    """AVSPO for one ``GRPOTrainer``, switched by ``set_mitigation`` commands (see the module).
    ``rewards`` is the trainer's ``trl.VantageRewards`` (its ``last_values``, ``last_step``,
    ``num_generations`` and ``log_index``)."""

    def __init__(self, trainer: Any, rewards: Any, monitor: Monitor | None,
                 applied: list[tuple[str, str, int]] | None = None) -> None:  # fmt: skip
        self.trainer = trainer
        self.rewards = rewards
        self.monitor = monitor
        self.applied = applied if applied is not None else []
        self.mode = "none"
        self.threshold, self.alpha, self.eta, self.tau = "fixed", 0.5, 0.01, 0.5
        self.previous_reward: float | None = None
        self.reward_min = float(getattr(monitor, "reward_min", 0.0) or 0.0)
        self.reward_max = float(getattr(monitor, "reward_max", 1.0) or 1.0)
        self.pending: list[tuple[Command, str, dict[str, float]]] = []
        self.engaged = False  # a mitigation command was applied: report the effective ACR
        self._said: set[str] = set()
        self._previous_values: list[float] | None = None  # the batch AVSPO saw last

    # ---------------------------------------------------------------- commands
    def unsupported(self) -> str | None:
        """Why AVSPO cannot run on this trainer, or None."""
        version = _trl_version()
        if not version.startswith(TESTED_TRL_VERSIONS):
            return (f"remote AVSPO rewrites the output of TRL's GRPOTrainer."
                    f"_generate_and_score_completions and is tested with TRL 1.16 only, not "
                    f"{version}")  # fmt: skip
        if not callable(getattr(self.trainer, "_generate_and_score_completions", None)):
            return "this GRPOTrainer has no _generate_and_score_completions"
        if self.rewards.log_index is not None:
            return ("AVSPO needs TRL's combined rewards: attach() without log_func wraps every "
                    "reward function")  # fmt: skip
        args = getattr(self.trainer, "args", None)
        aggregation = getattr(args, "multi_objective_aggregation", "sum_then_normalize")
        if aggregation != "sum_then_normalize":
            return (f"AVSPO needs multi_objective_aggregation='sum_then_normalize', not "
                    f"{aggregation!r}")  # fmt: skip
        scale = getattr(self.trainer, "scale_rewards", "group")
        if scale not in ("group", "none"):
            return f"AVSPO needs scale_rewards 'group' or 'none' (a group's own std), not {scale!r}"
        return None

    def request(self, cmd: Command) -> tuple[str, str] | None:
        """Check a ``set_mitigation`` command: ``(status, detail)`` when answered now, None when
        it waits for the next training generation (acked there)."""
        params = dict(cmd.params)
        mode = params.get("mode")
        if mode in NO_MITIGATION:
            if self.mode == "none" and not self.pending:
                return "applied", "no mitigation (TRL's own GRPO)"
            self.pending.append((cmd, "none", {}))
            return None
        if mode != "avspo":
            return "rejected", f"TRL's GRPOTrainer does not implement {mode}"
        reason = self.unsupported()
        if reason is None:
            try:
                threshold, numbers = parse_avspo_params(params, self.threshold)
            except ValueError as exc:
                reason = str(exc)
        if reason is not None:
            return "rejected", reason
        self._install()
        self.pending.append((cmd, threshold, numbers))
        return None

    def expire(self, step: int) -> None:
        """Reject the commands still waiting (training ended before another generation)."""
        pending, self.pending = self.pending, []
        for cmd, _, _ in pending:
            self._ack(cmd, "rejected", step, "training ended before the next generation")

    def _ack(self, cmd: Command, status: str, step: int, detail: str) -> None:
        self.applied.append((cmd.command_id, status, step))
        if self.monitor is not None and self.monitor.rank == 0:
            self.monitor.ack(cmd.command_id, status, step, detail)

    def _take_pending(self, step: int) -> None:
        pending, self.pending = self.pending, []
        for cmd, threshold, numbers in pending:
            self.engaged = True
            if threshold == "none":
                self.mode = "none"
                self._ack(cmd, "applied", step, "no mitigation (TRL's own GRPO)")
                continue
            self.mode, self.threshold = "avspo", threshold
            for key, value in numbers.items():
                setattr(self, key, value)
            self._ack(cmd, "applied", step, f"mitigation avspo threshold={self.threshold} "
                      f"alpha={self.alpha} eta={self.eta} tau={self.tau}")  # fmt: skip

    def mitigation(self) -> dict[str, Any]:
        """The mitigation in effect, as the trainer reports it."""
        if self.mode == "avspo":
            return {"mode": "avspo", "threshold": self.threshold, "alpha": self.alpha,
                    "eta": self.eta}  # fmt: skip
        return {"mode": "none"}

    # ---------------------------------------------------------------- the advantages
    def _install(self) -> None:
        generate = self.trainer._generate_and_score_completions
        if getattr(generate, "__vantage_avspo__", False):
            return

        @functools.wraps(generate)
        def generate_and_score(*args: Any, **kwargs: Any) -> Any:
            out = generate(*args, **kwargs)
            try:
                self.after_generation(out)
            except Exception:  # noqa: BLE001 - the step keeps TRL's advantages
                if "after" not in self._said:
                    self._said.add("after")
                    log.exception("vantage: AVSPO failed; the step keeps TRL's advantages "
                                  "(logged once)")  # fmt: skip
            return out

        generate_and_score.__vantage_avspo__ = True  # type: ignore[attr-defined]
        self.trainer._generate_and_score_completions = generate_and_score

    def after_generation(self, out: dict[str, Any]) -> None:
        """Apply waiting commands, then AVSPO to ``out["advantages"]`` (this process's slice)."""
        model = getattr(self.trainer, "model", None)
        if model is not None and not model.training:
            return
        step = self.rewards.last_step
        values = self.rewards.last_values
        if step is None or values is None:
            return
        if values is self._previous_values:  # the reward wrapper did not see this batch
            if "stale" not in self._said:
                self._said.add("stale")
                log.warning("vantage: no rewards were gathered for this generation; AVSPO skips "
                            "it (said once)")  # fmt: skip
            return
        self._previous_values = values
        self._take_pending(step)
        if not self.engaged:
            return
        g = int(self.rewards.num_generations or 0)
        advantages = out["advantages"]
        local = int(advantages.shape[0])
        accelerator = getattr(self.trainer, "accelerator", None)
        rank = int(getattr(accelerator, "process_index", 0))
        if (
            g < 2
            or len(values) % g
            or len(values) != local * int(getattr(accelerator, "num_processes", 1))
        ):
            if "shape" not in self._said:
                self._said.add("shape")
                log.warning("vantage: %d gathered rewards do not match TRL's advantages (%d per "
                            "process) in groups of %d; AVSPO skipped (said once)", len(values),
                            local, g)  # fmt: skip
            return
        groups = [values[i : i + g] for i in range(0, len(values), g)]
        full, n_virtual = self._advantages(groups)
        scale = getattr(self.trainer, "scale_rewards", "group") != "none"
        n_valid = n_zero = 0
        for p, group in enumerate(groups):
            valid = all(math.isfinite(v) for v in group)
            n_valid += valid
            if full[p] is None:  # TRL's advantages stay
                if valid and _trl_max_abs_advantage(group, scale) < ZERO_ADVANTAGE_TOL:
                    n_zero += 1
                continue
            if abs(full[p]) < ZERO_ADVANTAGE_TOL:
                n_zero += 1
            for i in range(p * g, (p + 1) * g):
                if rank * local <= i < (rank + 1) * local:
                    advantages[i - rank * local] = full[p]
        if self.monitor is not None and self.monitor.rank == 0:
            self.monitor.log_effective(
                step, n_valid=n_valid, n_zero_advantage=n_zero, n_virtual=n_virtual,
                mitigation=self.mitigation(),
            )  # fmt: skip

    def _advantages(self, groups: list[list[float]]) -> tuple[list[float | None], int]:
        """Per group: AVSPO's advantage for a collapsed group it augments, else None; and the
        number of virtual rewards added."""
        valid = [grp for grp in groups if all(math.isfinite(v) for v in grp)]
        collapsed = [len(set(grp)) == 1 for grp in valid]
        acr = sum(collapsed) / len(valid) if valid else 0.0
        out: list[float | None] = [None] * len(groups)
        if self.mode != "avspo":
            return out, 0
        augment = any(collapsed) and (self.threshold != "adaptive" or acr > self.tau)
        if self.threshold == "adaptive" and valid:
            reward = math.fsum(math.fsum(grp) for grp in valid) / sum(len(grp) for grp in valid)
            self.tau = adaptive_tau_update(self.tau, acr, reward, self.previous_reward, self.eta)
            self.previous_reward = reward
        if not augment:
            return out, 0
        scale = getattr(self.trainer, "scale_rewards", "group") != "none"
        n_virtual = 0
        for p, grp in enumerate(groups):
            if all(math.isfinite(v) for v in grp) and len(set(grp)) == 1:
                single = self.threshold == "single"
                k = 1 if single else avspo_num_virtual(len(grp), acr, self.alpha)
                out[p] = avspo_collapsed_advantage(grp[0], len(grp), k, self.reward_min,
                                                   self.reward_max, TRL_EPS, scale)  # fmt: skip
                n_virtual += k
        return out, n_virtual


def _trl_max_abs_advantage(group: list[float], scale: bool) -> float:
    """max |A| of a group as TRL forms it: ``(r − mean)/(sample std + 1e-4)``."""
    mean = math.fsum(group) / len(group)
    centred = [abs(v - mean) for v in group]
    if not scale:
        return max(centred)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in group) / (len(group) - 1))
    return max(centred) / (std + TRL_EPS)
