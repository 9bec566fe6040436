"""The trainer's side of the client hook: a thin adapter over ``vantage.client.Monitor`` that never
lets monitoring trouble reach training.

With no server configured (and no factory) there is no Monitor at all and every call is a no-op.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
from vantage.client.commands import Command

__all__ = ["MonitorAdapter", "make_monitor"]

log = logging.getLogger(__name__)

MonitorFactory = Callable[..., Any]


class MonitorAdapter:
    """Forwards to a Monitor (or does nothing without one); every exception is logged, never raised.

    After ``max_failures`` failures in a row the adapter stops calling the Monitor, so a broken
    client cannot slow every step with tracebacks.
    """

    def __init__(self, monitor: Any | None, max_failures: int = 20) -> None:
        self.monitor = monitor
        self.failures = 0
        self.max_failures = max_failures

    @property
    def active(self) -> bool:
        return self.monitor is not None and self.failures < self.max_failures

    @property
    def run_id(self) -> str | None:
        return getattr(self.monitor, "run_id", None) if self.monitor is not None else None

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if not self.active:
            return None
        try:
            result = getattr(self.monitor, name)(*args, **kwargs)
        except Exception as exc:  # monitoring must never stop training
            self.failures += 1
            log.warning(
                "vantage monitor.%s failed (%s: %s); training continues",
                name,
                type(exc).__name__,
                exc,
            )
            return None
        self.failures = 0
        return result

    def log_groups(self, step: int, rewards: torch.Tensor, prompt_ids: list[str]) -> None:
        self._call("log_groups", step, rewards.detach().cpu().tolist(), prompt_ids=prompt_ids)

    def log_effective(
        self,
        step: int,
        n_valid: int,
        n_zero_advantage: int,
        n_virtual: int,
        mitigation: Mapping[str, Any] | None = None,
    ) -> None:
        self._call(
            "log_effective",
            step,
            n_valid=n_valid,
            n_zero_advantage=n_zero_advantage,
            n_virtual=n_virtual,
            mitigation=mitigation,
        )

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        self._call("log_scalars", step, dict(scalars))

    def log_samples(
        self, step: int, problems: list[Any], texts: list[str], rewards: torch.Tensor, n: int
    ) -> None:
        """Send ``n`` of the step's prompts with their completions and rewards (``rewards``
        [P, G], ``texts`` the P·G completions prompt-major): the collapsed groups first (what
        the dashboard's prompts tab asks about), then the others, in order. 0 sends none."""
        if n <= 0 or not self.active or not problems:
            return
        g = len(texts) // len(problems)
        rows = rewards.detach().cpu().tolist()
        collapsed = [i for i, row in enumerate(rows) if row and max(row) == min(row)]
        chosen = set(collapsed)
        order = collapsed + [i for i in range(len(rows)) if i not in chosen]
        for i in order[:n]:
            p = problems[i]
            completions = texts[i * g : (i + 1) * g]
            self._call("log_samples", step, p.question, completions, rows[i], prompt_id=p.prompt_id)

    def poll_commands(self) -> list[Command]:
        polled = self._call("poll_commands") or []
        out = []
        for raw in polled:
            try:
                out.append(Command.from_any(raw))
            except Exception as exc:
                log.warning("vantage: ignoring a command that cannot be read (%s)", exc)
        return out

    def ack(self, command: Command, status: str, step: int, detail: str | None = None) -> None:
        if command.local:
            return
        self._call("ack", command.command_id, status, step, detail)

    def close(self, failed: bool = False, timeout: float | None = None) -> None:
        """Close the Monitor, marking the run failed or finished; ``timeout``: seconds it may
        wait for the server (None: the Monitor's default)."""
        if self.monitor is None:
            return
        status = "failed" if failed else "finished"
        try:
            if timeout is None:
                self.monitor.close(status=status)
            else:
                try:
                    self.monitor.close(status=status, timeout=timeout)
                except TypeError:  # a Monitor of its own that takes no timeout
                    self.monitor.close(status=status)
        except TypeError:
            self._call("close")
        except Exception as exc:
            log.warning("vantage monitor.close failed (%s); training result is unaffected", exc)


def make_monitor(
    factory: MonitorFactory | None,
    server: str | None,
    kwargs: dict[str, Any],
) -> MonitorAdapter:
    """A MonitorAdapter around ``factory(**kwargs)``, else ``vantage.client.Monitor`` when a server
    is configured, else none. Keywords the factory does not accept are left out; a failure to
    construct is logged and training runs unmonitored."""
    if factory is None:
        if not server or server == "none":
            log.info("no Vantage server (server: or VANTAGE_SERVER): training runs unmonitored")
            return MonitorAdapter(None)
        try:
            from vantage.client import Monitor
        except ImportError as exc:
            log.warning("vantage client unavailable (%s); training runs unmonitored", exc)
            return MonitorAdapter(None)
        factory = Monitor
    try:
        params = inspect.signature(factory).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            kwargs = {k: v for k, v in kwargs.items() if k in params}
    except (TypeError, ValueError):
        pass
    try:
        return MonitorAdapter(factory(**kwargs))
    except Exception as exc:
        log.warning(
            "vantage monitor could not start (%s: %s); training runs unmonitored",
            type(exc).__name__,
            exc,
        )
        return MonitorAdapter(None)
