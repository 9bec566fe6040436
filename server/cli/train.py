"""`vantage train`: the bundled GRPO trainer. `vantage.trainer` is imported only in the command."""

from __future__ import annotations

import argparse
import sys

from ..preflight import TRAINER_MODULES, needs


def register(sub: argparse._SubParsersAction) -> None:
    """Add `train` to the `vantage` parser."""
    p = sub.add_parser("train", help="run the bundled GRPO trainer")
    p.add_argument(
        "config",
        help="a config shipped in trainer/configs (arith-tiny, smollm2-arith, gsm8k-gpu) "
        "or the path of a YAML file of trainer settings",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override one trainer setting (repeat for more: --set steps=20 --set lr=1e-5); "
        "the settings are the fields of trainer/config.py",
    )
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    """Train with ``config`` and the ``--set`` overrides; the trainer's exit status."""
    needs("trainer", TRAINER_MODULES)
    from vantage.trainer.signals import Interrupted, interrupt_on_signals

    try:  # the imports take seconds: a signal then says so, instead of a traceback or nothing
        with interrupt_on_signals():
            from vantage.trainer.run import main as train_main
    except Interrupted as exc:
        print(f"vantage train: {exc} while loading the trainer; nothing began", file=sys.stderr)
        return 128 + exc.signum
    return int(train_main([args.config, *sum((["--set", s] for s in args.set or []), [])]) or 0)
