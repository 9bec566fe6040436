"""``python -m vantage.client.integrations.verl <hydra overrides>``: verl's ``main_ppo`` with the
``"vantage"`` estimator and tracking backend registered where verl uses them (docs/design.md §5).

verl's ``main_ppo`` computes advantages and logs in its ``TaskRunner``, a Ray actor in a process
of its own, so registering in the launching process is not enough. ``main`` imports this package
(registering both here), then runs ``main_ppo.main`` (hydra reads the overrides from
``sys.argv``) with its ``run_ppo`` wrapped: before verl calls ``ray.init``, the wrapper adds to
``ray_kwargs.ray_init.runtime_env`` Ray's ``worker_process_setup_hook``
(``vantage.client.integrations.verl.setup_worker``, which imports this package in every worker)
and the ``VANTAGE_*`` variables of this environment (so a Ray cluster started elsewhere gets
them too). When Ray is already up, or the config names a setup hook of its own, it says so once
and leaves the config alone (then import the package in your ``TaskRunner``).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["SETUP_HOOK", "main", "worker_runtime_env"]

log = logging.getLogger("vantage.client")

SETUP_HOOK = "vantage.client.integrations.verl.setup_worker"
_WRAPPED = "__vantage_launch__"


def worker_runtime_env(config: Any) -> bool:
    """Add the setup hook and the ``VANTAGE_*`` variables to ``config.ray_kwargs.ray_init
    .runtime_env`` (a hydra config of verl's ``ppo_trainer``), in place. False, with a warning,
    when the config already names another setup hook."""
    from omegaconf import OmegaConf, open_dict  # noqa: PLC0415

    with open_dict(config):
        ray_init = OmegaConf.select(config, "ray_kwargs.ray_init")
        if ray_init is None:
            config.ray_kwargs = {"ray_init": {}}
            ray_init = config.ray_kwargs.ray_init
        if ray_init.get("runtime_env") is None:
            ray_init.runtime_env = {}
        runtime_env = ray_init.runtime_env
        hook = runtime_env.get("worker_process_setup_hook")
        if hook not in (None, SETUP_HOOK):
            log.warning(
                "vantage: ray_kwargs.ray_init.runtime_env.worker_process_setup_hook is %r; the "
                "'vantage' estimator and tracking backend are registered only where that hook "
                "imports vantage.client.integrations.verl",
                hook,
            )
            return False
        runtime_env.worker_process_setup_hook = SETUP_HOOK
        if runtime_env.get("env_vars") is None:
            runtime_env.env_vars = {}
        for name, value in os.environ.items():
            if name.startswith("VANTAGE_"):
                runtime_env.env_vars[name] = value
    return True


def _with_vantage_workers(run_ppo: Any) -> Any:
    @functools.wraps(run_ppo)
    def run(config: Any, *args: Any, **kwargs: Any) -> Any:
        import ray  # noqa: PLC0415

        if ray.is_initialized():
            log.warning("vantage: Ray was started before verl's main_ppo; import "
                        "vantage.client.integrations.verl in the TaskRunner yourself")  # fmt: skip
        else:
            worker_runtime_env(config)
        return run_ppo(config, *args, **kwargs)

    setattr(run, _WRAPPED, True)
    return run


def main(argv: Sequence[str] | None = None) -> None:
    """Run verl's ``main_ppo`` with ``argv`` (default: this command's arguments) as its hydra
    overrides, the ``"vantage"`` estimator and tracking backend registered in every worker."""
    import vantage.client.integrations.verl  # noqa: F401, PLC0415 (registers both here)
    from verl.trainer import main_ppo  # noqa: PLC0415

    if not getattr(main_ppo.run_ppo, _WRAPPED, False):
        main_ppo.run_ppo = _with_vantage_workers(main_ppo.run_ppo)
    sys.argv = [main_ppo.__file__, *(sys.argv[1:] if argv is None else argv)]
    main_ppo.main()
