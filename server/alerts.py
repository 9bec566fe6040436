"""Alert evaluation (DESIGN.md §6). Rules, episodes, webhooks and automatic mitigation are
built in issue 5; ingest calls `after_ingest` after each batch commits and before it answers."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session


def after_ingest(session: Session, run: Any, result: Any) -> None:
    """Evaluate alert rules over the steps a batch touched. No rules exist yet (issue 5)."""
    return None
