"""Notifications through an outbox table (docs/design.md §6).

A target is a `notify` entry (`targets`): a webhook URL, which gets the JSON body or Slack's
or Discord's format of it (`messages`), or an e-mail address (`mail`); "URL" below is any entry.
A transition inserts one outbox row per URL in the evaluation's transaction, so a notification
exists exactly when the transition does, and survives a restart. A sender (any replica) claims a
URL's send slot (`webhook_targets`) and that URL's oldest due message with conditional
UPDATEs (no lock is held while a request is in flight), sends it, and moves the slot one second
ahead: at most one message per second per URL,
in order. Failures retry with exponential backoff, until ``webhook_give_up_s`` (a 4xx other
than 408/429, or a redirect, at once), so that one failing message does not hold its URL's
later ones; a message the target took without answering in time counts as sent (at most once
to a slow target); each URL's send runs in a thread of its own, so a slow target holds up no
other;
targets in link-local and cloud-metadata ranges are refused, and ``VANTAGE_WEBHOOK_ALLOW``
restricts targets further.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from ..models import as_utc, utcnow
from ..settings import Settings
from .mail import send_email
from .messages import (
    MESSAGE_ID_HEADER,
    SIGNATURE_HEADER,
    discord_body,
    json_bytes,
    signature_header,
    slack_body,
)
from .models import WebhookMessage, WebhookTarget
from .targets import RefusedTarget, check_target, parse_target, redact_target

# How each kind of webhook target takes a message (`parse_target`); e-mail goes by SMTP.
FORMATS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "webhook": lambda body: body,
    "slack": slack_body,
    "discord": discord_body,
}

log = logging.getLogger("vantage.notify")

MAX_PARALLEL_URLS = 8


def enqueue(session: Session, urls: list[str], payload: dict[str, Any], episode_id: int) -> None:
    """Queue one message per URL (the caller commits with the transition)."""
    now = utcnow()
    for url in dict.fromkeys(urls):
        session.add(
            WebhookMessage(
                url=url,
                payload=payload,
                episode_id=episode_id,
                status="pending",
                created_at=now,
                next_attempt_at=now,
            )
        )


def take_send_slot(session: Session, url: str, now: datetime, until: datetime) -> bool:
    """Claim ``url``'s send slot until ``until`` with one conditional UPDATE (no lock is held
    while a message is in flight): False when another sender holds it or the URL's last
    message went less than `webhook_min_interval_s` before ``now``. The caller commits."""
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    session.execute(
        insert(WebhookTarget).values(url=url, next_send_at=now).on_conflict_do_nothing()
    )
    slot = session.execute(
        update(WebhookTarget)
        .where(WebhookTarget.url == url, WebhookTarget.next_send_at <= now)
        .values(next_send_at=until)
    )
    return slot.rowcount == 1


def release_send_slot(session: Session, url: str, settings: Settings) -> None:
    """Move ``url``'s send slot to `webhook_min_interval_s` from now (its message is done)."""
    next_at = utcnow() + timedelta(seconds=settings.webhook_min_interval_s)
    session.execute(
        update(WebhookTarget).where(WebhookTarget.url == url).values(next_send_at=next_at)
    )


class OutboxSender:
    """Sends due outbox messages; `run_once` is one pass over the URLs with pending messages."""

    def __init__(self, settings: Settings, session_factory: Callable[[], Session]) -> None:
        self.settings = settings
        self.session_factory = session_factory
        self.http = httpx.Client(timeout=settings.webhook_timeout_s, follow_redirects=False)
        self.wake = threading.Event()
        self._busy: set[str] = set()  # URLs with a send in flight
        self._busy_lock = threading.Lock()

    def close(self) -> None:
        self.http.close()

    def run_once(self) -> int:
        """Start sending the oldest due message of each URL that has one and no send in flight
        (at most MAX_PARALLEL_URLS at once), each in a thread of its own, and return how many
        sends started without waiting for them: a slow target holds up its own URL only (a
        pass that waited for every send held a ready target's message up to the 5 s timeout of
        a slow one). Daemon threads: a request in flight never delays the exit."""
        with self.session_factory() as session:
            urls = list(
                session.scalars(
                    select(WebhookMessage.url)
                    .where(
                        WebhookMessage.status == "pending",
                        WebhookMessage.next_attempt_at <= utcnow(),
                    )
                    .distinct()
                )
            )
        started = 0
        for url in urls:
            with self._busy_lock:
                if url in self._busy or len(self._busy) >= MAX_PARALLEL_URLS:
                    continue
                self._busy.add(url)
            threading.Thread(
                target=self._send_and_release, args=(url,), name="vantage-webhook", daemon=True
            ).start()
            started += 1
        return started

    def _send_and_release(self, url: str) -> None:
        try:
            self._send_for_url(url)
        finally:
            with self._busy_lock:
                self._busy.discard(url)

    def _send_for_url(self, url: str) -> int:
        try:
            with self.session_factory() as session:
                claimed = self._claim(session, url)
            if claimed is None:
                return 0
            error, outcome = self.deliver(url, claimed.payload, message_id=str(claimed.id))
            with self.session_factory() as session:
                self._record(session, url, claimed.id, error, outcome)
            return int(outcome == "sent")
        except Exception:
            log.exception("webhook sender failed for %s", redact_target(url))
            return 0

    def _claim(self, session: Session, url: str) -> WebhookMessage | None:
        """Take the URL's send slot, then its oldest message, each with one conditional UPDATE,
        so that of several replicas exactly one sends it; both are leased for the length of a
        request, and nothing stays locked while it is in flight (a replica that dies mid-send
        leaves the message to be sent again when the lease ends: at least once)."""
        now = utcnow()
        lease = now + timedelta(seconds=self.settings.webhook_timeout_s + 5)
        if not take_send_slot(session, url, now, lease):
            session.rollback()  # another replica holds it, or the last message was < 1 s ago
            return None
        msg = session.scalar(
            select(WebhookMessage)
            .where(WebhookMessage.url == url, WebhookMessage.status == "pending")
            .order_by(WebhookMessage.id)
            .limit(1)
        )
        if msg is None or as_utc(msg.next_attempt_at) > now:
            session.rollback()  # the oldest waits out its backoff; later ones keep their order
            return None
        taken = session.execute(
            update(WebhookMessage)
            .where(
                WebhookMessage.id == msg.id,
                WebhookMessage.status == "pending",
                WebhookMessage.next_attempt_at <= now,
            )
            .values(next_attempt_at=lease)
            .execution_options(synchronize_session=False)
        )
        if taken.rowcount != 1:
            session.rollback()
            return None
        session.commit()
        return msg

    def _record(
        self, session: Session, url: str, msg_id: int, error: str | None, outcome: str
    ) -> None:
        """Move the URL's send slot on, and record a message's try: ``outcome`` "sent" (with
        ``error`` when it went without an answer), "retry" (with backoff, until the give-up
        time) or "failed"."""
        now = utcnow()
        release_send_slot(session, url, self.settings)
        msg = session.get(WebhookMessage, msg_id)
        if msg is None:
            session.commit()
            return
        msg.attempts += 1
        payload = msg.payload or {}
        about = (
            f" ({payload.get('state')} message of alert {payload.get('alert_id')}, rule "
            f"{payload.get('rule')!r}, run {payload.get('run_id')})"
        )
        shown = redact_target(url)  # the log is read by more people than the rule's owners
        address = parse_target(url).address  # what an error names of a slack+/discord+ entry
        if outcome == "sent":
            msg.status, msg.sent_at, msg.last_error = "sent", now, error
            if error is not None:
                log.warning(
                    "webhook %s%s: %s",
                    shown,
                    about,
                    error.replace(url, shown).replace(address, shown),
                )
        else:
            msg.last_error = error[:1000]
            delay = min(self.settings.webhook_max_backoff_s, 0.5 * 2 ** (msg.attempts - 1))
            msg.next_attempt_at = now + timedelta(seconds=delay)
            give_up = timedelta(seconds=self.settings.webhook_give_up_s)
            if outcome == "failed" or now - as_utc(msg.created_at) > give_up:
                msg.status = "failed"
            gave_up = "; given up" if msg.status == "failed" else ""
            said = (error or "").replace(url, shown).replace(address, shown)
            log.warning(
                "webhook %s%s failed (attempt %d): %s%s", shown, about, msg.attempts, said, gave_up
            )
        session.commit()

    def deliver(
        self, entry: str, payload: dict[str, Any], message_id: str | None = None
    ) -> tuple[str | None, str]:
        """Send the outbox's body to a `notify` entry in its kind's format: (error or None,
        outcome: "sent", "retry" or "failed"). Targets are checked again here: a host name may
        resolve elsewhere than when the rule was saved. ``message_id`` (the outbox row's id)
        goes out as `MESSAGE_ID_HEADER` on webhooks, the same on every try."""
        try:
            check_target(entry, self.settings.webhook_allow)
        except RefusedTarget as exc:
            return str(exc), "failed"
        target = parse_target(entry)
        if target.kind == "email":
            return send_email(self.settings, target.address, payload)
        return self._post(target.address, FORMATS[target.kind](payload), message_id)

    def _post(
        self, url: str, payload: dict[str, Any], message_id: str | None = None
    ) -> tuple[str | None, str]:
        """POST ``payload`` to ``url``: (error or None, outcome).

        A message the target took but did not answer within ``webhook_timeout_s`` counts as
        sent: it reached the target, and sending it again posted it again and again to a
        receiver slower than the timeout (six copies in a minute). Messages never go
        out twice on purpose (one on firing, one on resolving, docs/design.md §6); a target that
        took it and then failed has lost it, which the log says."""
        body = json_bytes(payload)
        headers = {"content-type": "application/json"}
        if message_id is not None:
            # Delivery is at least once: a server killed between the target's answer and the
            # outbox recording it sends the message again. The id lets a receiver drop the copy.
            headers[MESSAGE_ID_HEADER] = message_id
        if self.settings.webhook_secret is not None:
            secret = self.settings.webhook_secret.get_secret_value()
            headers[SIGNATURE_HEADER] = signature_header(secret, body, int(time.time()))
        try:
            r = self.http.post(url, content=body, headers=headers)
        except httpx.ReadTimeout:
            waited = self.settings.webhook_timeout_s
            return (
                f"sent, but no answer within {waited:g} s (VANTAGE_WEBHOOK_TIMEOUT_S); not "
                "sent again, as the target has it and a second send could post it twice"
            ), "sent"
        except httpx.HTTPError as exc:  # not connected, or the message not written: not sent
            return f"{type(exc).__name__}: {exc}", "retry"
        if 200 <= r.status_code < 300:
            return None, "sent"
        said = f"HTTP {r.status_code}: {r.text[:200]}"
        if 300 <= r.status_code < 400:  # will redirect again; following it is not safe
            where = r.headers.get("location")
            moved = f" to {redact_target(where)}" if where and "://" in where else ""
            return f"{said} (a redirect{moved}, not followed: give the rule that URL)", "failed"
        # a 4xx will be answered again (a wrong URL, a refused body), except timeouts and limits
        permanent = 400 <= r.status_code < 500 and r.status_code not in (408, 429)
        return said, "failed" if permanent else "retry"
