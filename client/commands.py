"""``Command``: one command from the server, or one made in the training process.

The client's ``Monitor`` returns these from ``poll_commands``; the trainer applies them at a step
boundary (docs/design.md §4).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Command"]


@dataclass(frozen=True)
class Command:
    """A command (docs/design.md §4): ``type`` is ``set_mitigation``, ``set_sampling``,
    ``checkpoint`` or ``stop``; ``params`` its flat parameters. ``local`` marks a command made
    in-process (never acked to the server)."""

    command_id: str
    type: str
    params: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    local: bool = False

    @classmethod
    def from_any(cls, value: Any) -> Command:
        """A Command from a Command (or any object with the same attributes) or a plain mapping
        with the same fields."""
        if isinstance(value, Mapping):
            get = value.get
        else:

            def get(key: str, default: Any = None) -> Any:
                return getattr(value, key, default)

        reason = get("reason")
        return cls(
            command_id=str(get("command_id")),
            type=str(get("type")),
            params=dict(get("params") or {}),
            reason=None if reason is None else str(reason),
            raw=dict(get("raw") or {}),
            local=bool(get("local", False)),
        )
