"""The client's HTTP transport: one POST and its classification, backoff, request bodies, and
sending the spool's oldest batch, acks and final status.

docs/design.md §5: connect errors, timeouts, 408, 429 and 5xx are retried with jittered exponential
backoff from 0.5 s to 30 s, honouring ``Retry-After``; any other 4xx refuses the batch, which
goes to the spool's dead-letter table. A 413 or 422 batch of several records is bisected first, so
one bad record does not take the good ones with it (the server stores nothing of a refused batch).
"""

from __future__ import annotations

import email.utils
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from .schema import MAX_GROUPS_PER_REQUEST, MAX_RECORDS_PER_REQUEST, MAX_REQUEST_BYTES
from .spool import Spool

__all__ = [
    "Backoff",
    "Outage",
    "Reply",
    "Transport",
    "encode_groups",
    "pack_records",
    "bisect_body",
    "create_run",
    "send_acks",
    "send_finish",
    "send_head",
    "server_url_problem",
    "steps_body",
]

log = logging.getLogger("vantage.client")

API = "/api/v1"
RETRY_STATUSES = frozenset({408, 429})
# Room for the ``{"attempt":N,"records":`` wrapper and a server that counts differently.
BODY_BUDGET = MAX_REQUEST_BYTES - 64 * 1024


class Backoff:
    """Jittered exponential backoff: 0.5 s, 1 s, 2 s, ... capped at 30 s, each delay drawn
    uniformly from [d/2, d] so that many clients do not retry in lockstep."""

    def __init__(self, base: float = 0.5, cap: float = 30.0) -> None:
        self.base, self.cap, self.failures = base, cap, 0

    def next_delay(self, retry_after: float | None = None) -> float:
        d = min(self.cap, self.base * 2**self.failures)
        self.failures += 1
        delay = random.uniform(d / 2, d)
        if retry_after is not None:
            # The server knows best; cap it so that a bogus header cannot park the client forever.
            delay = max(delay, min(retry_after, 300.0))
        return delay

    def reset(self) -> None:
        self.failures = 0


def server_url_problem(server: str) -> str | None:
    """Why ``server`` cannot be the server's base URL (None when it can): it must be an
    ``http://`` or ``https://`` URL with a host, such as ``http://127.0.0.1:8000`` (a path is
    a proxy's prefix, but not one ending in /api/v1 or /dashboard)."""
    if isinstance(server, str) and server != server.strip():  # "not found: / /api/v1/runs"
        return f"server {server!r} has spaces around it"
    try:
        url = httpx.URL(server)
    except (httpx.InvalidURL, TypeError) as exc:
        return f"server {server!r} is not a URL ({exc})"
    if url.scheme not in ("http", "https") or not url.host:
        return f"server {server!r} is not an http:// or https:// URL with a host"
    path = url.path.rstrip("/")
    for part in ("/api/v1", "/dashboard"):  # an address copied from a page or the API docs
        if path.endswith(part):  # got a 404 for /api/v1/api/v1/runs, or a 401 to log in
            base = str(url.copy_with(path=path[: -len(part)] or "/", query=None, fragment=None))
            return (
                f"server {server!r} ends in {part}: give the server's base URL, which Vantage "
                f"adds /api/v1/... to ({base.rstrip('/')})"
            )
    return None


class Outage:
    """When to tell the user that the server keeps failing: once a run of consecutive
    failures has lasted ``warn_after_s`` seconds, again every ``repeat_s`` while it lasts, and
    when it ends after a warning. Times are ``time.monotonic()`` seconds."""

    def __init__(self, warn_after_s: float = 15.0, repeat_s: float = 600.0) -> None:
        self.warn_after_s, self.repeat_s = warn_after_s, repeat_s
        self.since: float | None = None  # start of the current run of failures
        self._next_warning = 0.0
        self.warned = False

    def failed(self, now: float) -> float | None:
        """Note a failure; the outage's length so far when it is time to warn, else None."""
        if self.since is None:
            self.since, self._next_warning = now, now + self.warn_after_s
        if now < self._next_warning:
            return None
        self.warned, self._next_warning = True, now + self.repeat_s
        return now - self.since

    def succeeded(self, now: float) -> float | None:
        """Note a success; the outage's length when one was warned about, else None."""
        lasted = None if self.since is None or not self.warned else now - self.since
        self.since, self.warned = None, False
        return lasted


@dataclass
class Reply:
    """What one request came to: ``ok``, ``retry`` (transient) or ``refused`` (permanent)."""

    kind: str
    status: int = 0
    data: dict[str, Any] = field(default_factory=dict)
    retry_after: float | None = None
    error: str = ""


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class Transport:
    """A thin httpx client that classifies every answer; never raises for network trouble."""

    def __init__(self, server: str, api_key: str | None = None, timeout: float = 10.0) -> None:
        headers = {"content-type": "application/json", "user-agent": "vantage-client/0.1"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self.server = server.rstrip("/")
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=self.server,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(3.0, timeout)),
            follow_redirects=False,
        )

    def post(self, path: str, body: bytes, timeout: float | None = None) -> Reply:
        t = self.timeout if timeout is None else max(0.05, min(timeout, self.timeout))
        try:
            resp = self._http.post(
                API + path, content=body, timeout=httpx.Timeout(t, connect=min(3.0, t))
            )
        except httpx.HTTPError as exc:  # connect errors, timeouts, broken connections
            return Reply("retry", error=f"{type(exc).__name__}: {exc}")
        status = resp.status_code
        if status < 300:
            try:
                data = orjson.loads(resp.content) if resp.content else {}
            except orjson.JSONDecodeError:
                data = {}
            return Reply("ok", status, data if isinstance(data, dict) else {})
        text = resp.text[:2000]
        if status in RETRY_STATUSES or status >= 500:
            return Reply(
                "retry",
                status,
                retry_after=_retry_after(resp.headers.get("retry-after")),
                error=f"HTTP {status}: {text}",
            )
        return Reply("refused", status, error=f"HTTP {status}: {text}")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def steps_body(attempt: int, records_json: bytes) -> bytes:
    """The ``POST .../steps`` body around an already encoded records array."""
    return b'{"attempt":%d,"records":%s}' % (attempt, records_json)


def _record_groups(record: dict[str, Any]) -> int:
    return len(record.get("groups") or ())


CHUNK_GROUPS = 500
CHUNK_BYTES = 1 << 20


def encode_groups(
    groups: list[dict[str, Any]], chunk_groups: int = CHUNK_GROUPS
) -> list[tuple[bytes, int]]:
    """Encode groups as JSON fragments (the inside of an array) of at most ``CHUNK_GROUPS``
    groups and about ``CHUNK_BYTES`` bytes, so that requests can be cut between fragments and
    no single encode holds the GIL for long."""
    out: list[tuple[bytes, int]] = []

    def encode(part: list[dict[str, Any]]) -> None:
        enc = orjson.dumps(part)
        if len(enc) > CHUNK_BYTES and len(part) > 1:
            half = len(part) // 2
            encode(part[:half])
            encode(part[half:])
            return
        if len(enc) > BODY_BUDGET // 2:
            raise ValueError(
                f"one group encodes to {len(enc)} bytes, more than a request may carry"
            )
        out.append((enc[1:-1], len(part)))

    for i in range(0, len(groups), chunk_groups):
        encode(groups[i : i + chunk_groups])
    return out


_EXTRAS = ("scalars", "effective")


def pack_records(
    records: list[tuple[dict[str, Any], list[tuple[bytes, int]]]],
    max_groups: int = MAX_GROUPS_PER_REQUEST,
    max_bytes: int = BODY_BUDGET,
    max_records: int = MAX_RECORDS_PER_REQUEST,
) -> list[tuple[bytes, int]]:
    """Pack records (a header such as ``{step, split, rank, ...}`` plus encoded group fragments)
    into request bodies of at most ``max_groups`` groups, ``max_records`` records and
    ``max_bytes`` bytes, in order. A
    record that does not fit is continued in the next request under the same (step, split, rank);
    its scalars and effective statistics stay with the first piece. Returns (records JSON array,
    group count) per request."""
    out: list[tuple[bytes, int]] = []
    cur: list[bytes] = []
    cur_bytes, cur_groups = 2, 0

    def flush() -> None:
        nonlocal cur, cur_bytes, cur_groups
        if cur:
            out.append((b"[" + b",".join(cur) + b"]", cur_groups))
        cur, cur_bytes, cur_groups = [], 2, 0

    for header, chunks in records:
        head = orjson.dumps(header)
        bare = orjson.dumps({k: v for k, v in header.items() if k not in _EXTRAS})
        i = 0
        while True:
            overhead = len(head) + 13  # ',"groups":[' + ']' + the comma between records
            if cur and (cur_bytes + overhead > max_bytes or len(cur) >= max_records):
                flush()
            take: list[bytes] = []
            size, n_take = overhead, 0
            while i < len(chunks):
                chunk, n = chunks[i]
                if (
                    cur_groups + n_take + n > max_groups
                    or cur_bytes + size + len(chunk) + 1 > max_bytes
                ):
                    if take or not cur:
                        break
                    flush()  # nothing taken yet: start a fresh request and try again
                    continue
                take.append(chunk)
                size += len(chunk) + 1
                n_take += n
                i += 1
            if not take and i < len(chunks):  # cannot happen: fragments are below the limits
                raise ValueError("a group fragment is larger than a request may carry")
            cur.append(head[:-1] + b',"groups":[' + b",".join(take) + b"]}")
            cur_bytes += size
            cur_groups += n_take
            if i >= len(chunks):
                break
            flush()
            head = bare
    flush()
    return out


def bisect_body(body: bytes) -> list[tuple[bytes, int]] | None:
    """Split a refused batch of several records into two halves; None for a single record."""
    records = orjson.loads(body)
    if len(records) < 2:
        return None
    half = len(records) // 2
    return [
        (orjson.dumps(part), sum(_record_groups(r) for r in part))
        for part in (records[:half], records[half:])
    ]


def create_run(
    transport: Transport, run_body: dict[str, Any], timeout: float | None = None
) -> Reply:
    return transport.post("/runs", orjson.dumps(run_body), timeout=timeout)


def send_head(
    spool: Spool, transport: Transport, run_id: str, attempt: int, timeout: float | None = None
) -> tuple[str, Reply | None]:
    """Send the spool's oldest batch. Returns (outcome, reply): ``empty``, ``sent``, ``split``,
    ``dead`` (moved to dead letters), ``retry`` or ``unknown_run`` (404/409: create the run
    again, then resend)."""
    row = spool.head()
    if row is None:
        return "empty", None
    reply = transport.post(f"/runs/{run_id}/steps", steps_body(attempt, row.body), timeout=timeout)
    if reply.kind == "ok":
        spool.delete(row)
        return "sent", reply
    if reply.kind == "retry" or reply.status in (401, 403):
        # 401/403 refuse the key (revoked mid-run, or without the ingest scope), not the batch:
        # it stays in the spool and is sent again, here or by `vantage sync --api-key`, instead
        # of becoming a dead letter that nothing resends
        return "retry", reply
    if reply.status in (404, 409):
        # The run or the attempt is unknown (a server whose database was replaced): create the
        # run again and resend, rather than throwing the data away.
        return "unknown_run", reply
    if reply.status in (413, 422):
        halves = bisect_body(row.body)
        if halves is not None:
            spool.replace_head(row, halves)
            return "split", reply
    log.warning(
        "vantage: the server refused a batch of %d groups (%s); kept in the spool's "
        "dead-letter table",
        row.n_groups,
        reply.error,
    )
    spool.dead_letter(row, reply.status, reply.error)
    return "dead", reply


def send_acks(
    spool: Spool, transport: Transport, run_id: str, timeout: float | None = None
) -> Reply | None:
    """Send pending command acknowledgements in order; returns the first failed reply."""
    for ack_id, command_id, body in spool.acks():
        reply = transport.post(f"/runs/{run_id}/commands/{command_id}/ack", body, timeout=timeout)
        if reply.kind == "retry":
            return reply
        if reply.kind == "refused":
            log.warning(
                "vantage: acknowledgement of command %s refused (%s)", command_id, reply.error
            )
        spool.delete_ack(ack_id)
    return None


def send_finish(
    transport: Transport, run_id: str, status: str, timeout: float, attempt: int | None = None
) -> Reply:
    """Mark the run ``status`` (``finished``/``failed``) as ``attempt`` (the server refuses an
    attempt that a newer launch has superseded)."""
    body = {"status": status} if attempt is None else {"status": status, "attempt": attempt}
    return transport.post(f"/runs/{run_id}/finish", orjson.dumps(body), timeout)
