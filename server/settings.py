"""Server settings: the one place that reads the environment (pydantic-settings)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from platformdirs import user_data_dir
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_database_url() -> str:
    """The embedded default: a SQLite file in the user's data folder."""
    folder = Path(user_data_dir("vantage", appauthor=False))
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'vantage.db'}"


class Settings(BaseSettings):
    """Every knob of the server; each field reads ``VANTAGE_<NAME>`` from the environment."""

    model_config = SettingsConfigDict(env_prefix="VANTAGE_", env_file=".env", extra="ignore")

    database_url: str = Field(default_factory=default_database_url)
    # Off only through `vantage serve --insecure-no-auth`, which refuses non-loopback hosts.
    auth_enabled: bool = True
    public_url: str | None = None
    metrics_token: str | None = None
    default_mitigation_mode: Literal["off", "suggest", "auto"] = "auto"
    webhook_allow: str | None = None
    command_ttl_s: float = 3600.0
    dashboard_refresh_s: float = 2.0
    # A step is evaluated once all ranks reported, a later step arrives, or this long after its
    # first record (DESIGN.md §6).
    step_complete_after_s: float = 30.0
    periodic_pass_s: float = 5.0
    # Webhooks (DESIGN.md §6): per-request timeout, retry backoff cap, at most one message per
    # URL per webhook_min_interval_s, and how often a replica looks for others' messages.
    webhook_timeout_s: float = 5.0
    webhook_max_backoff_s: float = 10.0
    webhook_min_interval_s: float = 1.0
    # A message still failing after this long is given up, so that the later messages to its
    # URL (delivered in order) are not held behind it; a 4xx other than 408/429 is given up at
    # once (the target will not take it).
    webhook_give_up_s: float = 3600.0
    outbox_poll_s: float = 0.25
    # Run the periodic alert pass and the outbox sender in this process.
    alert_worker: bool = True
    # `vantage serve` processes sharing the port (`--workers` overrides); on PostgreSQL more
    # than one uses more cores. Each runs its own alert pass and outbox sender.
    workers: int = Field(default=1, ge=1, le=64)
