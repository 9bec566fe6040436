"""Background work of one server process: the periodic alert pass (steps left incomplete, and
`stale`) and the webhook outbox sender. Both are safe to run in every replica at once (see
`evaluation` and `outbox`); both stop within a few seconds of shutdown."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.orm import Session

from ..db import first_line
from ..samples import prune_samples
from ..settings import Settings
from .evaluation import Evaluator
from .outbox import OutboxSender

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
        failing = Failing("periodic alert pass")
        pruned_at = -float("inf")
        while not self.stopping.is_set():
            try:
                self.evaluator.periodic_pass(self.session_factory)
                if time.monotonic() - pruned_at >= self.settings.samples_prune_s:
                    pruned_at = time.monotonic()
                    self._prune_samples()
                failing.ok()
            except Exception as exc:  # noqa: BLE001 - a database hiccup must not end the loop
                self.stopping.wait(failing.failed(exc))
            self.stopping.wait(self.settings.periodic_pass_s)

    def _prune_samples(self) -> None:
        """The samples' retention (`samples_keep_days`, `samples_keep_steps`)."""
        s = self.settings
        with self.session_factory() as session:
            deleted = prune_samples(session, s.samples_keep_days, s.samples_keep_steps)
            session.commit()
        if deleted:
            log.info("deleted %d completion samples past their retention", deleted)

    def _outbox(self) -> None:
        failing = Failing("webhook outbox pass")
        while not self.stopping.is_set():
            sent = 0
            try:
                sent = self.sender.run_once()
                failing.ok()
            except Exception as exc:  # noqa: BLE001
                # no wake-up while it fails: a poll every 0.25 s logged 5 tracebacks a second
                # with the database down
                self.stopping.wait(failing.failed(exc))
            if not sent:
                # Other replicas' transitions are found by polling; ours wake the sender.
                self.sender.wake.wait(self.settings.outbox_poll_s)
            self.sender.wake.clear()


class Failing:
    """The state of a loop whose passes fail (the database is down, say): the first failure is
    logged with its traceback, later ones as one line at most once a minute, and the return to
    work once. `failed` answers how long to pause before the next pass: 1 s, doubling to 60 s."""

    MAX_PAUSE_S = 60.0

    def __init__(self, what: str) -> None:
        self.what = what
        self.count = 0
        self.logged_at = 0.0

    def failed(self, exc: BaseException) -> float:
        """Note a failed pass (log as said above); the seconds to pause."""
        self.count += 1
        now = time.monotonic()
        if self.count == 1:
            log.exception("%s failed; retrying with back-off", self.what, exc_info=exc)
            self.logged_at = now
        elif now - self.logged_at >= self.MAX_PAUSE_S:
            log.error(
                "%s still failing (%d times): %s",
                self.what,
                self.count,
                f"{type(exc).__name__}: {first_line(exc)}",
            )
            self.logged_at = now
        return min(self.MAX_PAUSE_S, 2.0 ** (self.count - 1))

    def ok(self) -> None:
        """Note a pass that worked."""
        if self.count:
            log.warning("%s works again after %d failures", self.what, self.count)
        self.count = 0
