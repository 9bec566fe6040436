"""Vantage for verl (docs/design.md §5): the advantage estimator ``"vantage"``, the tracking
backend ``"vantage"`` and a launcher.

Importing this package registers both with verl (tested with verl 0.9.1; torch and verl are
imported at import only to register, and the estimator's work only when verl calls it)::

    python -m vantage.client.integrations.verl <verl's hydra overrides> \\
        algorithm.adv_estimator=vantage trainer.logger=[console,vantage]

runs verl's ``main_ppo`` with both registered in every Ray worker (``launch``), the Monitor built
from ``VANTAGE_SERVER``, ``VANTAGE_API_KEY``, ``VANTAGE_RUN_NAME`` and ``VANTAGE_PROJECT``. In
code of your own, import this package in the process that runs the trainer's ``fit`` (with verl's
``main_ppo`` that is the ``TaskRunner`` actor, not the script that starts Ray)::

    import vantage.client.integrations.verl as vantage_verl

    vantage_verl.configure(Monitor("http://127.0.0.1:8000", api_key, run_name="qwen-verl",
                                   trainer_eps=1e-6))       # optional: else built from VANTAGE_*

- ``estimator``: the advantages (verl's GRPO bit for bit until ``set_mitigation avspo``), the
  groups of every step and the commands;
- ``tracking``: verl's step metrics, with the canonical ``entropy``, ``kl``, ``grad_norm`` and
  ``loss``;
- ``launch``: the launcher behind ``python -m``.

Steps are numbered from 1, as verl's ``global_steps``; a resumed run keeps its numbering from
verl's checkpoint when the tracking backend is on, else with ``configure(monitor, start_step=N)``
or ``VANTAGE_START_STEP=N`` (N = the checkpoint's ``global_step`` + 1).
"""

from __future__ import annotations

import sys

from ...avspo import avspo_num_virtual
from .estimator import (
    ESTIMATOR_NAME,
    VERL_EPS,
    VantageEstimator,
    avspo_group_advantages,
    configure,
    estimator,
    register,
    vantage_advantage,
)
from .tracking import BACKEND_NAME, VantageTracking, install

__all__ = [
    "BACKEND_NAME",
    "ESTIMATOR_NAME",
    "VERL_EPS",
    "VantageEstimator",
    "VantageTracking",
    "avspo_group_advantages",
    "avspo_num_virtual",
    "configure",
    "estimator",
    "install",
    "register",
    "setup_worker",
    "vantage_advantage",
]


def setup_worker() -> None:
    """Ray's ``worker_process_setup_hook`` (set by the launcher): importing this package has
    registered the estimator and the tracking backend in the worker. One line on stderr says so
    (Ray shows it with the worker's name: the proof that the ``TaskRunner`` has them)."""
    import os  # noqa: PLC0415

    print(f"vantage: verl worker {os.getpid()} has the 'vantage' advantage estimator and "
          "tracking backend", file=sys.stderr)  # fmt: skip


register()
install()
