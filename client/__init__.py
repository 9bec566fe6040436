"""The Vantage client: the wire schema, the ACR engine and the ``Monitor`` training hook.

Importing it needs no torch, numpy, Dash or database driver (docs/design.md §2).
"""

from .commands import Command
from .launch import derive_launch_id
from .monitor import Monitor

__all__ = ["Command", "Monitor", "derive_launch_id"]
