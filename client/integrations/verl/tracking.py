"""verl's step metrics into Vantage: a tracking backend named ``"vantage"`` (docs/design.md §5).

verl's ``verl.utils.tracking.Tracking`` accepts only the names in its class attribute
``supported_backend`` and builds each backend by name in ``__init__``. ``install()`` (run when
``vantage.client.integrations.verl`` is imported, never otherwise) adds ``"vantage"`` to that
list and wraps ``Tracking.__init__`` and ``Tracking.finish`` so that ``trainer.logger=[console,
vantage]`` adds a ``VantageTracking`` to ``Tracking.logger``; ``Tracking.log`` then calls its
``log(data, step)`` like any other backend's. Installing again is a no-op, and a verl whose
``Tracking`` lacks that list or those methods gets a one-time warning and is left as it is.

``VantageTracking`` sends the estimator's Monitor (one run for groups and scalars):

- every numeric metric of the step under verl's name (``val-`` metrics to split ``eval``), NaN and
  ±Infinity as they are (docs/design.md §5: never dropped);
- ``actor/entropy``, ``actor/grad_norm``, ``actor/pg_loss`` and the KL to the reference model
  (``actor/kl_loss`` when ``actor.use_kl_loss``, else ``actor/reward_kl_penalty`` when the KL is
  in the reward) again under the canonical names ``entropy``, ``grad_norm``, ``loss``, ``kl``.

It also names the run after verl's ``trainer.experiment_name`` and ``trainer.project_name`` when
``VANTAGE_RUN_NAME``/``VANTAGE_PROJECT`` are not set, and numbers a resumed run from verl's
checkpoint (``resume_step``), unless ``configure(start_step=...)``/``VANTAGE_START_STEP`` did.
"""

from __future__ import annotations

import functools
import logging
import numbers
import os
from collections.abc import Mapping
from typing import Any

from .estimator import estimator

__all__ = ["BACKEND_NAME", "CANONICAL_SCALARS", "VantageTracking", "install", "resume_step"]

log = logging.getLogger("vantage.client")

BACKEND_NAME = "vantage"

# verl's metric → canonical name (docs/design.md §5); for kl the first one present wins.
CANONICAL_SCALARS: dict[str, tuple[str, ...]] = {
    "entropy": ("actor/entropy",),
    "grad_norm": ("actor/grad_norm",),
    "loss": ("actor/pg_loss",),
    "kl": ("actor/kl_loss", "actor/reward_kl_penalty"),
}

_PATCHED = "__vantage_tracking__"  # marks verl's wrapped methods, so install() runs once


def _number(value: Any) -> Any:
    """``value`` when it is a number (a numpy or torch scalar read as a float), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return value
    if getattr(value, "ndim", None) == 0 or getattr(value, "shape", None) == ():
        try:
            return float(value)
        except (TypeError, ValueError):
            return None
    return None


def step_scalars(data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(train, eval)`` scalars of one ``Tracking.log`` call: numbers only, canonical names
    added, ``val-`` metrics apart."""
    train: dict[str, Any] = {}
    evals: dict[str, Any] = {}
    for key, value in data.items():
        number = _number(value)
        if number is None:
            continue
        (evals if str(key).startswith("val-") else train)[str(key)] = number
    for canonical, names in CANONICAL_SCALARS.items():
        for name in names:
            if name in train:
                train.setdefault(canonical, train[name])
                break
    return train, evals


def resume_step(config: Mapping[str, Any] | None) -> int | None:
    """The step verl's ``RayPPOTrainer`` resumes at (its checkpoint's ``global_step_N`` + 1), found
    with verl's own ``find_latest_ckpt_path`` and ``trainer.resume_mode`` rules, or None when it
    starts afresh (or the config says too little). Mirrors ``RayPPOTrainer._load_checkpoint``."""
    trainer = (config or {}).get("trainer") or {}
    mode = trainer.get("resume_mode", "auto")
    if mode == "disable":
        return None
    if mode == "resume_path":
        folder = trainer.get("resume_from_path")
    else:
        from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path  # noqa: PLC0415

        local_dir = trainer.get("default_local_dir")
        if not local_dir or trainer.get("default_hdfs_dir"):
            return None
        folder = find_latest_ckpt_path(os.path.join(os.getcwd(), local_dir))
    if not isinstance(folder, str) or "global_step_" not in folder:
        return None
    try:
        return int(folder.rsplit("global_step_", 1)[-1].strip("/")) + 1
    except ValueError:
        return None


class VantageTracking:
    """verl's tracking backend ``"vantage"``: ``log(data, step)`` and ``finish()``."""

    def __init__(self, project_name: Any = None, experiment_name: Any = None,
                 config: Mapping[str, Any] | None = None) -> None:  # fmt: skip
        est = estimator()
        self.estimator = est
        if experiment_name:
            est.default_run_name = str(experiment_name)
        if project_name:
            est.default_project = str(project_name)
        if not est.start_step_explicit and est.last_step is None:
            try:
                step = resume_step(config)
            except Exception:  # noqa: BLE001 - numbering is monitoring, never a crash
                est.warn_once("resume step", "could not read verl's checkpoint folder; steps "
                              "count from %d (set VANTAGE_START_STEP)", est.next_step)  # fmt: skip
                step = None
            if step is not None:
                est.next_step = step
                log.info("vantage: verl resumes at step %d; Vantage numbers it so", step)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """Send one step's metrics (verl calls this once per step, after the update)."""
        est = self.estimator
        try:
            monitor = est._monitor()
            if monitor is None:
                return
            train, evals = step_scalars(data)
            if train:
                monitor.log_scalars(step, train)
                if est.last_step is not None and est.last_step != step:
                    est.warn_once(
                        "step mismatch",
                        "verl logs step %d where the estimator numbered its groups %d: set "
                        "VANTAGE_START_STEP or configure(start_step=...) (said once)",
                        step,
                        est.last_step,
                    )
            if evals:
                monitor.log_scalars(step, evals, split="eval")
        except Exception:  # noqa: BLE001 - monitoring never stops training
            est._failure("sending verl's metrics")

    def finish(self, exit_code: int = 0) -> None:
        """Send what is queued, without ending the run (the Monitor closes at exit)."""
        monitor = self.estimator.monitor
        if monitor is not None:
            try:
                monitor.flush(timeout=30)
            except Exception:  # noqa: BLE001
                self.estimator._failure("flushing at verl's finish")


def _wrap_init(init: Any) -> Any:
    @functools.wraps(init)
    def __init__(self: Any, project_name: Any, experiment_name: Any,
                 default_backend: Any = "console", config: Any = None) -> None:  # fmt: skip
        init(self, project_name, experiment_name, default_backend, config)
        backends = [default_backend] if isinstance(default_backend, str) else default_backend
        if BACKEND_NAME in (backends or []):
            self.logger[BACKEND_NAME] = VantageTracking(project_name, experiment_name, config)

    setattr(__init__, _PATCHED, True)
    return __init__


def _wrap_finish(finish: Any) -> Any:
    @functools.wraps(finish)
    def finish_all(self: Any, *args: Any, **kwargs: Any) -> Any:
        first = not getattr(self, "_finished", False)
        try:
            return finish(self, *args, **kwargs)
        finally:  # verl's finish knows its own backends by name only
            ours = getattr(self, "logger", {}).get(BACKEND_NAME)
            if first and ours is not None:
                ours.finish(*args, **kwargs)

    setattr(finish_all, _PATCHED, True)
    return finish_all


_said: set[str] = set()


def install() -> bool:
    """Teach verl's ``Tracking`` the backend ``"vantage"`` (idempotent). False, with a one-time
    warning, when verl or its ``Tracking`` is not as expected (0.9.1 is tested)."""
    try:
        from verl.utils.tracking import Tracking  # noqa: PLC0415
    except ImportError as exc:
        problem = f"verl.utils.tracking cannot be imported ({exc})"
    else:
        supported = getattr(Tracking, "supported_backend", None)
        if isinstance(supported, list) and callable(getattr(Tracking, "finish", None)):
            if not getattr(Tracking.__init__, _PATCHED, False):
                Tracking.__init__ = _wrap_init(Tracking.__init__)
                Tracking.finish = _wrap_finish(Tracking.finish)
            if BACKEND_NAME not in supported:
                supported.append(BACKEND_NAME)
            return True
        problem = "verl's Tracking has no supported_backend list or finish method"
    if problem not in _said:
        _said.add(problem)
        log.warning("vantage: the 'vantage' tracking backend is not available: %s", problem)
    return False
