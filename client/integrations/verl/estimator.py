"""verl's advantage estimator ``"vantage"`` (docs/design.md §5); the package's docstring says how
to use it.

- Without mitigation the advantages are verl's own GRPO bit for bit: the estimator calls
  ``compute_grpo_outcome_advantage`` (eps 1e-6, ``torch.std``, a singleton group gets mean 0 and
  std 1, ``config.norm_adv_by_std_in_grpo``).
- Each call is one training step, numbered by a counter from 1. A resumed run keeps its numbering
  with ``configure(monitor, start_step=N)`` or ``VANTAGE_START_STEP=N`` (the first call is then
  step N; verl resuming after ``global_steps`` g: N = g + 1), or, with the ``vantage`` tracking
  backend on, from the checkpoint verl resumes from (``tracking.resume_step``).
- Every group (the rows sharing a uid; a row's reward is the sum of its token-level rewards, as
  verl scores it) is logged with ``log_groups(step, rows, group_ids=uids)``, one list per uid, so
  uneven group sizes stay as they are; then ``log_effective`` with the groups whose advantages
  are all below 1e-3 after mitigation, and the mitigation in effect. A uid holding a whole
  multiple (2× or more) of the usual group size looks shared by several prompts: said once.
- Commands are polled at each call and take effect at that call, acked with its step:
  ``set_mitigation`` mode ``avspo`` (threshold/variant ``fixed``, ``adaptive`` or ``single``,
  ``alpha``, ``eta``, ``tau``; docs/design.md §7 with verl's eps 1e-6 and ``torch.std``: the
  virtual rewards enter only a collapsed group's mean and sample std) and mode ``none`` (verl's
  GRPO again) are applied; ``aapo`` and ``dapo`` are rejected (no reference policy, no group
  filter in an estimator), as are ``stop``, ``checkpoint`` and ``set_sampling`` (the estimator is
  no seam for them). With ``norm_adv_by_std_in_grpo`` false, AVSPO gives ``r_i − μ′``.
- Without ``configure`` a Monitor is built on first use from ``VANTAGE_SERVER``,
  ``VANTAGE_API_KEY``, ``VANTAGE_RUN_NAME`` (else verl's ``trainer.experiment_name`` when the
  tracking backend is on, else ``verl``) and ``VANTAGE_PROJECT`` (else ``trainer.project_name``),
  with verl's trainer eps 1e-6. Monitoring never stops training: a failure is logged once and the
  step goes on with the advantages it has.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...avspo import (
    adaptive_tau_update,
    avspo_num_virtual,
    parse_avspo_params,
    virtual_rewards,
)

if TYPE_CHECKING:
    from ...commands import Command
    from ...monitor import Monitor

__all__ = [
    "ESTIMATOR_NAME",
    "VERL_EPS",
    "VantageEstimator",
    "avspo_group_advantages",
    "configure",
    "estimator",
    "register",
    "vantage_advantage",
]

log = logging.getLogger("vantage.client")

ESTIMATOR_NAME = "vantage"
VERL_EPS = 1e-6  # verl's eps in GRPO's denominator
ZERO_ADVANTAGE_TOL = 1e-3  # docs/design.md §3: a group is zero-advantage when max_i |A_i| < tol
NO_MITIGATION_ALIASES = ("none", "grpo", "off")


def avspo_group_advantages(
    rewards: Any,
    k: int,
    reward_min: float = 0.0,
    reward_max: float = 1.0,
    eps: float = VERL_EPS,
    scale: bool = True,
) -> Any:
    """The advantages of one collapsed group's real completions under AVSPO (docs/design.md §7).

    ``rewards``: the group's G equal rewards (a 1-d tensor). K virtual rewards
    ``v_k = c + (b − c)·k/(K + 1)`` (b the bound on the other side of the midpoint) enter only the
    mean μ′ and the sample std σ′ (``torch.std``); returns ``(r_i − μ′)/(σ′ + eps)`` (``r_i − μ′``
    without ``scale``) in float64, as ``vantage.trainer.advantages.avspo`` computes it.
    """
    import torch  # noqa: PLC0415 (torch only when verl is in use)

    r = rewards.to(torch.float64)
    virtual = torch.tensor(virtual_rewards(float(r[0]), k, reward_min, reward_max), dtype=r.dtype)
    augmented = torch.cat([r, virtual])
    centred = r - augmented.mean()
    return centred / (augmented.std() + eps) if scale else centred


def _norm_adv_by_std(config: Any) -> bool:
    """``config.norm_adv_by_std_in_grpo`` of an AlgoConfig, a DictConfig or a dict (default on)."""
    if config is None:
        return True
    get = getattr(config, "get", None)
    value = get("norm_adv_by_std_in_grpo", True) if callable(get) else None
    return bool(getattr(config, "norm_adv_by_std_in_grpo", True) if value is None else value)


class VantageEstimator:
    """The state behind the ``"vantage"`` estimator: the Monitor, the step counter and the
    mitigation in effect. ``configure`` replaces the module's one instance."""

    def __init__(
        self,
        monitor: Monitor | None = None,
        start_step: int | None = None,
        reward_min: float = 0.0,
        reward_max: float = 1.0,
    ) -> None:
        # Explicit when given or set in the environment; else the tracking backend may move it
        # to the step verl resumes from (before the first call).
        self.start_step_explicit = start_step is not None or bool(
            os.environ.get("VANTAGE_START_STEP")
        )
        if start_step is None:
            start_step = int(os.environ.get("VANTAGE_START_STEP") or 1)
        if start_step < 1:
            raise ValueError(f"start_step must be at least 1, not {start_step}")
        if not reward_min < reward_max:
            raise ValueError(f"reward_min ({reward_min}) must be below reward_max ({reward_max})")
        self.monitor = monitor
        self._monitor_tried = monitor is not None
        self.next_step = start_step
        self.last_step: int | None = None  # the step of the latest call
        # Run name and project when the environment names none (verl's experiment and project
        # names, set by the tracking backend).
        self.default_run_name = "verl"
        self.default_project: str | None = None
        self.reward_min = float(reward_min)
        self.reward_max = float(reward_max)
        self.mode = "none"
        self.threshold = "fixed"
        self.alpha = 0.5
        self.eta = 0.01
        self.tau = 0.5
        self.previous_reward: float | None = None
        self.applied: list[tuple[str, str, int]] = []  # (command_id, status, step)
        self._failed: set[str] = set()

    # ---------------------------------------------------------------- never crash training
    def _failure(self, what: str) -> None:
        if what not in self._failed:
            self._failed.add(what)
            log.exception("vantage: %s failed; training goes on (logged once)", what)

    def warn_once(self, key: str, message: str, *args: Any) -> None:
        """A warning said once per ``key`` for this estimator's life."""
        if key not in self._failed:
            self._failed.add(key)
            log.warning("vantage: " + message, *args)

    def _monitor(self) -> Monitor | None:
        if not self._monitor_tried:
            self._monitor_tried = True
            try:
                from ...monitor import Monitor  # noqa: PLC0415 (not at import: no cycle, no cost)

                self.monitor = Monitor(
                    run_name=os.environ.get("VANTAGE_RUN_NAME") or self.default_run_name,
                    project=os.environ.get("VANTAGE_PROJECT") or self.default_project,
                    reward_min=self.reward_min,
                    reward_max=self.reward_max,
                    trainer_eps=VERL_EPS,
                )
            except Exception:
                self._failure("building a Monitor from VANTAGE_SERVER and VANTAGE_API_KEY")
        return self.monitor

    # ---------------------------------------------------------------- the estimator
    def __call__(
        self,
        token_level_rewards: Any,
        response_mask: Any,
        config: Any = None,
        index: Sequence[Any] | None = None,
        **_: Any,
    ) -> tuple[Any, Any]:
        from verl.trainer.ppo import core_algos  # noqa: PLC0415

        if index is None:
            raise ValueError(
                "the vantage advantage estimator needs the prompts' uids (verl passes "
                "non_tensor_batch['uid'] as index): groups are the rows sharing a uid"
            )
        step = self.next_step
        self.next_step += 1
        self.last_step = step
        monitor = self._monitor()
        if monitor is not None:
            try:
                for cmd in monitor.poll_commands():
                    status, detail = self.apply(cmd)
                    self.applied.append((cmd.command_id, status, step))
                    monitor.ack(cmd.command_id, status, step, detail)
            except Exception:
                self._failure("applying the run's commands")
        norm = _norm_adv_by_std(config)
        advantages, returns = core_algos.compute_grpo_outcome_advantage(
            token_level_rewards=token_level_rewards,
            response_mask=response_mask,
            index=index,
            epsilon=VERL_EPS,
            norm_adv_by_std_in_grpo=norm,
            config=config,
        )
        try:
            groups, scores = self._groups(token_level_rewards, index)
            self._check_shared_uids(groups)
        except Exception:
            self._failure("grouping the rewards by uid")
            return advantages, returns
        n_virtual = 0
        if self.mode == "avspo":
            try:
                n_virtual = self._avspo(advantages, response_mask, groups, scores, norm)
            except Exception:
                self._failure("AVSPO (the step keeps verl's GRPO advantages)")
        if monitor is not None:
            try:
                self._log(monitor, step, groups, scores, advantages, n_virtual)
            except Exception:
                self._failure("logging the step's groups")
        return advantages, returns

    @staticmethod
    def _groups(token_level_rewards: Any, index: Sequence[Any]) -> tuple[dict[Any, list[int]], Any]:
        """Row indices per uid in first-appearance order, and each row's score (verl's sum)."""
        scores = token_level_rewards.sum(dim=-1)
        groups: dict[Any, list[int]] = {}
        for i in range(scores.shape[0]):
            groups.setdefault(index[i], []).append(i)
        return groups, scores

    def _check_shared_uids(self, groups: dict[Any, list[int]]) -> None:
        """Say once when a uid holds 2× or more the usual group size: verl gives each prompt a
        uid of its own, so such a uid is probably shared by several prompts (a data column named
        ``uid``), whose rows then form one group and one advantage baseline."""
        sizes = [len(rows) for rows in groups.values()]
        usual = max(set(sizes), key=sizes.count)
        shared = [uid for uid, rows in groups.items() if usual > 1 and len(rows) >= 2 * usual
                  and len(rows) % usual == 0]  # fmt: skip
        if shared:
            self.warn_once("shared uid", "uid %r holds %d rows while most uids hold %d: is it "
                           "shared by several prompts? Its rows form one group (one baseline) in "
                           "verl's GRPO and in Vantage (said once)", shared[0],
                           len(groups[shared[0]]), usual)  # fmt: skip

    @staticmethod
    def _collapsed(values: list[float]) -> bool:
        return len(values) >= 2 and math.isfinite(values[0]) and min(values) == max(values)

    @staticmethod
    def _valid(values: list[float]) -> bool:
        return len(values) >= 2 and all(math.isfinite(v) for v in values)

    def _avspo(
        self, advantages: Any, response_mask: Any, groups: dict, scores: Any, norm: bool
    ) -> int:
        """Replace the collapsed groups' advantages in place; returns the virtual rewards added."""
        values = scores.tolist()
        per_group = [[values[i] for i in rows] for rows in groups.values()]
        valid = [g for g in per_group if self._valid(g)]
        collapsed = [self._collapsed(g) for g in per_group]
        acr = sum(collapsed) / len(valid) if valid else 0.0
        augment = any(collapsed) and (self.threshold != "adaptive" or acr > self.tau)
        if self.threshold == "adaptive" and valid:
            reward = sum(sum(g) for g in valid) / sum(len(g) for g in valid)
            self.tau = adaptive_tau_update(self.tau, acr, reward, self.previous_reward, self.eta)
            self.previous_reward = reward
        if not augment:
            return 0
        n_virtual = 0
        for rows, is_collapsed in zip(groups.values(), collapsed, strict=True):
            if not is_collapsed:
                continue
            g = len(rows)
            k = 1 if self.threshold == "single" else avspo_num_virtual(g, acr, self.alpha)
            a = avspo_group_advantages(scores[rows], k, self.reward_min, self.reward_max,
                                       VERL_EPS, scale=norm)  # fmt: skip
            for i, value in zip(rows, a.to(advantages.dtype), strict=True):
                advantages[i] = value * response_mask[i]
            n_virtual += k
        return n_virtual

    def _log(self, monitor: Monitor, step: int, groups: dict, scores: Any, advantages: Any,
             n_virtual: int) -> None:  # fmt: skip
        values = scores.tolist()
        rows = [[values[i] for i in members] for members in groups.values()]
        monitor.log_groups(step, rows, group_ids=[str(uid) for uid in groups])
        largest = advantages.abs().amax(dim=-1).tolist()
        valid = [m for m, g in zip(groups.values(), rows, strict=True) if self._valid(g)]
        n_zero = sum(1 for m in valid if max(largest[i] for i in m) < ZERO_ADVANTAGE_TOL)
        monitor.log_effective(step, n_valid=len(valid), n_zero_advantage=n_zero,
                              n_virtual=n_virtual, mitigation=self.mitigation())  # fmt: skip

    # ---------------------------------------------------------------- commands
    def mitigation(self) -> dict[str, Any]:
        """The mitigation in effect, as the trainer reports it."""
        if self.mode == "avspo":
            return {"mode": "avspo", "threshold": self.threshold, "alpha": self.alpha,
                    "eta": self.eta}  # fmt: skip
        return {"mode": "none"}

    def apply(self, cmd: Command) -> tuple[str, str]:
        """Apply one command at this call: ``(status, detail)``; a rejected one changes nothing."""
        if cmd.type != "set_mitigation":
            return "rejected", (
                f"{cmd.type} is not available through verl's advantage estimator (only "
                "set_mitigation none or avspo is)"
            )
        params = dict(cmd.params)
        mode = params.get("mode")
        if mode in NO_MITIGATION_ALIASES:
            self.mode = "none"
            return "applied", "no mitigation (verl's GRPO)"
        if mode != "avspo":
            return "rejected", (
                f"verl's advantage estimator implements avspo and none, not {mode!r} (aapo needs "
                "a reference policy's rewards, dapo a group filter in the sampler)"
            )
        try:
            threshold, numbers = parse_avspo_params(params, self.threshold)
        except ValueError as exc:
            return "rejected", str(exc)
        self.mode, self.threshold = "avspo", threshold
        for key, v in numbers.items():
            setattr(self, key, v)
        said = f"avspo threshold={self.threshold} alpha={self.alpha} eta={self.eta}"
        if self.threshold == "adaptive" or "tau" in numbers:
            said += f" tau={self.tau}"
        return "applied", f"mitigation {said}"


_estimator = VantageEstimator()


def estimator() -> VantageEstimator:
    """The instance behind the registered estimator (its Monitor, step counter and mitigation)."""
    return _estimator


def configure(
    monitor: Monitor | None,
    *,
    start_step: int | None = None,
    reward_min: float = 0.0,
    reward_max: float = 1.0,
) -> VantageEstimator:
    """Give the estimator ``monitor`` and start a fresh state: the next call is step
    ``start_step`` (default ``VANTAGE_START_STEP``, else 1), with no mitigation. ``reward_min``
    and ``reward_max`` are AVSPO's reward bounds (give the Monitor the same)."""
    global _estimator
    _estimator = VantageEstimator(monitor, start_step, reward_min, reward_max)
    return _estimator


def vantage_advantage(
    token_level_rewards: Any,
    response_mask: Any,
    config: Any = None,
    index: Sequence[Any] | None = None,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """verl's estimator ``"vantage"``: ``(advantages, returns)``, both [bs, response_length]."""
    return _estimator(token_level_rewards, response_mask, config=config, index=index, **kwargs)


_warned: set[str] = set()


def register() -> bool:
    """Register ``vantage_advantage`` with verl as ``"vantage"`` (done at import; again is a
    no-op). False, with a one-time warning, when verl is missing or has no ``register_adv_est``."""
    try:
        from verl.trainer.ppo import core_algos  # noqa: PLC0415
    except ImportError as exc:
        problem = f"verl cannot be imported ({exc})"
    else:
        register_adv_est = getattr(core_algos, "register_adv_est", None)
        if register_adv_est is not None:
            try:
                register_adv_est(ESTIMATOR_NAME)(vantage_advantage)
                return True
            except ValueError as exc:  # another function holds the name
                problem = str(exc)
        else:
            problem = "this verl has no verl.trainer.ppo.core_algos.register_adv_est"
    if problem not in _warned:
        _warned.add(problem)
        log.warning("vantage: the 'vantage' advantage estimator is not registered: %s", problem)
    return False
