"""``Monitor``: the hook that lives inside a training loop (docs/design.md §5).

The training thread only converts its inputs to Python lists and appends them, as named items
(`items`), to a bounded in-memory queue (O(1), no lock held for long, no I/O). A background
thread (`worker`) does everything else: it batches the queue, writes each batch to the on-disk
spool, sends the spool in order, retries with backoff, sends heartbeats, and takes the run's
commands out of every answer.

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
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from . import checks
from .closing import uncaught_error, warn_unsent
from .commands import Command
from .inputs import capture, check_mask_width, check_width, grouped
from .items import Ack, Effective, Groups, Scalars
from .launch import derive_launch_id, rank_and_world_size, run_id_of
from .schema import MAX_COUNT, MAX_GROUP_SIZE, RunCreate, errors_in_one_line
from .spool import open_spool
from .throttle import Throttle, error_kind
from .transport import Transport, server_url_problem
from .worker import Worker

__all__ = ["Command", "Monitor", "derive_launch_id"]

log = logging.getLogger("vantage.client")

BATCH_GROUPS = 1_000
BATCH_INTERVAL_S = 1.0


class Monitor:
    """Sends a GRPO run's reward groups, effective statistics and scalars to a Vantage server and
    carries its commands back, without ever blocking the training thread.

    ``rank`` and ``world_size`` default to ``torch.distributed``'s when a process group is up, else
    to ``RANK``/``WORLD_SIZE``, else 0 and 1. ``spool_dir`` defaults to ``VANTAGE_SPOOL_DIR`` or a
    user cache folder. ``server=None`` (and no ``VANTAGE_SERVER``) records to the spool only, for a
    later ``vantage sync``; so does a ``server`` that is not an ``http(s)://`` URL with a host,
    which is logged at once (``strict=True`` raises ValueError instead). A server that keeps
    failing is logged after 15 s, then every 10 minutes, and when it answers again.
    ``spool_max_bytes`` caps the spool; groups beyond it are dropped and counted.
    ``max_queue_groups`` caps the in-memory queue the same way. ``strict=True`` raises a bad
    ``log_*`` call's error in the caller (for development and tests); off, it is logged and the
    call skipped, never raised into the training loop. The server's answers (a refused key, say)
    come later, in the background, and are logged either way.
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
        samples_per_step: int = 8,
        strict: bool = False,
    ) -> None:
        self.strict = bool(strict)
        self.server = server or os.environ.get("VANTAGE_SERVER") or None
        # A server URL that can never work (no scheme, say): recorded to the spool only.
        self._unusable = server_url_problem(self.server) if self.server else None
        if self._unusable and strict:
            raise ValueError(self._unusable)
        api_key = api_key or os.environ.get("VANTAGE_API_KEY") or None
        self.rank, self.world_size = rank_and_world_size(rank, world_size)
        self.launch_id = derive_launch_id(launch_id)
        if run_id is not None and not str(run_id):  # "" would read as "no run_id"
            raise ValueError("Monitor: run_id is empty; give an id, or None for a new one")
        # Without a run_id, the ranks of one launch meet in one run: its id follows from the
        # launch, name and project. A launch id of its own is a fresh UUID.
        self.run_id = str(run_id) if run_id else run_id_of(self.launch_id, run_name, project)
        self.heartbeat_s = float(heartbeat_s)
        run = self._run_description(
            run_name, project, config, group_size, tags,
            reward_min=reward_min, reward_max=reward_max, trainer_eps=trainer_eps,
            heartbeat_s=heartbeat_s,
        )  # fmt: skip
        self.group_size: int | None = run.group_size  # splits flat rewards into groups
        checks.rank_in(self.rank, self.world_size)  # every record of this rank would be refused
        batch_groups, max_queue_groups = int(batch_groups), int(max_queue_groups)
        batch_interval_s = float(batch_interval_s)
        for name, value in (("batch_groups", batch_groups),
                            ("batch_interval_s", batch_interval_s),
                            ("max_queue_groups", max_queue_groups),
                            ("request_timeout_s", float(request_timeout_s)),
                            ("spool_max_bytes", float(spool_max_bytes))):  # fmt: skip
            if not value > 0:  # NaN too
                raise ValueError(f"Monitor: {name} must be above 0, not {value}")
        self._group_counters: dict[tuple[int, str, int], int] = {}
        self.samples_per_step = checks.count("samples_per_step", samples_per_step, 1_000)
        self._splits: set[str] = set()  # split names that passed `checks.split_name`
        self._throttle = Throttle()
        self._closed = False

        spool = open_spool(spool_dir, self.run_id, self.launch_id, self.rank, spool_max_bytes)
        run_body = run.model_dump(exclude_none=True)
        spool.set_meta("run", run_body)
        spool.set_meta("rank", self.rank)  # `vantage sync` reports this rank's health
        self.spool_path = spool.path
        self._say_offline()
        usable = self.server and not self._unusable
        transport = Transport(self.server, api_key, request_timeout_s) if usable else None
        self._worker = Worker(
            run_body, spool, transport,
            server=self.server, unusable=self._unusable, rank=self.rank,
            world_size=self.world_size, heartbeat_s=self.heartbeat_s,
            batch_groups=batch_groups, batch_interval_s=batch_interval_s,
            max_queue_groups=max_queue_groups, throttle=self._throttle,
        )  # fmt: skip
        self._delivery = self._worker.delivery
        self.stats = self._delivery.stats
        self._worker.start()
        self._error_before = uncaught_error()  # an error from before this run ended nothing
        self._pid = os.getpid()  # a forked child inherits the exit hook, not the worker
        ref = weakref.ref(self)
        self._atexit = lambda: (m := ref()) is not None and m._at_exit()
        atexit.register(self._atexit)

    def _run_description(
        self,
        run_name: Any,
        project: str | None,
        config: Mapping[str, Any] | None,
        group_size: Any,
        tags: Iterable[str],
        **numbers: float,
    ) -> RunCreate:
        """The run as the server registers it (``POST /runs``), kept in the spool so that a late
        `vantage sync` says it too. Plain JSON config only: whatever the user put in config is
        stringified rather than refused; a config the server would refuse (too large, say) is
        left out rather than the run."""
        try:
            config_json = checks.config_json(config)
        except ValueError as exc:
            if self.strict:
                raise
            log.warning("vantage: the run's config is not sent (config %s)", exc)
            config_json = {"vantage": f"config not sent (config {exc})"}
        if not isinstance(run_name, str):  # the server needs a new run's name
            raise TypeError(f"Monitor: run_name must be text, not {run_name!r}")
        try:
            if group_size is not None and not isinstance(group_size, bool | str):
                # as log_groups takes it: 4.0 is 4
                group_size = checks.count("group_size", group_size, MAX_GROUP_SIZE, low=1)
            return RunCreate(
                run_id=self.run_id,
                launch_id=self.launch_id,
                started_at=time.time(),
                name=run_name,
                project=project,
                config=config_json,
                group_size=group_size,
                world_size=self.world_size,
                tags=[tags] if isinstance(tags, str) else list(tags),  # "a" is one tag
                **numbers,
            )
        except ValidationError as exc:  # one line per bad argument, not pydantic's model dump
            raise ValueError(f"Monitor: {errors_in_one_line(exc)}") from None

    def _say_offline(self) -> None:
        """Say at once when nothing will be sent: offline on purpose, or a forgotten
        VANTAGE_SERVER, or a server URL that cannot work."""
        if self._unusable:
            log.error(
                "vantage: %s; recording to the spool %s only (upload later with `vantage sync`)",
                self._unusable,
                self.spool_path,
            )
        elif not self.server:
            log.warning(
                "vantage: no server (server=None and no VANTAGE_SERVER); recording to the spool "
                "%s only (upload later with `vantage sync`)",
                self.spool_path,
            )

    # ------------------------------------------------------------------ training-thread API
    def _reject(self, what: str, exc: Exception) -> None:
        if self.strict:
            raise exc
        self.stats["rejected_calls"] += 1
        kind = error_kind(what.split("(")[0], exc)
        said = str(exc) if len(str(exc)) <= 300 else str(exc)[:300] + "…"  # 10**400 has 401 digits
        self._throttle.warn(kind, "vantage: %s ignored (%s: %s)", what, type(exc).__name__, said)

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
        if group_size is not None:  # 4.0 is 4, as the Monitor takes it
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
        item = Groups(step, split, rank, time.time(), p, rows, start, ids, masks, prompts)
        if self.strict:  # unreadable rewards raise here, in the caller, not in the background
            item.encode()
        self._worker.put(item)

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
        self._worker.put(Effective(step, split, rank, time.time(), eff, mitigation))

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
        """Queue named numbers for ``step`` (loss, kl, ...); tensors and arrays are converted
        off-thread (in the call when ``strict``, so that a value that is no number raises
        here), other values in the call (a list is skipped and counted in `rejected_calls`)."""
        step, split, rank = self._where(step, split, rank)
        named = {}
        for name, value in checks.scalars_map(scalars).items():
            try:  # a bad name or a value that is no number costs its scalar alone
                text = checks.scalar_name(name)
                checks.refuse_text(text, value)
                if hasattr(value, "detach"):  # a tensor: not its autograd graph (torch warns
                    value = value.detach()  # when float() reads one with requires_grad)
                # a plain value is read now: a list was refused later by the sender, uncounted
                if value is not None and (self.strict or not _read_later(value)):
                    value = checks.scalar_value(text, value)  # None is the API's "no value"
            except (ValueError, TypeError) as exc:
                self._reject(f"log_scalars(step={step}) scalar", exc)
                continue
            named[text] = value
        if named:
            self._worker.put(Scalars(step, split, rank, time.time(), named))

    def log_samples(
        self, step: int, prompt: Any, completions: Any, rewards: Any, *args: Any, **kwargs: Any
    ) -> None:
        """Bad input is logged and skipped (raised when ``strict``); the call never blocks."""
        try:
            self._log_samples(step, prompt, completions, rewards, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a bad call never stops training
            self._reject(f"log_samples(step={step!r})", exc)

    def _log_samples(
        self,
        step: int,
        prompt: str,
        completions: Iterable[str],
        rewards: Any,
        prompt_id: str | int | None = None,
        split: str = "train",
        rank: int | None = None,
    ) -> None:
        """Queue what the model answered for one prompt at ``step`` (opt-in; docs/design.md §5
        'Samples'): the ``prompt`` text, its ``completions`` (texts) and their ``rewards`` (one
        number each; a tensor too), and the ``prompt_id`` its groups carry, so that the
        dashboard's prompts tab shows them beside that prompt. A few per step: at most
        ``samples_per_step`` (the Monitor's, default 8) per (step, split, rank), more are
        dropped and counted. Text past 4,000 characters is cut, its end replaced by
        "… [N characters cut]"; the first 64 completions are kept. Sent in the background,
        best-effort and never spooled (`samples_sent`, `samples_dropped` count them)."""
        step, split, rank = self._where(step, split, rank)
        sample = (prompt, completions, rewards, prompt_id)
        self._worker.samples.add(step, split, rank, self.samples_per_step, *sample)

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
        commands = self._delivery.commands
        out = []
        while commands:
            out.append(commands.popleft())
        return out

    def on_command(self, callback: Callable[[Command], Any]) -> None:
        """Call ``callback(command)`` once per new command, from the background thread (keep it
        short: record the command and apply it at the next step boundary)."""
        self._delivery.callbacks.append(callback)

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
            body["detail"] = checks.ack_detail(detail)
        self._worker.put_ack(Ack(str(command_id), body))

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Send everything queued so far (retrying at once, not after the current backoff) and
        wait until the server has it; True when it has. ``timeout``: seconds, as `close`'s."""
        return self._worker.flush(_seconds(timeout))

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
        self._worker.close(timeout, status if self.rank == 0 else None)
        warn_unsent(self._worker, timeout)

    def _bad_close(self, exc: Exception, then: str) -> None:
        """A bad argument to close(): raised when ``strict``; else said, with what close does
        instead (it still closes: the data is what matters at the end of a run)."""
        if self.strict:
            raise exc
        self.stats["rejected_calls"] += 1
        log.warning("vantage: %s; %s", exc, then)

    def _at_exit(self) -> None:
        """Interpreter exit: close if the user did not (the run marked ``failed`` when an
        uncaught exception, Ctrl-C's included, ends the program, else ``finished``), then let
        the worker spool what is left before the interpreter tears down under it. In a forked
        child it does nothing: the parent's worker has the data."""
        if os.getpid() != self._pid:
            return
        if not self._closed:
            error = uncaught_error()
            ended_by_error = error is not None and error is not self._error_before
            self.close(timeout=10.0, status="failed" if ended_by_error else "finished")
        self._worker.stop_at_exit()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        """Close, with the run marked ``failed`` when an exception ends the block (a
        ``sys.exit(n)`` with n other than 0 or None included), else ``finished``."""
        clean = exc_type is None or (isinstance(exc, SystemExit) and exc.code in (0, None))
        self.close(status="finished" if clean else "failed")

    # ------------------------------------------------------------------ what the worker knows
    @property
    def attempt(self) -> int | None:
        """The attempt the server gave this launch of the run; None until it answered."""
        return self._delivery.attempt

    @property
    def last_error(self) -> str | None:
        """The last failed request's error (kept after the server answers again)."""
        return self._worker.last_error

    @property
    def last_steps(self) -> list[dict[str, Any]]:
        """The steps the server's last answer to a batch reported."""
        return self._delivery.last_steps

    @property
    def samples_sent(self) -> int:
        """Completion samples the server has taken."""
        return self._worker.samples.sent

    @property
    def samples_dropped(self) -> int:
        """Completion samples dropped (over ``samples_per_step``, a full outbox, refused)."""
        return self._worker.samples.dropped

    @property
    def dropped_groups(self) -> int:
        return self._worker.dropped_groups

    @property
    def spooled_groups(self) -> int:
        return self._worker.spool.pending_groups

    @property
    def dead_letter_batches(self) -> int:
        return self._worker.spool.dead_letter_batches


# Each public log_* wrapper, which keeps a bad call from stopping training, shows help() and
# editors the parameters and the description of the method it wraps, not `*args, **kwargs`.
for _name in ("log_groups", "log_effective", "log_scalars", "log_samples"):
    _wrapper, _wrapped = getattr(Monitor, _name), getattr(Monitor, f"_{_name}")
    _wrapper.__signature__ = inspect.signature(_wrapped)
    _docs = (inspect.cleandoc(_wrapped.__doc__ or ""), inspect.cleandoc(_wrapper.__doc__ or ""))
    _wrapper.__doc__ = "\n\n".join(_docs)


def _read_later(value: Any) -> bool:
    """Whether a scalar is an array or tensor (it has ``item``), which the sender reads off the
    training thread: reading a GPU tensor waits for the device."""
    return hasattr(value, "item")


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
