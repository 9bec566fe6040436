"""One Monitor's conversation with the server (docs/design.md §4, §5): create the run, send the
spool's acks and batches in order, heartbeats and the run's end, count what the server took, and
carry the run's commands back out of every answer. The worker thread (`worker`) decides when.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .commands import Command
from .spool import Spool
from .throttle import Throttle
from .transport import Reply, Transport, create_run, send_acks, send_finish, send_head

__all__ = ["Delivery"]

log = logging.getLogger("vantage.client")


class Delivery:
    """What the server has told one Monitor (its ``attempt``, a refused run or key, the last
    steps it took, its commands) and the requests that tell it the rest.

    ``remaining()`` is the time left before close's deadline (None before close), ``queued()``
    whether the training thread has items waiting to be spooled, and ``health()`` the heartbeat
    body: all three are the worker's. Without a ``transport`` (no usable server) it sends
    nothing, and its counters stay as they start.
    """

    def __init__(
        self,
        transport: Transport | None,
        spool: Spool,
        run_body: dict[str, Any],
        *,
        rank: int,
        heartbeat_s: float,
        throttle: Throttle,
        remaining: Callable[[], float | None],
        queued: Callable[[], bool],
        health: Callable[[], bytes],
    ) -> None:
        self.transport, self.spool = transport, spool
        self.run_body, self.run_id = run_body, str(run_body["run_id"])
        self.rank, self.heartbeat_s, self.throttle = rank, heartbeat_s, throttle
        self._remaining, self._queued, self._health = remaining, queued, health
        self.stats: dict[str, int] = dict.fromkeys(
            ("rejected_calls", "sent_batches", "sent_groups", "accepted", "duplicates",
             "conflicts", "invalid_groups", "retries"), 0)  # fmt: skip
        self.attempt: int | None = None
        self.last_steps: list[dict[str, Any]] = []
        self.commands: deque[Command] = deque()
        self.callbacks: list[Callable[[Command], Any]] = []
        self._seen_commands: set[str] = set()
        self.refused: str | None = None  # run creation refused: stop talking to the server
        self.key_refused: str | None = None  # the last batch's 401/403, until one is taken
        self.progress = False  # a request of the last pump succeeded
        self.next_heartbeat = 0.0
        self._told_newest: int | None = None  # the newer attempt a warning named
        self._told_out_of_range = False  # rewards outside [reward_min, reward_max] were named

    def _take_commands(self, data: dict[str, Any]) -> None:
        if self.rank != 0:  # commands go to rank 0, which shares them with the others (§7)
            return
        for raw in data.get("commands") or ():
            cid = str(raw.get("command_id", ""))
            if not cid or cid in self._seen_commands:
                continue
            self._seen_commands.add(cid)
            params = dict(raw.get("params") or {})
            cmd = Command(cid, str(raw.get("type")), params, raw.get("reason"), raw)
            self.commands.append(cmd)
            for callback in list(self.callbacks):
                try:
                    callback(cmd)
                except Exception:
                    log.exception("vantage: on_command callback failed for %s", cid)

    def pump(self, now: float) -> Reply | None:
        """One unit of network work. Returns the reply of a transient failure (to back off on),
        else None."""
        assert self.transport is not None
        self.progress = False  # any success in this pump: backoff counts consecutive failures
        if self.attempt is None:
            reply = create_run(self.transport, self.run_body, timeout=self._remaining())
            if reply.kind == "retry":
                return reply
            if reply.kind == "refused":
                self.refused = reply.error
                log.error(
                    "vantage: the server refused run %s (%s); recording to the spool %s "
                    "only (upload later with `vantage sync`)",
                    self.run_id,
                    reply.error,
                    self.spool.path,
                )
                return None
            self.attempt = int(reply.data["attempt"])
            self.progress = True
            self.next_heartbeat = now  # announce the client's counters at once
        failed = send_acks(self.spool, self.transport, self.run_id, timeout=self._remaining())
        if failed is not None:
            return failed
        failed = self._send_batches()
        if failed is not None:
            return failed
        if now >= self.next_heartbeat:
            reply = self.transport.post(
                f"/runs/{self.run_id}/heartbeat", self._health(), timeout=self._remaining()
            )
            if reply.kind == "retry":
                return reply
            self.next_heartbeat = now + self.heartbeat_s
            if reply.kind == "ok":
                self._note_newest(reply.data)
                self._take_commands(reply.data)
        return None

    def _send_batches(self) -> Reply | None:
        """Send the spool's batches in order until it is empty, the queue has more to drain,
        or close's deadline passes; the reply to back off on, if any."""
        assert self.transport is not None and self.attempt is not None
        while True:
            head = self.spool.head()
            outcome, reply = send_head(
                self.spool, self.transport, self.run_id, self.attempt, timeout=self._remaining()
            )
            if outcome == "retry":
                if reply is not None and reply.status in (401, 403):
                    self.key_refused = reply.error
                    self.throttle.warn(
                        "key_refused",
                        "vantage: the server refuses the API key (%s); batches stay in the "
                        "spool %s and are sent once it takes them (or by vantage sync --api-key)",
                        reply.error,
                        self.spool.path,
                    )
                return reply
            self.progress = True
            self.key_refused = None
            if outcome == "unknown_run":
                log.warning("vantage: %s; creating run %s again", reply.error, self.run_id)
                self.attempt = None
                return reply
            if outcome == "sent" and reply is not None and head is not None:
                self._note_sent(head.n_groups, reply.data)
            remaining = self._remaining()
            if outcome == "empty" or self._queued() or (remaining is not None and remaining <= 0):
                return None

    def _note_sent(self, n_groups: int, answer: dict[str, Any]) -> None:
        """Count a batch the server took, and read its answer."""
        s = self.stats
        s["sent_batches"] += 1
        s["sent_groups"] += n_groups
        for key in ("accepted", "duplicates", "conflicts", "invalid_groups"):
            s[key] += int(answer.get(key) or 0)
        if answer.get("conflicts"):  # the same ids sent again with other rewards
            self.throttle.warn(
                "conflicts",
                "vantage: the server kept the first of %d group(s) sent again under "
                "their ids with other rewards (conflicts); give each group its own id",
                int(answer["conflicts"]),
            )
        self.last_steps = answer.get("steps") or self.last_steps
        self._note_out_of_range(answer)
        self._note_newest(answer)
        self._take_commands(answer)

    def _note_out_of_range(self, answer: dict[str, Any]) -> None:
        """Warn once when the server counted rewards outside the run's bounds: all-pass and
        all-fail sides, pass rates and AVSPO's virtual rewards all assume them (issue 41)."""
        if self._told_out_of_range:
            return
        for step in answer.get("steps") or ():
            n = step.get("n_out_of_range") if isinstance(step, dict) else None
            if isinstance(n, int) and n > 0:
                self._told_out_of_range = True
                lo, hi = self.run_body.get("reward_min", 0.0), self.run_body.get("reward_max", 1.0)
                log.warning(
                    "vantage: %d reward(s) of step %s lie outside the run's bounds [%g, %g]; "
                    "the all-pass/all-fail sides, pass_rate and AVSPO's virtual rewards assume "
                    "them: pass Monitor(reward_min=..., reward_max=...) with your reward "
                    "function's range (warned once)",
                    n, step.get("step"), lo, hi,
                )  # fmt: skip
                return

    def _note_newest(self, answer: dict) -> None:
        """Warn when the server says a newer launch of the run registered (a relaunch while
        this process still trains): its steps are kept, but the newer attempt's win wherever
        both sent a step, and commands go to the newer attempt only. Once per relaunch."""
        newest = answer.get("newest_attempt")
        if (
            isinstance(newest, int)
            and self.attempt is not None
            and newest > self.attempt
            and newest != self._told_newest
        ):
            self._told_newest = newest
            log.warning(
                "vantage: run %s was launched again (attempt %d) while this process, attempt "
                "%d, still sends; the newer attempt's steps win where both send one, and "
                "commands go to it only: stop this process if the relaunch replaces it",
                self.run_id,
                newest,
                self.attempt,
            )

    def finish(self, deadline: float, status: str | None, dropped: int) -> bool:
        """Send this rank's final counts (every rank: the run's client health would otherwise
        keep what its last heartbeat said was waiting), then, from rank 0, the run's final
        status; True when the server has the status (or refused it for good)."""
        if (
            self.transport is None
            or self.attempt is None
            or self.refused is not None
            or self.spool.pending_batches
        ):
            return False
        remaining = deadline - time.monotonic()
        if remaining > 0.1:  # the final counts (a batch may have been dead-lettered since)
            reply = self.transport.post(
                f"/runs/{self.run_id}/heartbeat", self._health(), timeout=remaining / 2
            )
            if reply.kind == "ok":
                self.spool.note_reported(dropped)
        if status is None:
            return False
        remaining = deadline - time.monotonic()
        if remaining <= 0.05:
            return False
        reply = send_finish(self.transport, self.run_id, status, remaining, self.attempt)
        return reply.kind != "retry"
