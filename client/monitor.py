"""``Monitor``: the hook that lives inside a training loop (DESIGN.md §5).

The training thread only converts its inputs to Python lists and appends them to a bounded
in-memory queue (O(1), no lock held for long, no I/O). A background thread does everything else:
it batches the queue (every second or every 1,000 groups), encodes with orjson, writes each batch
to the on-disk spool (SQLite, WAL), sends the spool in order, retries with backoff, keeps refused
batches in a dead-letter table, sends heartbeats with the spool and drop counters, and takes the
run's commands out of every answer.

    mon = Monitor("http://127.0.0.1:8000", api_key, run_name="qwen-grpo", config={...})
    mon.log_groups(step, rewards)                 # rewards: [P, G] tensor, ndarray or lists
    for cmd in mon.poll_commands():
        ...                                       # apply at the step boundary, then
        mon.ack(cmd.command_id, "applied", step)
    mon.close()
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import re
import reprlib
import shlex
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from . import checks
from .inputs import (
    capture,
    check_mask_width,
    check_width,
    float_rewards,
    grouped,
    mask_row,
    materialize,
    plain_rewards,
)
from .launch import derive_launch_id, torch_distributed
from .schema import (
    BIDI_CONTROLS,
    MAX_COUNT,
    MAX_GROUP_SIZE,
    MAX_GROUPS_PER_REQUEST,
    MAX_SCALARS_PER_RECORD,
    RunCreate,
    errors_in_one_line,
    storable_scalar,
)
from .sender import (
    Backoff,
    Outage,
    Reply,
    Transport,
    create_run,
    encode_groups,
    pack_records,
    send_acks,
    send_finish,
    send_head,
    server_url_problem,
)
from .spool import SPOOL_SUFFIX, Spool, SpoolInUse

__all__ = ["Command", "Monitor", "derive_launch_id"]

log = logging.getLogger("vantage.client")
_DIGITS = re.compile(r"\d+")
_UNSENDABLE = BIDI_CONTROLS | {"\x00"}  # characters an ack's detail may not carry


def _sendable(c: str) -> bool:
    """Whether an ack's detail may carry ``c``: not NUL, a bidi control or a lone surrogate."""
    return c not in _UNSENDABLE and not "\ud800" <= c <= "\udfff"


BATCH_GROUPS = 1_000
# While closing, retries come at least this often (seconds): a server back 5 s into a close
# was found only by the next retry of the backoff, 16 s later (a trial).
CLOSING_RETRY_S = 2.0
EXIT_SPOOL_S = 10.0  # at interpreter exit, how long the sender may take to spool the rest
BATCH_INTERVAL_S = 1.0
# A server that keeps failing is reported once it has failed for this long, then every
# OUTAGE_REPEAT_S while it lasts (seconds).
OUTAGE_WARN_S = 15.0
OUTAGE_REPEAT_S = 600.0


@dataclass(frozen=True)
class Command:
    """A command from the server (DESIGN.md §4): ``type`` is ``set_mitigation``,
    ``set_sampling``, ``checkpoint`` or ``stop``; ``params`` its flat parameters."""

    command_id: str
    type: str
    params: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def _uncaught_error() -> BaseException | None:
    """The exception that is ending the program, as Python keeps it for an uncaught one
    (``sys.last_exc``, ``sys.last_value`` before 3.12) until the exit handlers have run; None
    in an interactive session, where it may be any earlier mistake the session went on after.
    A ``sys.exit(n)`` leaves nothing there: its status cannot be seen from an exit handler."""
    if hasattr(sys, "ps1") or sys.flags.interactive or _in_ipython():
        return None
    return getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)


def _in_ipython() -> bool:
    """Whether an IPython shell or Jupyter kernel runs this process (a library may import
    IPython in a plain script: tqdm.auto does)."""
    ipython = sys.modules.get("IPython")
    try:
        return ipython is not None and ipython.get_ipython() is not None
    except Exception:  # noqa: BLE001 - an IPython too old or half imported: a plain script
        return False


def _default_spool_dir() -> Path:
    env = os.environ.get("VANTAGE_SPOOL_DIR")
    if env:
        return Path(env)
    import platformdirs  # noqa: PLC0415 (only needed here)

    return Path(platformdirs.user_cache_dir("vantage")) / "spool"


def _safe(text: str, limit: int = 40) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:limit]


def _run_id_of(launch_id: str, run_name: Any, project: Any) -> str:
    """The run id every rank of a launch derives alike: a UUID (version 5) of the launch id,
    the run's name and its project."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"vantage:{project}/{run_name}/{launch_id}"))


def _pack_or_drop(records: dict[Any, Any], spool: Any) -> list[tuple[bytes, int]]:
    """Request bodies for the records; a record that cannot be encoded is dropped and counted,
    never the batch around it."""
    try:
        return pack_records(list(records.values()))
    except (TypeError, ValueError):
        pass
    good = []
    for header, chunks in records.values():
        try:
            pack_records([(header, chunks)])
        except (TypeError, ValueError) as exc:
            lost = sum(n for _, n in chunks)
            log.warning(
                "vantage: step %s could not be encoded (%s); dropped %d groups",
                header.get("step"),
                exc,
                lost,
            )
            spool.count_dropped(lost)
            continue
        good.append((header, chunks))
    return pack_records(good) if good else []


class Monitor:
    """Sends a GRPO run's reward groups, effective statistics and scalars to a Vantage server and
    carries its commands back, without ever blocking the training thread.

    ``rank`` and ``world_size`` default to ``torch.distributed``'s when a process group is up, else
    to ``RANK``/``WORLD_SIZE``, else 0 and 1. ``spool_dir`` defaults to ``VANTAGE_SPOOL_DIR`` or a
    user cache folder. ``server=None`` (and no ``VANTAGE_SERVER``) records to the spool only, for a
    later ``vantage sync``; so does a ``server`` that is not an ``http(s)://`` URL with a host,
    which is logged at once (``strict=True`` raises ValueError instead). A server that keeps
    failing is logged after ``OUTAGE_WARN_S`` (15 s), then every 10 minutes, and when it answers
    again. ``spool_max_bytes`` caps the spool; groups beyond it are dropped and counted.
    ``max_queue_groups`` caps the in-memory queue the same way.
    """

    def __init__(
        self,
        server: str | None = None,
        api_key: str | None = None,
        run_name: str = "run",
        run_id: str | None = None,
        launch_id: str | None = None,
        project: str | None = None,
        config: Mapping[str, Any] | None = None,
        reward_min: float = 0.0,
        reward_max: float = 1.0,
        trainer_eps: float = 1e-4,
        rank: int | None = None,
        world_size: int | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
        heartbeat_s: float = 10.0,
        *,
        group_size: int | None = None,
        tags: Iterable[str] = (),
        spool_max_bytes: int = 1 << 30,
        max_queue_groups: int = 1_000_000,
        batch_groups: int = BATCH_GROUPS,
        batch_interval_s: float = BATCH_INTERVAL_S,
        request_timeout_s: float = 10.0,
        strict: bool = False,
    ) -> None:
        self.server = server or os.environ.get("VANTAGE_SERVER") or None
        # A server URL that can never work (no scheme, say): recorded to the spool only.
        self._unusable = server_url_problem(self.server) if self.server else None
        if self._unusable and strict:
            raise ValueError(self._unusable)
        api_key = api_key or os.environ.get("VANTAGE_API_KEY") or None
        dist = torch_distributed()
        if rank is None:
            rank = dist.get_rank() if dist is not None else int(os.environ.get("RANK", 0))
        if world_size is None:
            world_size = (
                dist.get_world_size() if dist is not None else int(os.environ.get("WORLD_SIZE", 1))
            )
        self.rank, self.world_size = int(rank), int(world_size)
        self.launch_id = derive_launch_id(launch_id)
        # Without a run_id, the ranks of one launch meet in one run: its id follows from the
        # launch, name and project (two ranks with the same launch_id but no run_id were two
        # runs of half the groups each: a trial). A launch id of its own is a fresh UUID.
        if run_id is not None and not str(run_id):  # it was taken for "no run_id": a trial
            raise ValueError("Monitor: run_id is empty; give an id, or None for a new one")
        self.run_id = str(run_id) if run_id else _run_id_of(self.launch_id, run_name, project)
        self.attempt: int | None = None
        self.heartbeat_s = float(heartbeat_s)
        # Plain JSON only: whatever the user put in config is stringified rather than refused;
        # a config the server would refuse (too large, say) is left out rather than the run.
        try:
            config_json = checks.config_json(config)
        except ValueError as exc:
            if strict:
                raise
            log.warning("vantage: the run's config is not sent (config %s)", exc)
            config_json = {"vantage": f"config not sent (config {exc})"}
        if not isinstance(run_name, str):  # the server needs a new run's name
            raise TypeError(f"Monitor: run_name must be text, not {run_name!r}")
        try:
            if group_size is not None and not isinstance(group_size, bool | str):
                # as log_groups takes it: 4.0 is 4 (it was "not a valid integer", a trial)
                group_size = checks.count("group_size", group_size, MAX_GROUP_SIZE, low=1)
            run = RunCreate(
                run_id=self.run_id,
                launch_id=self.launch_id,
                started_at=time.time(),  # kept in the spool: a late `vantage sync` says it too
                name=run_name,
                project=project,
                config=config_json,
                reward_min=reward_min,
                reward_max=reward_max,
                group_size=group_size,
                trainer_eps=trainer_eps,
                world_size=self.world_size,
                heartbeat_s=heartbeat_s,
                tags=[tags] if isinstance(tags, str) else list(tags),  # "a" is one tag
            )
        except ValidationError as exc:  # one line per bad argument, not pydantic's model dump
            raise ValueError(f"Monitor: {errors_in_one_line(exc)}") from None
        self._run_body = run.model_dump(exclude_none=True)
        self.group_size: int | None = run.group_size  # splits flat rewards into groups
        checks.rank_in(self.rank, self.world_size)  # every record of this rank would be refused

        self._batch_groups = int(batch_groups)
        self._batch_interval = float(batch_interval_s)
        self._max_queue_groups = int(max_queue_groups)
        for name, value in (("batch_groups", self._batch_groups),
                            ("batch_interval_s", self._batch_interval),
                            ("max_queue_groups", self._max_queue_groups),
                            # a negative timeout failed in the sender thread: a trial
                            ("request_timeout_s", float(request_timeout_s)),
                            ("spool_max_bytes", float(spool_max_bytes))):  # fmt: skip
            if not value > 0:  # NaN too; batch_groups=0 was taken and ignored: a trial
                raise ValueError(f"Monitor: {name} must be above 0, not {value}")
        self._queue: deque[tuple[Any, ...]] = deque()
        self._enqueued = 0
        self._dequeued = 0
        self._final_lock = threading.Lock()
        self._queue_dropped = 0
        self._group_counters: dict[tuple[int, str, int], int] = {}
        self._warnings: dict[str, int] = {}  # warnings of each kind so far (`_warn`)
        self._splits: set[str] = set()  # split names that passed `checks.split_name`

        self._commands: deque[Command] = deque()
        self._seen_commands: set[str] = set()
        self._callbacks: list[Callable[[Command], Any]] = []
        self._pending_acks: deque[tuple[str, dict[str, Any]]] = deque()

        # Off (default): a log_* call with bad input is logged and skipped, never raised into
        # the training loop. On: it raises at once (for development and tests); the server's
        # answers (a refused key, say) come later, in the background, and are logged.
        self.strict = bool(strict)
        self.stats: dict[str, int] = {
            "rejected_calls": 0,
            "sent_batches": 0,
            "sent_groups": 0,
            "accepted": 0,
            "duplicates": 0,
            "conflicts": 0,
            "invalid_groups": 0,
            "retries": 0,
        }
        self.last_error: str | None = None
        self.last_steps: list[dict[str, Any]] = []

        folder = Path(spool_dir) if spool_dir is not None else _default_spool_dir()
        name = f"{_safe(self.run_id, 64)}.{_safe(self.launch_id)}.r{self.rank}{SPOOL_SUFFIX}"
        try:
            try:
                self._spool = Spool(folder / name, max_bytes=spool_max_bytes)
            except SpoolInUse:  # another Monitor of this run, launch and rank, or a sync of it
                alone = f"{name[: -len(SPOOL_SUFFIX)]}.{uuid.uuid4().hex[:8]}{SPOOL_SUFFIX}"
                log.warning(
                    "vantage: spool %s is in use by another Monitor of this run, launch and "
                    "rank; using %s. If both send the same steps, the first write wins and the "
                    "other's groups are refused as conflicts: give each process its own rank or "
                    "launch_id",
                    folder / name,
                    alone,
                )
                name = alone
                self._spool = Spool(folder / name, max_bytes=spool_max_bytes)
        except (OSError, Exception) as exc:  # an unwritable folder must not stop training
            fallback = Path(tempfile.gettempdir()) / "vantage-spool"
            log.warning("vantage: cannot use spool folder %s (%s); using %s", folder, exc, fallback)
            self._spool = Spool(fallback / name, max_bytes=spool_max_bytes)
        self._spool.set_meta("run", self._run_body)
        self._spool.set_meta("rank", self.rank)  # `vantage sync` reports this rank's health
        self.spool_path = self._spool.path

        if self._unusable:
            log.error(
                "vantage: %s; recording to the spool %s only (upload later with `vantage sync`)",
                self._unusable,
                self.spool_path,
            )
        elif not self.server:  # offline on purpose, or a forgotten VANTAGE_SERVER: say which
            log.warning(
                "vantage: no server (server=None and no VANTAGE_SERVER); recording to the spool "
                "%s only (upload later with `vantage sync`)",
                self.spool_path,
            )
        usable = self.server and not self._unusable
        self._transport = Transport(self.server, api_key, request_timeout_s) if usable else None
        self._outage = Outage(OUTAGE_WARN_S, OUTAGE_REPEAT_S)
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._force_drain = False
        self._draining = False
        self._deadline = float("inf")
        self._finish_status: str | None = None
        self._finish_sent = False  # the server confirmed the run's end (set by the sender)
        self._told_newest: int | None = None  # the newer attempt a warning named
        self._closed = False
        self._abandon = False
        self._progress = False
        self._refused: str | None = None  # run creation refused: stop talking to the server
        self._key_refused: str | None = None  # the last batch's 401/403, until one is taken
        self._thread = threading.Thread(target=self._run, name="vantage-sender", daemon=True)
        self._thread.start()
        self._error_before = _uncaught_error()  # an error from before this run ended nothing
        self._pid = os.getpid()  # a forked child inherits the exit hook, not the sender
        ref = weakref.ref(self)
        self._atexit = lambda: (m := ref()) is not None and m._at_exit()
        atexit.register(self._atexit)

    # ------------------------------------------------------------------ training-thread API
    def _enqueue(self, item: tuple[Any, ...], n_groups: int) -> bool:
        # No lock: deque.append is atomic, and each counter has one writer (this thread writes
        # _enqueued and _queue_dropped, the sender _dequeued), so the training thread never
        # waits on the sender.
        queued = self._enqueued - self._dequeued
        if queued + n_groups > self._max_queue_groups:
            self._queue_dropped += n_groups
            self._warn(
                "queue_full",
                "vantage: %s groups dropped: the queue already holds %s groups and takes at "
                "most max_queue_groups=%s (%s dropped so far): the sender cannot keep up, or "
                "its spool is full",
                f"{n_groups:,}",
                f"{queued:,}",
                f"{self._max_queue_groups:,}",
                f"{self._queue_dropped:,}",
            )
            return False
        self._queue.append(item)
        self._enqueued += n_groups
        if queued + n_groups >= self._batch_groups and not self._wake.is_set():
            self._wake.set()
        return True

    def _reject(self, what: str, exc: Exception) -> None:
        if self.strict:
            raise exc
        self.stats["rejected_calls"] += 1
        kind = _kind(what.split("(")[0], exc)
        said = str(exc) if len(str(exc)) <= 300 else str(exc)[:300] + "…"  # 10**400 has 401 digits
        self._warn(kind, "vantage: %s ignored (%s: %s)", what, type(exc).__name__, said)

    def _warn(self, kind: str, message: str, *args: Any) -> None:
        """Log a warning of ``kind``: the first 5 of each kind, then every 1,000th, so that a
        bad call in a training loop never floods its log (every rejected call is counted in
        ``stats['rejected_calls']``)."""
        n = self._warnings[kind] = self._warnings.get(kind, 0) + 1
        if n <= 5 or n % 1000 == 0:
            quiet = "; from now on only every 1,000th of this kind is logged" if n == 5 else ""
            log.warning(f"{message} [warning %s of this kind{quiet}]", *args, f"{n:,}")

    def log_groups(self, step: int, rewards: Any, *args: Any, **kwargs: Any) -> None:
        """Bad input is logged and skipped (raised when ``strict``); the call never blocks."""
        try:
            self._log_groups(step, rewards, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a bad call never stops training
            self._reject(f"log_groups(step={step!r})", exc)

    def _log_groups(
        self,
        step: int,
        rewards: Any,
        group_ids: Iterable[str | int] | None = None,
        mask: Any = None,
        prompt_ids: Iterable[str | int] | None = None,
        split: str = "train",
        rank: int | None = None,
        group_size: int | None = None,
    ) -> None:
        """Queue one reward list per group for ``step``: ``rewards`` is [P, G] (tensor, ndarray,
        nested lists; ragged rows allowed), or P·G flat values prompt by prompt (TRL's layout)
        split into groups of ``group_size`` (default: the Monitor's ``group_size``); ``mask``
        likewise. Without ``group_ids`` the groups are numbered by a counter per (step, split,
        rank) that continues across calls. Never blocks; when the queue is full the groups are
        dropped and counted."""
        step, split, rank = self._where(step, split, rank)
        if group_size is not None:  # 4.0 is 4; a float left in split nothing (a trial)
            group_size = checks.count("group_size", group_size, MAX_GROUP_SIZE, low=1)
        size = group_size or self.group_size
        rows, p = capture(grouped(rewards, size, "rewards"), "rewards")
        if p == 0:
            return
        if group_size is not None:  # the call's own: rows that contradict it are refused
            check_width(rows, group_size, "rewards")
        ids = None
        start = 0
        if group_ids is not None:
            ids = checks.identifiers("group_id", group_ids, p)
        else:
            key = (int(step), split, rank)
            start = self._group_counters.get(key, 0)
            self._group_counters[key] = start + p
            if len(self._group_counters) > 4096:  # keep the recent steps only
                for old in list(self._group_counters)[:2048]:
                    del self._group_counters[old]
        masks = None
        if mask is not None:
            masks, n_mask = capture(grouped(mask, size, "mask"), "mask")
            if n_mask != p:
                raise ValueError(f"mask has {n_mask} rows for {p} groups")
            check_mask_width(rows, masks)
        prompts = None if prompt_ids is None else checks.identifiers("prompt_id", prompt_ids, p)
        item = ("g", step, split, rank, time.time(), p, rows, start, ids, masks, prompts)
        if self.strict:  # unreadable rewards raise here, in the caller, not in the background
            self._encode_item(item)
        self._enqueue(item, p)

    def log_effective(self, step: int, *args: Any, **kwargs: Any) -> None:
        """Bad input is logged and skipped (raised when ``strict``); the call never blocks."""
        try:
            self._log_effective(step, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a bad call never stops training
            self._reject(f"log_effective(step={step!r})", exc)

    def _log_effective(
        self,
        step: int,
        n_valid: int,
        n_zero_advantage: int,
        n_virtual: int = 0,
        split: str = "train",
        rank: int | None = None,
        mitigation: Mapping[str, Any] | None = None,
    ) -> None:
        """Queue the trainer's statistics after mitigation (feeds ``acr_effective``): n_valid,
        n_zero_advantage (≤ n_valid), n_virtual, and optionally ``mitigation``, the mitigation
        in effect (``{"mode": "avspo", ...}``: the run's reported mitigation on the server). A
        rank's first report of a step counts."""
        step, split, rank = self._where(step, split, rank)
        top = MAX_COUNT
        eff = {
            "n_valid": checks.count("n_valid", n_valid, top),
            "n_zero_advantage": checks.count("n_zero_advantage", n_zero_advantage, top),
            "n_virtual": checks.count("n_virtual", n_virtual, top),
        }
        if eff["n_zero_advantage"] > eff["n_valid"]:
            raise ValueError(
                f"n_zero_advantage {eff['n_zero_advantage']} exceeds n_valid {eff['n_valid']}"
            )
        if mitigation is not None:  # plain JSON, as the server stores it
            mitigation = checks.mitigation_json(mitigation)
        self._enqueue(("e", step, split, rank, time.time(), 0, eff, mitigation), 0)

    def log_scalars(self, step: int, scalars: Any, *args: Any, **kwargs: Any) -> None:
        """Bad input is logged and skipped (raised when ``strict``): a scalar whose name the
        server would refuse is skipped alone, a value that is no number when the sender reads
        it. The call never blocks."""
        try:
            self._log_scalars(step, scalars, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a bad call never stops training
            self._reject(f"log_scalars(step={step!r})", exc)

    def _log_scalars(
        self, step: int, scalars: Mapping[str, Any], split: str = "train", rank: int | None = None
    ) -> None:
        """Queue named numbers for ``step`` (loss, kl, ...); tensors are converted off-thread
        (in the call when ``strict``, so that a value that is no number raises here)."""
        step, split, rank = self._where(step, split, rank)
        named = {}
        for name, value in checks.scalars_map(scalars).items():
            try:  # a bad name or a text value costs its scalar alone
                text = checks.scalar_name(name)
                checks.refuse_text(text, value)
            except (ValueError, TypeError) as exc:
                self._reject(f"log_scalars(step={step}) scalar", exc)
                continue
            if hasattr(value, "detach"):  # a tensor: not its autograd graph (torch warned
                value = value.detach()  # when float() read one with requires_grad: a trial)
            named[text] = checks.scalar_value(text, value) if self.strict else value
        if named:
            self._enqueue(("s", step, split, rank, time.time(), 0, named), 0)

    def _where(self, step: Any, split: Any, rank: Any) -> tuple[int, str, int]:
        """A call's (step, split, rank), checked as the server checks a record's."""
        if self._closed:
            raise ValueError("the monitor is closed: nothing logged after close() is sent")
        if type(split) is not str or split not in self._splits:  # each name is checked once
            self._splits.add(checks.split_name(split))
        rank = self.rank if rank is None else checks.rank_in(rank, self.world_size)
        return checks.count("step", step), split, rank

    def poll_commands(self) -> list[Command]:
        """Commands received since the last poll, each once (de-duplicated by ``command_id``)."""
        out = []
        while self._commands:
            out.append(self._commands.popleft())
        return out

    def on_command(self, callback: Callable[[Command], Any]) -> None:
        """Call ``callback(command)`` once per new command, from the background thread (keep it
        short: record the command and apply it at the next step boundary)."""
        self._callbacks.append(callback)

    def ack(
        self, command_id: str, status: str, step: int | None, detail: str | None = None
    ) -> None:
        """Acknowledge a command: ``status`` is ``applied`` or ``rejected``, ``step`` the step at
        which it took effect. Delivered in the background (and kept in the spool until it is)."""
        what = f"ack({command_id!r})"
        if self._closed:
            return self._reject(what, ValueError("the monitor is closed: nothing is sent after it"))
        if status not in ("applied", "rejected"):
            exc = ValueError(f"status must be 'applied' or 'rejected', not {status!r}")
            return self._reject(what, exc)
        try:
            step = None if step is None else checks.count("step", step)
        except (TypeError, ValueError) as exc:
            return self._reject(what, exc)
        body: dict[str, Any] = {"status": status, "step": step}
        if detail is not None:  # what the server refuses, or JSON cannot carry, lost the ack
            body["detail"] = "".join(c for c in str(detail) if _sendable(c))[:2000]
        self._pending_acks.append((str(command_id), body))
        self._wake.set()

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Send everything queued so far (retrying at once, not after the current backoff) and
        wait until the server has it; True when it has. ``timeout``: seconds, as `close`'s."""
        end = time.monotonic() + _seconds(timeout)
        self._force_drain = True
        self._wake.set()
        while time.monotonic() < end:
            if self._idle():
                return True
            if not self._thread.is_alive():
                return False
            time.sleep(0.01)
        return self._idle()

    def close(self, timeout: float | None = 30.0, status: str | None = "finished") -> None:
        """Wake the sender (cancelling any backoff wait), send the queue, replay the spool and
        return when the server has everything or ``timeout`` has passed; what is left stays in
        the spool. Rank 0 then marks the run ``status`` (``finished``/``failed``; None: neither).
        ``timeout``: seconds; 0 or less (or NaN) spools at once, None or ``math.inf`` waits as
        long as it takes. A bad argument is logged (raised when ``strict``) and the monitor
        closes all the same: the default timeout, the run left unmarked."""
        if self._closed:
            return
        try:
            timeout = _seconds(timeout)
        except (TypeError, ValueError):
            said = f"close(timeout=...) takes seconds or None, not {timeout!r}"
            self._bad_close(TypeError(said), "closing with the default timeout of 30 s")
            timeout = 30.0
        if status not in ("finished", "failed", None):  # the run would stay `running` silently
            said = f"close(status=...) takes 'finished', 'failed' or None, not {status!r}"
            then = "closing without marking the run (it shows as stale once heartbeats stop)"
            self._bad_close(ValueError(said), then)
            status = None
        self._closed = True
        self._deadline = time.monotonic() + timeout
        self._finish_status = status if self.rank == 0 else None
        self._closing.set()
        self._wake.set()
        self._thread.join(max(0.0, timeout - 0.2))
        # If the sender is still busy (a request that started before close(), or a very long
        # queue), move what we can of the queue to the spool ourselves within the time left, so
        # that it survives the process; the sender goes on with the rest while the process lives.
        if self._thread.is_alive() and self._final_lock.acquire(timeout=0.05):
            try:
                end = time.monotonic() + 0.1
                while self._queue and time.monotonic() < end and not self._spool.closed:
                    self._drain(limit=1_000)
            except Exception:
                log.exception("vantage: could not spool the queue at close")
            finally:
                self._final_lock.release()
        self._warn_left(timeout)

    def _warn_left(self, timeout: float) -> None:
        """Say at close how many groups the server has not confirmed, where they are (the
        spool; the queue, which the sender goes on spooling while the process lives) and why."""
        try:
            spooled = self.spooled_groups
        except Exception:  # noqa: BLE001 - the spool may already be closed by the sender
            spooled = 0
        queued = self._queued
        if not spooled and not queued:
            self._warn_end_left(timeout)
            return
        where = f"{spooled} in the spool {self.spool_path}"
        if queued:  # a close(timeout=0) left most of them here (a trial counted only the spool)
            where += f", {queued} still queued in memory, spooled before the process ends"
        alive = self._thread.is_alive()
        meanwhile = "the sender goes on while this process lives; " if alive else ""
        log.warning(
            "vantage: %d group(s) are not on the server yet (%s): %s; %swhat is left when the "
            "process ends can be uploaded with: vantage sync %s --server %s --api-key KEY",
            spooled + queued,
            where,
            self._why_left(timeout),
            meanwhile,
            shlex.quote(str(self.spool_path)),  # this run's file, not the shared folder
            shlex.quote(self.server) if self.server and not self._unusable else "URL",
        )

    def _warn_end_left(self, timeout: float) -> None:
        """Say at close that the run's end has not reached the server though every group has:
        close was silent, and the run stayed `running` (then stale) on the server."""
        status = self._finish_status
        alive = self._thread.is_alive()
        if status is None or self._finish_sent or not (alive or self._spool.pending_finish):
            return
        meanwhile = "the sender goes on while this process lives; " if alive else ""
        try:
            dropped = self.dropped_groups
        except Exception:  # noqa: BLE001 - the spool may already be closed by the sender
            dropped = 0
        # with drops, "every group is on the server" was said of a server never reached: a trial
        sent = (
            f"no group is left to send ({dropped:,} were dropped, as said above)"
            if dropped
            else "every group is on the server"
        )
        log.warning(
            "vantage: %s, but the run's end (%s) is not on the server yet: %s; "
            "%sit is kept in the spool %s, and vantage sync %s --server %s --api-key KEY sends it",
            sent,
            status,
            self._why_left(timeout).replace("confirmed them", "confirmed it"),
            meanwhile,
            self.spool_path,
            shlex.quote(str(self.spool_path)),
            shlex.quote(self.server) if self.server and not self._unusable else "URL",
        )

    def _bad_close(self, exc: Exception, then: str) -> None:
        """A bad argument to close(): raised when ``strict``; else said, with what close does
        instead (it still closes: the data is what matters at the end of a run)."""
        if self.strict:
            raise exc
        self.stats["rejected_calls"] += 1
        log.warning("vantage: %s; %s", exc, then)

    def _why_left(self, timeout: float) -> str:
        """Why groups stay in the spool at close, for the warning: the server refused the run
        (a wrong key, say), or did not confirm them within close's ``timeout`` (seconds; with
        its last error, which may be older than the close), or no server."""
        if not self.server:
            return "no server"
        if self._unusable:
            return self._unusable
        if self._refused is not None:
            return f"server {self.server} refused the run: {self._refused}"
        if self._key_refused is not None:
            return f"server {self.server} refuses the API key: {self._key_refused}"
        said = (
            f"server {self.server} had not confirmed them when close's timeout "
            f"({timeout:g} s) passed"
        )
        if not self.last_error:  # nothing failed: close's time ran out (a timeout of 0, say)
            return said
        return f"{said}; its last error: {self.last_error}"

    def _at_exit(self) -> None:
        """Interpreter exit: close if the user did not (the run marked ``failed`` when an
        uncaught exception, Ctrl-C's included, ends the program, else ``finished``); give a
        sender still at work up to EXIT_SPOOL_S to move what is left to the spool (local disk:
        past close's deadline it makes no more requests), then stop it before the interpreter
        tears down under it (what it has not spooled by then is lost with the process). A
        close(timeout=0) just before exit lost a fifth of 12,000 groups, abandoned
        mid-spooling (a trial). A sender waiting on a request cannot spool: this thread moves
        the queue, and rank 0's final status, to the spool itself (a server that took 30 s to
        answer lost 7,000 of 12,000 groups and the run's end: a trial). In a forked child
        it does nothing: the parent's sender has the data (a child's exit warned of groups
        "not on the server yet", and could have sent the run's end)."""
        if os.getpid() != self._pid:
            return
        if not self._closed:
            error = _uncaught_error()
            ended_by_error = error is not None and error is not self._error_before
            self.close(timeout=10.0, status="failed" if ended_by_error else "finished")
        if self._thread.is_alive():
            self._spool_rest()
        self._thread.join(EXIT_SPOOL_S)
        if self._thread.is_alive():
            self._spool_rest(with_finish=True)
            self._abandon = True
            self._wake.set()
            self._thread.join(2.0)

    def _a_run_to_end(self) -> bool:
        """Whether there is a run for `vantage sync` to mark ended: one the server registered,
        or one the spool will register (it holds batches, or drops it keeps the file for: a
        spool of nothing but unreadable groups left its run `running` after sync, a trial)."""
        return bool(self.attempt or not self._spool.empty or self._spool.dropped_groups)

    def _spool_rest(self, with_finish: bool = False) -> None:
        """Move the queue to the spool from this thread (and, ``with_finish``, keep rank 0's
        final status there for `vantage sync`), unless the sender is doing its own final
        spooling (it holds the lock) or has closed the spool."""
        if not self._final_lock.acquire(timeout=1.0):
            return
        try:
            if self._spool.closed:
                return
            self._drain(limit=None)
            if with_finish and self._finish_status and self._a_run_to_end():
                self._spool.keep_finish(self._finish_status)
        except Exception:  # noqa: BLE001 - at exit: say it, never raise
            log.exception("vantage: could not spool the queue at exit")
        finally:
            self._final_lock.release()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        """Close, with the run marked ``failed`` when an exception ends the block (a
        ``sys.exit(n)`` with n other than 0 or None included), else ``finished``."""
        clean = exc_type is None or (isinstance(exc, SystemExit) and exc.code in (0, None))
        self.close(status="finished" if clean else "failed")

    # ------------------------------------------------------------------ counters
    @property
    def _queued(self) -> int:
        return max(0, self._enqueued - self._dequeued)

    @property
    def dropped_groups(self) -> int:
        return self._queue_dropped + self._spool.dropped_groups

    @property
    def spooled_groups(self) -> int:
        return self._spool.pending_groups

    @property
    def dead_letter_batches(self) -> int:
        return self._spool.dead_letter_batches

    def _idle(self) -> bool:
        return (
            not self._queue
            and not self._pending_acks
            and self._spool.pending_batches == 0
            and not self._force_drain
            and not self._draining
            and (
                self._transport is None or self._refused is not None or not self._spool.pending_acks
            )
        )

    # ------------------------------------------------------------------ sender thread
    def _drain(self, limit: int | None = MAX_GROUPS_PER_REQUEST) -> None:
        """Queue → records (one per (step, split, rank), first-appearance order) → spool.

        Runs on the sender thread; it yields the GIL between queue items so that a training
        thread calling ``log_*`` never waits long for it."""
        items = []
        taken = 0
        # At most about one request's worth per call, so that sending interleaves with encoding
        # when the trainer produces faster than the server ingests.
        while limit is None or taken < limit:
            try:
                item = self._queue.popleft()
            except IndexError:
                break
            items.append(item)
            self._dequeued += item[5]
            taken += item[5]
        while self._pending_acks:
            command_id, body = self._pending_acks.popleft()
            self._spool.add_ack(command_id, body)
        if not items:
            return
        records: dict[tuple[int, str, int], tuple[dict[str, Any], list[tuple[bytes, int]]]] = {}
        dropped = 0
        for index, item in enumerate(items):
            if self._abandon:
                dropped += sum(it[5] for it in items[index:])
                break
            kind, step, split, rank, t = item[:5]
            rec = records.get((step, split, rank))
            if rec is None:
                header = {
                    "step": step,
                    "split": split,
                    "rank": rank,
                    "world_size": self.world_size,
                    "time": t,
                }
                rec = records[(step, split, rank)] = (header, [])
            header, chunks = rec
            if kind == "g":
                try:
                    chunks.extend(self._encode_item(item))
                except Exception as exc:  # noqa: BLE001 - one bad call must not cost the others
                    self._warn(
                        _kind("rewards", exc),
                        "vantage: step %s: rewards could not be read (%s: %s); "
                        "dropped this call's %d groups (other calls are kept)",
                        step,
                        type(exc).__name__,
                        exc,
                        item[5],
                    )
                    dropped += item[5]
            elif kind == "e":  # a rank's first report counts, as the server keeps it
                header.setdefault("effective", item[6])
                if item[7] is not None:
                    header["mitigation"] = item[7]
            else:
                scalars = header.setdefault("scalars", {})
                for name, value in item[6].items():
                    if name not in scalars and len(scalars) >= MAX_SCALARS_PER_RECORD:
                        self._warn(
                            "scalars:limit",
                            "vantage: step %s: more than %d scalar names; skipped %r",
                            step,
                            MAX_SCALARS_PER_RECORD,
                            name,
                        )
                        continue
                    try:
                        # NaN and ±Infinity as strings: orjson would write them as null
                        # None is "no value" (null), as the API takes it
                        number = None if value is None else float(value)
                        scalars[str(name)] = storable_scalar(number)
                    except Exception:  # noqa: BLE001 - one bad scalar (10**400, a meta tensor) must not cost the batch
                        self._warn(
                            "scalar",
                            "vantage: step %s: scalar %r is %s, not a number; skipped",
                            step,
                            name,
                            reprlib.repr(value),  # 10**400 would print its 401 digits
                        )
            time.sleep(0)  # let a waiting training thread have the GIL
        self._spool.count_dropped(dropped)
        # a step whose only call was dropped above would arrive as an empty point (n_groups 0)
        records = {
            where: (header, chunks)
            for where, (header, chunks) in records.items()
            if chunks or header.get("scalars") or "effective" in header
        }
        for body, n_groups in _pack_or_drop(records, self._spool):
            if not self._spool.append(body, n_groups):
                log.warning(
                    "vantage: spool full (%d bytes); dropped %d groups",
                    self._spool.max_bytes,
                    n_groups,
                )

    @staticmethod
    def _encode_item(item: tuple[Any, ...]) -> list[tuple[bytes, int]]:
        """One log_groups call's groups, encoded; raises on rewards that are not numbers."""
        captured, start, ids, masks, prompts = item[6:]
        rows, plain = materialize(captured)
        if masks is not None:
            masks = materialize(masks)[0]
        groups = []
        for i, row in enumerate(rows):
            g: dict[str, Any] = {
                "group_id": ids[i] if ids is not None else str(start + i),
                "rewards": row if plain else plain_rewards(row),
            }
            if len(g["rewards"]) > MAX_GROUP_SIZE:  # the server would refuse the whole batch
                raise ValueError(
                    f"group {i} has {len(g['rewards'])} rewards (at most {MAX_GROUP_SIZE:,})"
                )
            if masks is not None:
                g["mask"] = mask_row(masks[i])
                if len(g["mask"]) != len(g["rewards"]):
                    n_mask, n_rewards = len(g["mask"]), len(g["rewards"])
                    raise ValueError(
                        f"group {i}: mask has {n_mask} entries for {n_rewards} rewards"
                    )
            if prompts is not None and prompts[i] is not None:
                g["prompt_id"] = prompts[i]
            groups.append(g)
        try:
            return encode_groups(groups)
        except TypeError:  # an integer beyond 64 bits, which orjson cannot write (a trial)
            for g in groups:
                g["rewards"] = float_rewards(g["rewards"])
            return encode_groups(groups)

    def _take_commands(self, data: dict[str, Any]) -> None:
        if self.rank != 0:  # commands go to rank 0, which shares them with the others (§7)
            return
        for raw in data.get("commands") or ():
            cid = str(raw.get("command_id", ""))
            if not cid or cid in self._seen_commands:
                continue
            self._seen_commands.add(cid)
            cmd = Command(
                cid, str(raw.get("type")), dict(raw.get("params") or {}), raw.get("reason"), raw
            )
            self._commands.append(cmd)
            for callback in list(self._callbacks):
                try:
                    callback(cmd)
                except Exception:
                    log.exception("vantage: on_command callback failed for %s", cid)

    def _remaining(self) -> float | None:
        if not self._closing.is_set():
            return None
        return self._deadline - time.monotonic()

    def _pump(self, now: float) -> Reply | None:
        """One unit of network work. Returns the reply of a transient failure (to back off on),
        else None."""
        assert self._transport is not None
        self._progress = False  # any success in this pump: backoff counts consecutive failures
        if self.attempt is None:
            reply = create_run(self._transport, self._run_body, timeout=self._remaining())
            if reply.kind == "retry":
                return reply
            if reply.kind == "refused":
                self._refused = reply.error
                log.error(
                    "vantage: the server refused run %s (%s); recording to the spool %s "
                    "only (upload later with `vantage sync`)",
                    self.run_id,
                    reply.error,
                    self._spool.path,
                )
                return None
            self.attempt = int(reply.data["attempt"])
            self._progress = True
            self._next_heartbeat = now  # announce the client's counters at once
        failed = send_acks(self._spool, self._transport, self.run_id, timeout=self._remaining())
        if failed is not None:
            return failed
        while True:
            head = self._spool.head()
            outcome, reply = send_head(
                self._spool, self._transport, self.run_id, self.attempt, timeout=self._remaining()
            )
            if outcome == "retry":
                if reply is not None and reply.status in (401, 403):
                    self._key_refused = reply.error
                    self._warn(
                        "key_refused",
                        "vantage: the server refuses the API key (%s); batches stay in the "
                        "spool %s and are sent once it takes them (or by vantage sync --api-key)",
                        reply.error,
                        self.spool_path,
                    )
                return reply
            self._progress = True
            self._key_refused = None
            if outcome == "unknown_run":
                log.warning("vantage: %s; creating run %s again", reply.error, self.run_id)
                self.attempt = None
                return reply
            if outcome == "sent" and reply is not None and head is not None:
                s = self.stats
                s["sent_batches"] += 1
                s["sent_groups"] += head.n_groups
                for key in ("accepted", "duplicates", "conflicts", "invalid_groups"):
                    s[key] += int(reply.data.get(key) or 0)
                if reply.data.get("conflicts"):  # the same ids sent again with other rewards
                    self._warn(
                        "conflicts",
                        "vantage: the server kept the first of %d group(s) sent again under "
                        "their ids with other rewards (conflicts); give each group its own id",
                        int(reply.data["conflicts"]),
                    )
                self.last_steps = reply.data.get("steps") or self.last_steps
                self._note_newest(reply.data)
                self._take_commands(reply.data)
            if outcome == "empty" or self._queue or time.monotonic() >= self._deadline:
                break
        if now >= self._next_heartbeat:
            reply = self._transport.post(
                f"/runs/{self.run_id}/heartbeat", self._health(), timeout=self._remaining()
            )
            if reply.kind == "retry":
                return reply
            self._next_heartbeat = now + self.heartbeat_s
            if reply.kind == "ok":
                self._note_newest(reply.data)
                self._take_commands(reply.data)
        return None

    def _note_newest(self, answer: dict) -> None:
        """Warn when the server says a newer launch of the run registered (a relaunch while
        this process still trains): its steps are kept, but the newer attempt's win wherever
        both sent a step, and commands go to the newer attempt only."""
        newest = answer.get("newest_attempt")
        if (
            isinstance(newest, int)
            and self.attempt is not None
            and newest > self.attempt
            and newest != self._told_newest  # once per relaunch (it said so every second)
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

    def _note_failing(self, reply: Reply) -> None:
        """Tell the user when the server has kept failing for a while (training goes on)."""
        lasted = self._outage.failed(time.monotonic())
        if lasted is not None and reply.status in (401, 403):  # it answers: it refuses the key
            log.warning(
                "vantage: server %s has refused the API key for %.0f s (%s); training goes on, "
                "and %d group(s) wait in the spool %s (vantage sync --api-key sends them)",
                self.server,
                lasted,
                reply.error,
                self.spooled_groups + self._queued,
                self.spool_path,
            )
        elif lasted is not None:
            log.warning(
                "vantage: server %s has failed for %.0f s (last error: %s); training goes on, "
                "and %d group(s) wait in the spool %s until it answers",
                self.server,
                lasted,
                reply.error,
                self.spooled_groups + self._queued,
                self.spool_path,
            )

    def _note_answering(self) -> None:
        lasted = self._outage.succeeded(time.monotonic())
        if lasted is not None:
            log.warning(
                "vantage: server %s answers again after %.0f s; sending what the spool kept",
                self.server,
                lasted,
            )

    def _backlog(self) -> int:
        """Groups logged and not yet taken by the server, when they are a backlog: while the
        server fails, or more than a batch of them. A batch on its way to a healthy server is
        not one (a heartbeat counted the groups in flight, so the run page showed a healthy
        fast trainer as "spooled")."""
        waiting = self._spool.pending_groups + self._queued
        failing = self._outage.since is not None or self._key_refused is not None
        return waiting if failing or waiting > self._batch_groups else 0

    def _health(self) -> bytes:
        """The heartbeat body: this rank's client-health counters (DESIGN.md §4)."""
        return orjson.dumps(
            {
                "attempt": self.attempt,
                "rank": self.rank,
                "spooled_groups": self._backlog(),
                "dropped_groups": self.dropped_groups,
                "dead_letter_batches": self._spool.dead_letter_batches,
            }
        )

    def _finish(self) -> bool:
        """Send this rank's final counts (every rank: the run's client health would otherwise
        keep what its last heartbeat said was waiting), then, from rank 0, the run's final
        status; True when the server has the status (or refused it for good)."""
        if (
            self._transport is None
            or self.attempt is None
            or self._refused is not None
            or self._spool.pending_batches
        ):
            return False
        remaining = self._deadline - time.monotonic()
        if remaining > 0.1:  # the final counts (a batch may have been dead-lettered since)
            dropped = self.dropped_groups
            reply = self._transport.post(
                f"/runs/{self.run_id}/heartbeat", self._health(), timeout=remaining / 2
            )
            if reply.kind == "ok":
                self._spool.note_reported(dropped)
        if self._finish_status is None:
            return False
        remaining = self._deadline - time.monotonic()
        if remaining <= 0.05:
            return False
        reply = send_finish(
            self._transport, self.run_id, self._finish_status, remaining, self.attempt
        )
        return reply.kind != "retry"

    def _run(self) -> None:
        backoff = Backoff()
        retry_at = 0.0
        self._next_heartbeat = 0.0
        last_drain = time.monotonic()
        cancelled_backoff = False
        while True:
            self._wake.clear()
            now = time.monotonic()
            closing = self._closing.is_set()
            if closing and not cancelled_backoff:
                retry_at, cancelled_backoff = 0.0, True
            if self._force_drain:  # flush(): try the server now rather than after the backoff
                retry_at = 0.0
            try:
                if (
                    closing
                    or self._force_drain
                    or self._pending_acks
                    or self._queued >= self._batch_groups
                    or now - last_drain >= self._batch_interval
                ):
                    self._draining = True  # flush() must not see the queue empty mid-drain
                    self._force_drain = False
                    try:
                        self._drain()
                    finally:
                        self._draining = False
                    last_drain = now
                if self._transport is not None and self._refused is None and now >= retry_at:
                    failed = self._pump(now)
                    if failed is None or self._progress:
                        backoff.reset()
                        self._note_answering()
                    if failed is not None:
                        self.stats["retries"] += 1
                        self.last_error = failed.error
                        delay = backoff.next_delay(failed.retry_after)
                        if closing and failed.retry_after is None:  # back soon: seen soon
                            delay = min(delay, CLOSING_RETRY_S)
                        retry_at = time.monotonic() + delay
                        if not self._progress:
                            self._note_failing(failed)
            except Exception:  # the sender must outlive any bug of ours
                log.exception("vantage: sender error")
                retry_at = time.monotonic() + backoff.next_delay()
            now = time.monotonic()
            if self._abandon:
                break
            if closing:
                # a refused run or key does not heal within close's timeout (a revoked key kept
                # close() waiting for all of it): what is left stays in the spool for sync
                refused = self._refused is not None or self._key_refused is not None
                offline = self._transport is None or refused
                done = not self._queue and (offline or self._spool.empty)
                if done or now >= self._deadline:
                    break
            wait = self._batch_interval - (now - last_drain)
            if self._transport is not None and self._refused is None:
                if retry_at > now:  # backing off: no network before retry_at
                    wait = min(wait, retry_at - now)
                else:
                    if self.attempt is not None:
                        wait = min(wait, self._next_heartbeat - now)
                    if self._spool.pending_batches or self._spool.pending_acks:
                        wait = 0.0  # the pump stopped to let the queue in; carry on sending
            if closing:
                wait = min(wait, self._deadline - now)
            if self._queued >= self._batch_groups or (closing and self._queue):
                wait = 0.0  # more to drain now
            if wait > 0:
                self._wake.wait(wait)
        finished = False
        try:
            if not self._queue:
                finished = self._finish()
        except Exception:
            log.exception("vantage: finish failed")
        self._finish_sent = finished
        if self._transport is not None:
            self._transport.close()
        with self._final_lock:  # not while close() is moving the queue to the spool
            self._drain(limit=None)
            # Record the queue's drops in the file too, so that `vantage sync` reports them.
            moved, self._queue_dropped = self._queue_dropped, 0
            self._spool.count_dropped(moved)
            if self._finish_status and not finished and self._a_run_to_end():
                self._spool.keep_finish(self._finish_status)  # for `vantage sync`
            self._spool.close(remove_if_clean=True)


# help() and editors showed `*args, **kwargs` for the calls a trainer makes (a trial): each
# public wrapper, which keeps a bad call from stopping training, shows the parameters and the
# description of the method it wraps.
for _name in ("log_groups", "log_effective", "log_scalars"):
    _wrapper, _wrapped = getattr(Monitor, _name), getattr(Monitor, f"_{_name}")
    _wrapper.__signature__ = inspect.signature(_wrapped)
    _docs = (inspect.cleandoc(_wrapped.__doc__ or ""), inspect.cleandoc(_wrapper.__doc__ or ""))
    _wrapper.__doc__ = "\n\n".join(_docs)


def _kind(where: str, exc: Exception) -> str:
    """A warning's kind: where, and the error's type and message with its numbers aside, so
    that a loop repeating one mistake is throttled and a different mistake is still said."""
    return f"{where}:{type(exc).__name__}:{_DIGITS.sub('N', str(exc))[:80]}"


def _seconds(timeout: float | None) -> float:
    """A wait in seconds that the clock and ``Thread.join`` can take: NaN and negatives are 0,
    and None or infinity (wait as long as it takes) a year (``join(inf)`` raises
    OverflowError). TypeError or ValueError for what is no number (a string)."""
    if timeout is None:
        return 365 * 86_400.0
    if isinstance(timeout, str | bytes):
        raise TypeError(f"a timeout is a number of seconds, not {timeout!r}")
    timeout = float(timeout)
    return min(timeout, 365 * 86_400.0) if timeout > 0 else 0.0
