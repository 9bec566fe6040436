"""The Monitor's completion samples on their way to the server (docs/design.md §5 'Samples').

Samples are diagnostics, sent best-effort: kept in memory (never in the spool), at most
``max_samples`` waiting, sent by the worker thread after each round in which the server took
the spool's batches, at most `MAX_SAMPLES_PER_REQUEST` and about `REQUEST_BYTES` a request.
What cannot be sent is dropped and counted, with a throttled warning: a full outbox, a sample
the server refuses (422), a server that does not know samples (404: older than this client),
a run or key it refuses. A transient failure (a timeout, 5xx) keeps them for the next round.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

import orjson

from .samples import MAX_SAMPLES_PER_REQUEST, build_sample
from .throttle import Throttle
from .transport import Reply, Transport

__all__ = ["SampleOutbox"]

log = logging.getLogger("vantage.client")

REQUEST_BYTES = 1 << 20  # a request's samples: well below the server's 8 MiB


class SampleOutbox:
    """Samples (``SampleIn`` bodies as dicts) waiting to be sent; ``sent`` and ``dropped``
    count them. `add` and `put` are the training thread's (O(1) but for building the body),
    `send` the worker thread's."""

    def __init__(self, throttle: Throttle, max_samples: int = 1024) -> None:
        self.throttle = throttle
        self.max_samples = max_samples
        self.waiting: deque[dict[str, Any]] = deque()
        self.sent = self.dropped = 0
        self.refused: str | None = None  # the server cannot take samples: drop the rest
        # samples so far per (step, split, rank): the next one's seq (the training thread's)
        self.counters: dict[tuple[int, str, int], int] = {}

    def add(self, step: int, split: str, rank: int, per_step: int, *sample: Any) -> None:
        """One ``log_samples`` call (its step, split and rank checked): dropped and counted
        past ``per_step`` samples of its (step, split, rank), else built (`build_sample`:
        ValueError or TypeError for bad input, raised to the caller) and queued with its
        number within the step."""
        key = (step, split, rank)
        seq = self.counters.get(key, 0)
        if seq >= per_step:
            self.drop(1, f"step {step} has samples_per_step={per_step} already")
            return
        body, _cut = build_sample(step, split, rank, seq, *sample)
        self.counters[key] = seq + 1
        if len(self.counters) > 4096:  # keep the recent steps only
            for old in list(self.counters)[:2048]:
                del self.counters[old]
        self.put(body)

    def put(self, sample: dict[str, Any]) -> bool:
        """Queue one sample; False (dropped and counted) when the outbox is full or the server
        cannot take samples."""
        if self.refused is not None or len(self.waiting) >= self.max_samples:
            why = self.refused or f"{self.max_samples:,} samples already wait to be sent"
            self.drop(1, why)
            return False
        self.waiting.append(sample)
        return True

    def drop(self, n: int, why: str) -> None:
        self.dropped += n
        self.throttle.warn(
            "samples:dropped",
            "vantage: %d completion sample%s dropped (%s; %s dropped so far); training and "
            "the reward groups are not affected",
            n,
            "" if n == 1 else "s",
            why,
            f"{self.dropped:,}",
        )

    def _next_request(self) -> list[dict[str, Any]]:
        """The oldest samples that fit in one request (at least one)."""
        out, size = [], 0
        # by index, not by iterating: the training thread may append meanwhile (an iterated
        # deque that grows raises RuntimeError); only this thread takes from the left
        for i in range(min(len(self.waiting), MAX_SAMPLES_PER_REQUEST)):
            sample = self.waiting[i]
            n = len(orjson.dumps(sample))
            if out and (len(out) >= MAX_SAMPLES_PER_REQUEST or size + n > REQUEST_BYTES):
                break
            out.append(sample)
            size += n
        return out

    def send(
        self, transport: Transport, run_id: str, attempt: int, timeout: float | None = None
    ) -> Reply | None:
        """Send what waits, a request at a time; the reply of a transient failure (the rest
        waits for the next round), else None."""
        while self.waiting:
            part = self._next_request()
            body = orjson.dumps({"attempt": attempt, "samples": part})
            reply = transport.post(f"/runs/{run_id}/samples", body, timeout=timeout)
            if reply.kind == "retry":
                return reply
            for _ in part:
                self.waiting.popleft()
            if reply.kind == "ok":
                self.sent += len(part)
                continue
            if reply.status in (404, 401, 403):  # no such endpoint (an older server), run or key
                self.refused = f"the server refuses samples: {reply.error[:200]}"
                n = len(part)
                while self.waiting:  # put() drops what comes after: refused is set
                    self.waiting.popleft()
                    n += 1
                self.drop(n, self.refused)
                return None
            self.drop(len(part), f"the server refused them: {reply.error[:300]}")
        return None
