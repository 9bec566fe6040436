"""The Vantage client: the wire schema, the ACR engine and the ``Monitor`` training hook.

Importing it needs no torch, numpy, Dash or database driver (DESIGN.md §2).
"""

from .monitor import Command, Monitor, derive_launch_id

__all__ = ["Command", "Monitor", "derive_launch_id"]
