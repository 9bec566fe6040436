"""E-mail notifications (docs/design.md §6): one message per SMTP conversation, with the
standard library's `smtplib`, STARTTLS first unless ``VANTAGE_SMTP_STARTTLS`` is off, then a
login when ``VANTAGE_SMTP_USER`` is set. Runs in the outbox sender's thread for its target."""

from __future__ import annotations

import smtplib
import ssl
import time
from email.utils import parseaddr
from typing import Any

from ..settings import Settings
from .messages import email_message, json_bytes, signature_header
from .targets import smtp_missing


def send_email(settings: Settings, to: str, body: dict[str, Any]) -> tuple[str | None, str]:
    """Send ``body`` to ``to``: (error or None, outcome "sent", "retry" or "failed"), as the
    webhook sender answers. A 5xx reply (a refused recipient or message) fails at once, as a
    4xx does a webhook; a 4xx reply, a failed login or STARTTLS, and a connection or a timeout
    are retried: the mail server, or its settings after a restart, may be fixed."""
    missing = smtp_missing(settings)
    if missing:  # the server was restarted without them since the rule was saved
        return f"e-mail needs {' and '.join(missing)} on the server", "retry"
    assert settings.smtp_host is not None and settings.smtp_from is not None
    signature = None
    if settings.webhook_secret is not None:
        secret = settings.webhook_secret.get_secret_value()
        signature = signature_header(secret, json_bytes(body), int(time.time()))
    msg = email_message(body, settings.smtp_from, to, signature)
    try:
        with smtplib.SMTP(
            settings.smtp_host, settings.smtp_port, timeout=settings.webhook_timeout_s
        ) as smtp:
            if settings.smtp_starttls:
                smtp.starttls(context=ssl.create_default_context())
            if settings.smtp_user:
                password = settings.smtp_password
                smtp.login(settings.smtp_user, password.get_secret_value() if password else "")
            smtp.send_message(msg, from_addr=parseaddr(settings.smtp_from)[1], to_addrs=[to])
    except smtplib.SMTPRecipientsRefused as exc:
        code, said = next(iter(exc.recipients.values()))
        return f"SMTP {code}: {_text(said)} (recipient refused)", _outcome(code)
    except smtplib.SMTPAuthenticationError as exc:
        return f"SMTP login refused ({exc.smtp_code}: {_text(exc.smtp_error)})", "retry"
    except smtplib.SMTPResponseException as exc:
        return f"SMTP {exc.smtp_code}: {_text(exc.smtp_error)}", _outcome(exc.smtp_code)
    except (OSError, smtplib.SMTPException) as exc:  # not connected, no STARTTLS, a timeout
        where = f"{settings.smtp_host}:{settings.smtp_port}"
        return f"SMTP server {where}: {type(exc).__name__}: {exc}", "retry"
    return None, "sent"


def _outcome(code: int) -> str:
    return "failed" if 500 <= code < 600 else "retry"


def _text(said: bytes | str) -> str:
    return (said.decode("utf-8", "replace") if isinstance(said, bytes) else said)[:200]
