"""Background work of one server process: the periodic alert pass (steps left incomplete, and
`stale`) and the webhook outbox sender. Both are safe to run in every replica at once (see
`alerts` and `notify`); both stop within a few seconds of shutdown."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.orm import Session

from .alerts import Evaluator
from .notify import OutboxSender
from .settings import Settings

log = logging.getLogger("vantage.alerts")


class AlertWorker:
    def __init__(
        self, settings: Settings, session_factory: Callable[[], Session], evaluator: Evaluator
    ) -> None:
        self.settings = settings
        self.session_factory = session_factory
        self.evaluator = evaluator
        self.sender = OutboxSender(settings, session_factory)
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        evaluator.on_notify = self.sender.wake.set  # a transition wakes the sender at once

    def start(self) -> None:
        for name, target in (("periodic", self._periodic), ("outbox", self._outbox)):
            t = threading.Thread(target=target, name=f"vantage-{name}", daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self, timeout: float = 3.0) -> None:
        """Stop both loops, waiting at most ``timeout`` seconds in all (a webhook in flight is
        abandoned: its message stays pending and is sent again after the restart)."""
        self.stopping.set()
        self.sender.wake.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.sender.close()

    def _periodic(self) -> None:
        while not self.stopping.is_set():
            try:
                self.evaluator.periodic_pass(self.session_factory)
            except Exception:  # noqa: BLE001 - a database hiccup must not end the loop
                log.exception("periodic alert pass failed")
            self.stopping.wait(self.settings.periodic_pass_s)

    def _outbox(self) -> None:
        while not self.stopping.is_set():
            sent = 0
            try:
                sent = self.sender.run_once()
            except Exception:  # noqa: BLE001
                log.exception("webhook outbox pass failed")
            if not sent:
                # Other replicas' transitions are found by polling; ours wake the sender.
                self.sender.wake.wait(self.settings.outbox_poll_s)
            self.sender.wake.clear()
