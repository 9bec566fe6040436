"""What the training thread hands the Monitor's worker: one named item per ``log_*`` or ``ack``
call, and how the worker gathers a batch of them into step records (docs/design.md §5).

The training thread builds an item in microseconds (its rewards captured, not converted); the
worker reads and encodes it later, off the training thread. Flush and close are no items: they
must reach the worker past a full queue and cut a backoff wait short, so they are signals to
it (`Worker.flush`, `Worker.close`).
"""

from __future__ import annotations

import logging
import reprlib
from typing import Any, NamedTuple

from .inputs import as_float, float_rewards, mask_row, materialize, plain_rewards
from .schema import MAX_GROUP_SIZE, MAX_SCALARS_PER_RECORD, storable_scalar
from .throttle import Throttle, error_kind
from .transport import encode_groups, pack_records

__all__ = ["Ack", "Effective", "Groups", "QueueItem", "Scalars", "StepRecords"]

log = logging.getLogger("vantage.client")

Encoded = list[tuple[bytes, int]]  # JSON fragments of groups and the groups in each


class Groups(NamedTuple):
    """One ``log_groups`` call: ``n_groups`` reward rows for (step, split, rank)."""

    step: int
    split: str
    rank: int
    time: float
    n_groups: int
    rows: Any  # the rewards as `inputs.capture` keeps them
    start: int  # the first group's number, when there are no group_ids
    group_ids: list[str | None] | None
    masks: Any
    prompt_ids: list[str | None] | None

    def encode(self) -> Encoded:
        """This call's groups, encoded; raises on rewards that are not numbers."""
        rows, plain = materialize(self.rows)
        masks = None if self.masks is None else materialize(self.masks)[0]
        groups = []
        for i, row in enumerate(rows):
            g: dict[str, Any] = {
                "group_id": self.group_ids[i]
                if self.group_ids is not None
                else str(self.start + i),
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
            if self.prompt_ids is not None and self.prompt_ids[i] is not None:
                g["prompt_id"] = self.prompt_ids[i]
            groups.append(g)
        try:
            return encode_groups(groups)
        except TypeError:  # an integer beyond 64 bits, which orjson cannot write
            for g in groups:
                g["rewards"] = float_rewards(g["rewards"])
            return encode_groups(groups)


class Effective(NamedTuple):
    """One ``log_effective`` call: the trainer's counts after mitigation (n_valid,
    n_zero_advantage, n_virtual) and the mitigation in effect."""

    step: int
    split: str
    rank: int
    time: float
    counts: dict[str, int]
    mitigation: dict[str, Any] | None
    n_groups = 0  # not a field: no groups to count against the queue's limit


class Scalars(NamedTuple):
    """One ``log_scalars`` call: named numbers, still as the caller gave them (a tensor is read
    by the worker)."""

    step: int
    split: str
    rank: int
    time: float
    values: dict[str, Any]
    n_groups = 0  # not a field


class Ack(NamedTuple):
    """One ``ack`` call: the body of ``POST .../commands/{command_id}/ack``."""

    command_id: str
    body: dict[str, Any]


QueueItem = Groups | Effective | Scalars
Header = dict[str, Any]


class StepRecords:
    """Queue items gathered into step records: one per (step, split, rank), in the order of
    their first item. A call whose rewards cannot be read is dropped and counted in ``dropped``,
    never the other calls of its step."""

    def __init__(self, world_size: int, throttle: Throttle) -> None:
        self.world_size = world_size
        self.throttle = throttle
        self.records: dict[tuple[int, str, int], tuple[Header, Encoded]] = {}
        self.dropped = 0

    def add(self, item: QueueItem) -> None:
        """Add one item to its step's record."""
        header, chunks = self._record(item)
        if isinstance(item, Groups):
            try:
                chunks.extend(item.encode())
            except Exception as exc:  # noqa: BLE001 - one bad call must not cost the others
                self.throttle.warn(
                    error_kind("rewards", exc),
                    "vantage: step %s: rewards could not be read (%s: %s); "
                    "dropped this call's %d group%s (other calls are kept)",
                    item.step,
                    type(exc).__name__,
                    exc,
                    item.n_groups,
                    "" if item.n_groups == 1 else "s",
                )
                self.dropped += item.n_groups
        elif isinstance(item, Effective):  # a rank's first report counts, as the server keeps it
            header.setdefault("effective", item.counts)
            if item.mitigation is not None:
                header["mitigation"] = item.mitigation
        else:
            self._add_scalars(header.setdefault("scalars", {}), item)

    def _record(self, item: QueueItem) -> tuple[Header, Encoded]:
        where = (item.step, item.split, item.rank)
        record = self.records.get(where)
        if record is None:
            header = {
                "step": item.step,
                "split": item.split,
                "rank": item.rank,
                "world_size": self.world_size,
                "time": item.time,
            }
            record = self.records[where] = (header, [])
        return record

    def _add_scalars(self, scalars: dict[str, Any], item: Scalars) -> None:
        for name, value in item.values.items():
            if name not in scalars and len(scalars) >= MAX_SCALARS_PER_RECORD:
                self.throttle.warn(
                    "scalars:limit",
                    "vantage: step %s: more than %d scalar names; skipped %r",
                    item.step,
                    MAX_SCALARS_PER_RECORD,
                    name,
                )
                continue
            try:
                # None is "no value" (null), as the API takes it; NaN and ±Infinity go as
                # strings, which orjson would write as null: a loss gone NaN is sent as "NaN",
                # never dropped or made finite (docs/design.md §5)
                number = None if value is None else as_float(value)
                scalars[str(name)] = storable_scalar(number)
            except Exception:  # noqa: BLE001 - one bad scalar (a meta tensor) must not cost the batch
                self.throttle.warn(
                    "scalar",
                    "vantage: step %s: scalar %r is %s, not a number; skipped",
                    item.step,
                    name,
                    reprlib.repr(value),  # 10**400 would print its 401 digits
                )

    def bodies(self) -> Encoded:
        """The request bodies (records JSON array, group count) of the records that hold
        something: a step whose only call was dropped would arrive as an empty point. A record
        that cannot be encoded is dropped and counted, never the batch around it."""
        records = [
            (header, chunks)
            for header, chunks in self.records.values()
            if chunks or header.get("scalars") or "effective" in header
        ]
        try:
            return pack_records(records)
        except (TypeError, ValueError):
            pass
        good = []
        for header, chunks in records:
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
                self.dropped += lost
                continue
            good.append((header, chunks))
        return pack_records(good) if good else []
