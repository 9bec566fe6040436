"""The Monitor's background thread (docs/design.md §5): everything but taking the calls.

It batches the queue (every second or every ``batch_groups`` groups) into step records, writes
each batch to the on-disk spool, sends the spool in order, retries with backoff, sends
heartbeats with the spool and drop counters, takes the run's commands out of every answer, and at
close sends the run's end. The training thread only appends named items (`items`) to its queue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

import orjson

from .delivery import Delivery
from .items import Ack, QueueItem, StepRecords
from .sample_outbox import SampleOutbox
from .schema import MAX_GROUPS_PER_REQUEST
from .spool import Spool
from .throttle import Throttle
from .transport import Backoff, Outage, Reply, Transport

__all__ = ["Worker"]

log = logging.getLogger("vantage.client")

# While closing, retries come at least this often (seconds), so that a server back a few
# seconds into a close is found before close's timeout rather than by a later backoff step.
CLOSING_RETRY_S = 2.0
EXIT_SPOOL_S = 10.0  # at interpreter exit, how long the worker may take to spool the rest
# A server that keeps failing is reported once it has failed for this long, then every
# OUTAGE_REPEAT_S while it lasts (seconds).
OUTAGE_WARN_S = 15.0
OUTAGE_REPEAT_S = 600.0


class Worker:
    """The sender thread of one Monitor, and the state it shares with the training thread.

    The training thread calls `put`, `put_ack`, `flush` and `close`; each counter has one
    writer (`put` writes ``enqueued`` and ``queue_dropped``, the thread ``dequeued``), so the
    training thread never waits on a lock the thread holds for long.
    """

    def __init__(
        self,
        run_body: dict[str, Any],
        spool: Spool,
        transport: Transport | None,
        *,
        server: str | None,
        unusable: str | None,
        rank: int,
        world_size: int,
        heartbeat_s: float,
        batch_groups: int,
        batch_interval_s: float,
        max_queue_groups: int,
        throttle: Throttle,
    ) -> None:
        self.spool, self.server, self.unusable = spool, server, unusable
        self.rank, self.world_size = rank, world_size
        self.batch_groups, self.batch_interval = batch_groups, batch_interval_s
        self.max_queue_groups = max_queue_groups
        self.throttle = throttle
        self.queue: deque[QueueItem] = deque()
        self.enqueued = self.dequeued = self.queue_dropped = 0
        self.acks: deque[Ack] = deque()
        self.samples = SampleOutbox(throttle)  # best-effort, never spooled
        self.delivery = Delivery(
            transport,
            spool,
            run_body,
            rank=rank,
            heartbeat_s=heartbeat_s,
            throttle=throttle,
            remaining=self._remaining,
            queued=lambda: bool(self.queue),
            health=self.health,
        )
        self.last_error: str | None = None  # the last failed request's, kept after a success
        self.outage = Outage(OUTAGE_WARN_S, OUTAGE_REPEAT_S)
        self.wake = threading.Event()
        self.closing = threading.Event()
        self.final_lock = threading.Lock()  # the final spooling: this thread's or close()'s
        self.force_drain = False
        self.draining = False
        self.deadline = float("inf")
        self.finish_status: str | None = None
        self.finish_sent = False  # the server confirmed the run's end
        self.abandon = False
        self.thread = threading.Thread(target=self._run, name="vantage-sender", daemon=True)

    def start(self) -> None:
        self.thread.start()

    # ------------------------------------------------------------------ training thread
    def put(self, item: QueueItem) -> bool:
        """Queue an item; False (its groups dropped and counted) when the queue is full."""
        n_groups = item.n_groups
        queued = self.enqueued - self.dequeued
        if queued + n_groups > self.max_queue_groups:
            self.queue_dropped += n_groups
            self.throttle.warn(
                "queue_full",
                "vantage: %s groups dropped: the queue already holds %s groups and takes at "
                "most max_queue_groups=%s (%s dropped so far): the sender cannot keep up, or "
                "its spool is full",
                f"{n_groups:,}",
                f"{queued:,}",
                f"{self.max_queue_groups:,}",
                f"{self.queue_dropped:,}",
            )
            return False
        self.queue.append(item)
        self.enqueued += n_groups
        if queued + n_groups >= self.batch_groups and not self.wake.is_set():
            self.wake.set()
        return True

    def put_ack(self, ack: Ack) -> None:
        self.acks.append(ack)
        self.wake.set()

    def flush(self, seconds: float) -> bool:
        """Drain and send now (not after the current backoff) and wait up to ``seconds`` until
        the server has everything; True when it has."""
        end = time.monotonic() + seconds
        self.force_drain = True
        self.wake.set()
        while time.monotonic() < end:
            if self.idle():
                return True
            if not self.thread.is_alive():
                return False
            time.sleep(0.01)
        return self.idle()

    def close(self, seconds: float, finish_status: str | None) -> None:
        """Wake the thread for its last round (cancelling any backoff wait) and wait up to
        ``seconds`` for it; ``finish_status`` is the run's end to send, if any. If it is still
        busy (a request that started before close, or a very long queue), move what can be of
        the queue to the spool from this thread, so that it survives the process; the thread
        goes on with the rest while the process lives."""
        self.deadline = time.monotonic() + seconds
        self.finish_status = finish_status
        self.closing.set()
        self.wake.set()
        self.thread.join(max(0.0, seconds - 0.2))
        if self.thread.is_alive() and self.final_lock.acquire(timeout=0.05):
            try:
                end = time.monotonic() + 0.1
                while self.queue and time.monotonic() < end and not self.spool.closed:
                    self.drain(limit=1_000)
            except Exception:
                log.exception("vantage: could not spool the queue at close")
            finally:
                self.final_lock.release()

    def stop_at_exit(self) -> None:
        """Interpreter exit, after close: give a thread still at work up to EXIT_SPOOL_S to move
        what is left to the spool (local disk: past close's deadline it makes no more
        requests), then stop it before the interpreter tears down under it. A thread waiting on
        a request cannot spool: this thread moves the queue, and rank 0's final status, to the
        spool itself."""
        if self.thread.is_alive():
            self._spool_rest()
        self.thread.join(EXIT_SPOOL_S)
        if self.thread.is_alive():
            self._spool_rest(with_finish=True)
            self.abandon = True
            self.wake.set()
            self.thread.join(2.0)

    def _spool_rest(self, with_finish: bool = False) -> None:
        """Move the queue to the spool from this thread (and, ``with_finish``, keep rank 0's
        final status there for `vantage sync`), unless the worker is doing its own final
        spooling (it holds the lock) or has closed the spool."""
        if not self.final_lock.acquire(timeout=1.0):
            return
        try:
            if self.spool.closed:
                return
            self.drain(limit=None)
            if with_finish and self.finish_status and self.a_run_to_end():
                self.spool.keep_finish(self.finish_status)
        except Exception:  # noqa: BLE001 - at exit: say it, never raise
            log.exception("vantage: could not spool the queue at exit")
        finally:
            self.final_lock.release()

    # ------------------------------------------------------------------ counters
    @property
    def queued(self) -> int:
        return max(0, self.enqueued - self.dequeued)

    @property
    def dropped_groups(self) -> int:
        return self.queue_dropped + self.spool.dropped_groups

    def idle(self) -> bool:
        """Whether everything logged so far is on the server (or can never be sent)."""
        return (
            not self.queue
            and not self.acks
            and self.spool.pending_batches == 0
            and not self.force_drain
            and not self.draining
            and (not self._online() or not self.spool.pending_acks)
            and (not self._online() or not self.samples.waiting)
        )

    def a_run_to_end(self) -> bool:
        """Whether there is a run for `vantage sync` to mark ended: one the server registered,
        or one the spool will register (it holds batches, or drops it keeps the file for)."""
        return bool(self.delivery.attempt or not self.spool.empty or self.spool.dropped_groups)

    def _backlog(self) -> int:
        """Groups logged and not yet taken by the server, when they are a backlog: while the
        server fails, or more than a batch of them. A batch on its way to a healthy server is
        not one (the run page would show a healthy fast trainer as "spooled")."""
        waiting = self.spool.pending_groups + self.queued
        failing = self.outage.since is not None or self.delivery.key_refused is not None
        return waiting if failing or waiting > self.batch_groups else 0

    def health(self) -> bytes:
        """The heartbeat body: this rank's client-health counters (docs/design.md §4)."""
        return orjson.dumps(
            {
                "attempt": self.delivery.attempt,
                "rank": self.rank,
                "spooled_groups": self._backlog(),
                "dropped_groups": self.dropped_groups,
                "dead_letter_batches": self.spool.dead_letter_batches,
            }
        )

    # ------------------------------------------------------------------ worker thread
    def drain(self, limit: int | None = MAX_GROUPS_PER_REQUEST) -> None:
        """Queue → step records → spool, at most about ``limit`` groups (None: all), so that
        sending interleaves with encoding when the trainer produces faster than the server
        ingests. It yields the GIL between items: a training thread calling ``log_*`` never
        waits long for it."""
        items: list[QueueItem] = []
        taken = 0
        while limit is None or taken < limit:
            try:
                item = self.queue.popleft()
            except IndexError:
                break
            items.append(item)
            self.dequeued += item.n_groups
            taken += item.n_groups
        while self.acks:
            ack = self.acks.popleft()
            self.spool.add_ack(ack.command_id, ack.body)
        if not items:
            return
        records = StepRecords(self.world_size, self.throttle)
        for index, item in enumerate(items):
            if self.abandon:
                records.dropped += sum(it.n_groups for it in items[index:])
                break
            records.add(item)
            time.sleep(0)  # let a waiting training thread have the GIL
        bodies = records.bodies()
        self.spool.count_dropped(records.dropped)
        for body, n_groups in bodies:
            if not self.spool.append(body, n_groups):
                log.warning(
                    "vantage: spool full (%d bytes); dropped %d groups",
                    self.spool.max_bytes,
                    n_groups,
                )

    def _online(self) -> bool:
        """Whether there is a server to talk to: a usable one, which has not refused the run."""
        return self.delivery.transport is not None and self.delivery.refused is None

    def _remaining(self) -> float | None:
        if not self.closing.is_set():
            return None
        return self.deadline - time.monotonic()

    def _note_failing(self, reply: Reply) -> None:
        """Tell the user when the server has kept failing for a while (training goes on)."""
        lasted = self.outage.failed(time.monotonic())
        if lasted is None:
            return
        waiting = self.spool.pending_groups + self.queued
        if reply.status in (401, 403):  # it answers: it refuses the key
            log.warning(
                "vantage: server %s has refused the API key for %.0f s (%s); training goes on, "
                "and %d group(s) wait in the spool %s (vantage sync --api-key sends them)",
                self.server,
                lasted,
                reply.error,
                waiting,
                self.spool.path,
            )
        else:
            log.warning(
                "vantage: server %s has failed for %.0f s (last error: %s); training goes on, "
                "and %d group(s) wait in the spool %s until it answers",
                self.server,
                lasted,
                reply.error,
                waiting,
                self.spool.path,
            )

    def _note_answering(self) -> None:
        lasted = self.outage.succeeded(time.monotonic())
        if lasted is not None:
            log.warning(
                "vantage: server %s answers again after %.0f s; sending what the spool kept",
                self.server,
                lasted,
            )

    def _run(self) -> None:
        backoff = Backoff()
        retry_at = 0.0
        last_drain = time.monotonic()
        cancelled_backoff = False
        while True:
            self.wake.clear()
            now = time.monotonic()
            closing = self.closing.is_set()
            if closing and not cancelled_backoff:
                retry_at, cancelled_backoff = 0.0, True
            if self.force_drain:  # flush(): try the server now rather than after the backoff
                retry_at = 0.0
            try:
                if (
                    closing
                    or self.force_drain
                    or self.acks
                    or self.queued >= self.batch_groups
                    or now - last_drain >= self.batch_interval
                ):
                    self.draining = True  # flush() must not see the queue empty mid-drain
                    self.force_drain = False
                    try:
                        self.drain()
                    finally:
                        self.draining = False
                    last_drain = now
                if self._online() and now >= retry_at:
                    retry_at = self._send(now, backoff, closing, retry_at)
            except Exception:  # the worker must outlive any bug of ours
                log.exception("vantage: sender error")
                retry_at = time.monotonic() + backoff.next_delay()
            if self.abandon or self._done(closing):
                break
            wait = self._wait(closing, last_drain, retry_at)
            if wait > 0:
                self.wake.wait(wait)
        self._end()

    def _send(self, now: float, backoff: Backoff, closing: bool, retry_at: float) -> float:
        """One round of network work; the time of the next try."""
        failed = self.delivery.pump(now)
        if failed is None and self.samples.waiting:  # the server takes batches: samples next
            self._send_samples()
        if failed is None or self.delivery.progress:
            backoff.reset()
            self._note_answering()
        if failed is None:
            return retry_at
        self.delivery.stats["retries"] += 1
        self.last_error = failed.error
        delay = backoff.next_delay(failed.retry_after)
        if closing and failed.retry_after is None:  # back soon: seen soon
            delay = min(delay, CLOSING_RETRY_S)
        if not self.delivery.progress:
            self._note_failing(failed)
        return time.monotonic() + delay

    def _send_samples(self) -> None:
        """Send the waiting samples (best-effort: a transient failure leaves them for the next
        round, and never backs the batches off)."""
        transport, attempt = self.delivery.transport, self.delivery.attempt
        if transport is None or attempt is None or self.delivery.refused is not None:
            return
        self.samples.send(transport, self.delivery.run_id, attempt, self._remaining())

    def _done(self, closing: bool) -> bool:
        """Whether close's last round is over: all is sent, nothing can be, or time is up. A
        refused run or key does not heal within close's timeout: what is left stays in the
        spool for sync."""
        if not closing:
            return False
        offline = not self._online() or self.delivery.key_refused is not None
        done = not self.queue and (offline or self.spool.empty)
        return done or time.monotonic() >= self.deadline

    def _wait(self, closing: bool, last_drain: float, retry_at: float) -> float:
        """How long to sleep before the next round (a put or close wakes it sooner)."""
        now = time.monotonic()
        wait = self.batch_interval - (now - last_drain)
        if self._online():
            if retry_at > now:  # backing off: no network before retry_at
                wait = min(wait, retry_at - now)
            else:
                if self.delivery.attempt is not None:
                    wait = min(wait, self.delivery.next_heartbeat - now)
                if self.spool.pending_batches or self.spool.pending_acks:
                    wait = 0.0  # the pump stopped to let the queue in; carry on sending
        if closing:
            wait = min(wait, self.deadline - now)
        if self.queued >= self.batch_groups or (closing and self.queue):
            wait = 0.0  # more to drain now
        return wait

    def _end(self) -> None:
        """After the last round: send the run's end, then spool what is left and close the
        spool (deleting it when nothing in it is worth keeping)."""
        finished = False
        try:
            if self.samples.waiting and self._online():  # the last round's, before the end
                self._send_samples()
            if not self.queue:
                finished = self.delivery.finish(
                    self.deadline, self.finish_status, self.dropped_groups
                )
        except Exception:
            log.exception("vantage: finish failed")
        self.finish_sent = finished
        if self.delivery.transport is not None:
            self.delivery.transport.close()
        with self.final_lock:  # not while close() is moving the queue to the spool
            self.drain(limit=None)
            # Record the queue's drops in the file too, so that `vantage sync` reports them.
            moved, self.queue_dropped = self.queue_dropped, 0
            self.spool.count_dropped(moved)
            if self.finish_status and not finished and self.a_run_to_end():
                self.spool.keep_finish(self.finish_status)  # for `vantage sync`
            self.spool.close(remove_if_clean=True)
