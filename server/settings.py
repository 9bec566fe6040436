"""Server settings: the one place that reads the environment (pydantic-settings)."""

from __future__ import annotations

import ipaddress
import re
from email.utils import parseaddr
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from platformdirs import user_data_dir
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .database_url import check_url, compose_url


def default_database_url() -> str:
    """The embedded default: a SQLite file in the user's data folder."""
    folder = Path(user_data_dir("vantage", appauthor=False))
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'vantage.db'}"


# A host name in VANTAGE_WEBHOOK_ALLOW, "*." for its subdomains too (not an address: "10.0.0.0/33"
# is a range gone wrong, not a name).
_HOST = re.compile(r"(\*\.)?(?=.*[A-Za-z])[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.?")

# A duration: a positive number of seconds (0 or less would spin a loop or expire at once), at
# most ten years (1e308 passed, then overflowed a datetime: commands answered 500 and alert
# evaluation failed).
MAX_SECONDS = 10 * 366 * 86400
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
MAX_REFRESH_S = (2**31 - 1) // 1000  # a browser's longest timer, in whole seconds


class Settings(BaseSettings):
    """Every knob of the server; each field reads ``VANTAGE_<NAME>`` from the environment."""

    # An empty variable is unset: compose passes `${VAR:-}` for what .env leaves out, and an
    # empty VANTAGE_WEBHOOK_SECRET stopped the server as "shorter than 16 characters".
    model_config = SettingsConfigDict(
        env_prefix="VANTAGE_", env_file=".env", extra="ignore", env_ignore_empty=True
    )

    database_url: str = Field(default_factory=default_database_url)
    # A PostgreSQL database given by its parts, when VANTAGE_DATABASE_URL is not set: the password
    # goes in as it is, where inside a URL every / : @ % # ? or blank must be percent-encoded
    # (compose passes POSTGRES_PASSWORD here; a base64 password in an interpolated URL was
    # misread as a port and printed in clear).
    db_host: str | None = None
    db_port: int = Field(default=5432, ge=1, le=65535)
    db_user: str | None = None
    db_password: SecretStr | None = None
    db_name: str | None = None
    # Off only through `vantage serve --insecure-no-auth`, which refuses non-loopback hosts.
    auth_enabled: bool = True
    public_url: str | None = None
    metrics_token: str | None = None
    default_mitigation_mode: Literal["off", "suggest", "auto"] = "auto"
    webhook_allow: str | None = None
    # Signs each webhook message (`alerts.messages.signature_header`): a receiver can tell Vantage's
    # messages from anyone's who knows its URL.
    webhook_secret: SecretStr | None = None
    # E-mail notifications (docs/design.md §6): a `mailto:` target needs the host and the sender
    # (From) address; with a user, the server logs in, after STARTTLS unless it is turned off.
    smtp_host: str | None = None
    smtp_port: int = Field(default=587, ge=1, le=65535)
    smtp_user: str | None = None
    smtp_password: SecretStr | None = None
    smtp_from: str | None = None
    smtp_starttls: bool = True
    command_ttl_s: Seconds = 3600.0
    # at least 0.5 s: each refresh of each open page reads the run (0.001 was taken); at most
    # what a browser's timer holds (2**31 - 1 ms): a longer interval overflowed and fired
    # continuously, flooding the server
    dashboard_refresh_s: Annotated[float, Field(ge=0.5, le=MAX_REFRESH_S, allow_inf_nan=False)] = (
        2.0
    )
    # A step is evaluated once all ranks reported, a later step arrives, or this long after its
    # first record (docs/design.md §6).
    step_complete_after_s: Seconds = 30.0
    periodic_pass_s: Seconds = 5.0
    # Webhooks (docs/design.md §6): per-request timeout, retry backoff cap, at most one message per
    # URL per webhook_min_interval_s, and how often a replica looks for others' messages.
    webhook_timeout_s: Seconds = 5.0
    webhook_max_backoff_s: Seconds = 10.0
    webhook_min_interval_s: Seconds = 1.0
    # A message still failing after this long is given up, so that the later messages to its
    # URL (delivered in order) are not held behind it; a 4xx other than 408/429 is given up at
    # once (the target will not take it).
    webhook_give_up_s: Seconds = 3600.0
    outbox_poll_s: Seconds = 0.25
    # Completion samples (`Monitor.log_samples`, docs/design.md §4 'Samples'): kept this many
    # days after they arrive and, per run, for its last `samples_keep_steps` steps (unset: no
    # step limit); the periodic pass deletes older ones every `samples_prune_s`.
    samples_keep_days: Annotated[float, Field(gt=0, le=36_600, allow_inf_nan=False)] | None = 30.0
    samples_keep_steps: int | None = Field(default=None, ge=1, le=2**62)
    samples_prune_s: Seconds = 600.0
    # Run the periodic alert pass and the outbox sender in this process.
    alert_worker: bool = True
    # `vantage serve` processes sharing the port (`--workers` overrides); on PostgreSQL more
    # than one uses more cores. Each runs its own alert pass and outbox sender.
    workers: int = Field(default=1, ge=1, le=64)

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        check_url(value)
        return value

    @model_validator(mode="after")
    def _database_from_parts(self) -> Settings:
        parts = {"db_user": self.db_user, "db_password": self.db_password, "db_name": self.db_name}
        if "database_url" in self.model_fields_set or self.db_host is None:
            if self.db_host is None and (given := [k for k, v in parts.items() if v is not None]):
                names = ", ".join(f"VANTAGE_{k.upper()}" for k in given)
                raise ValueError(
                    f"{names} set without VANTAGE_DB_HOST: set VANTAGE_DB_HOST too (or give "
                    "the whole VANTAGE_DATABASE_URL)"
                )
            return self
        if not self.db_name:
            raise ValueError(
                "VANTAGE_DB_HOST is set without VANTAGE_DB_NAME: name the database (libpq "
                "would pick the one named after the user)"
            )
        password = self.db_password.get_secret_value() if self.db_password else None
        url = compose_url(self.db_host, self.db_port, self.db_user, password, self.db_name)
        check_url(url)
        self.database_url = url
        return self

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError("must be an http:// or https:// URL (the dashboard's address)")
        return value

    @field_validator("webhook_secret")
    @classmethod
    def _webhook_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len("".join(value.get_secret_value().split())) < 16:
            raise ValueError(
                "must be at least 16 characters, not counting blanks (a guessable secret signs "
                "nothing)"
            )
        return value

    @field_validator("smtp_from")
    @classmethod
    def _smtp_from(cls, value: str | None) -> str | None:
        # the From header and the envelope sender: one address, on one line
        if value is not None and (
            "@" not in parseaddr(value)[1] or any(not c.isprintable() for c in value)
        ):
            raise ValueError(
                "must be one e-mail address (vantage@example.com, or with a name: "
                "Vantage <vantage@example.com>)"
            )
        return value

    @field_validator("metrics_token")
    @classmethod
    def _metrics_token(cls, value: str | None) -> str | None:
        # `/metrics` strips the bearer token it is sent: a blank one, or one with blanks at
        # either end, matched no request, and every scrape was a 401
        if value is not None and value != value.strip():
            raise ValueError(
                "a bearer token cannot be blank or start or end with blanks (leave it unset for "
                "an open /metrics)"
            )
        return value

    @field_validator("webhook_allow")
    @classmethod
    def _webhook_allow(cls, value: str | None) -> str | None:
        """Each comma-separated entry a URL prefix, an IP or CIDR range, or a host name (with a
        leading ``*.`` for its subdomains): the forms `notify._allowed` understands."""
        entries = [e.strip() for e in (value or "").split(",") if e.strip()]
        if value is not None and value.strip() and not entries:  # ",,," allowed nothing at all
            raise ValueError("names no target; leave it unset to allow every target")
        for entry in entries:
            if entry.startswith(("http://", "https://")):
                continue
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                if not _HOST.fullmatch(entry):
                    raise ValueError(
                        f"{entry!r} is not a URL prefix, an IP or CIDR range, or a host name"
                    ) from None
        return value


class SettingsError(ValueError):
    """A VANTAGE_* variable (or a command-line value) the server cannot use: one line each."""


def load_settings(**values: object) -> Settings:
    """`Settings` from the environment and ``values``; SettingsError naming each bad variable
    instead of pydantic's ValidationError (whose traceback is what a CLI user would see)."""
    try:
        return Settings(**values)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise SettingsError("; ".join(map(_problem, exc.errors()))) from None


# The password of a URL's user (a database URL's, a webhook's), and libpq's password parameters
# in its query (`?password=`: it was echoed in clear), hidden when a value is echoed. A URL's
# user info ends at its last "@" (as URL parsers read it): a password with an unescaped "/"
# was once left in clear.
_PASSWORD = re.compile(r"(://[^/@:\s]*:)\S*@")
_QUERY_PASSWORD = re.compile(r"([?&](?:password|sslpassword)=)[^&'\"\s]*", re.IGNORECASE)


def hide_passwords(text: str) -> str:
    """``text`` with the passwords of the URLs in it shown as ``***`` (user info and query)."""
    return _QUERY_PASSWORD.sub(r"\1***", _PASSWORD.sub(r"\1***@", text))


def _problem(error: Any) -> str:
    """One bad value: its variable, its value (any URL password hidden) and what is wrong."""
    said = error["msg"].removeprefix("Value error, ")
    if not error["loc"]:  # a check of several settings together: its message names them
        return said
    name = "VANTAGE_" + "_".join(map(str, error["loc"])).upper()
    value = error.get("input")
    if error["loc"][0] == "database_url" and isinstance(value, str):
        value = _hide_user_info(value)
    value = hide_passwords(repr(value))
    if error["loc"][0] in SECRET_SETTINGS:  # never echoed
        value = "'***'"
    return f"{name}={value}: {said}"


def _hide_user_info(url: str) -> str:
    """A URL that may not parse with everything after its user name and before its last "@"
    hidden: a password with blanks or unescaped characters is hidden whole."""
    scheme, sep, rest = url.partition("://")
    user_info, at, host = rest.rpartition("@")
    if not (sep and at and ":" in user_info):
        return url
    return f"{scheme}://{user_info.split(':', 1)[0]}:***@{host}"


SECRET_SETTINGS = frozenset({"webhook_secret", "metrics_token", "db_password", "smtp_password"})
