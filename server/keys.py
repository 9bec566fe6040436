"""API keys: created once in plaintext, stored as a SHA-256 hash, checked per request.

Keys are 32 random bytes (``secrets.token_urlsafe``), so a fast hash is enough: there is nothing
to brute-force that a slow hash would protect.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from .models import ApiKey, iso, utcnow

SCOPES = ("ingest", "read", "control", "admin")
KEY_PREFIX = "vtg_"


@dataclass(frozen=True)
class KeyInfo:
    """The caller: a key's name, scopes and optional project (None: every project)."""

    name: str
    scopes: frozenset[str] = field(default_factory=frozenset)
    project: str | None = None
    key_id: int | None = None

    def allows_project(self, project: str | None) -> bool:
        return self.project is None or self.project == project


ALL_ACCESS = KeyInfo(name="insecure-no-auth", scopes=frozenset(SCOPES))


def hash_key(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def parse_scopes(text: str) -> frozenset[str]:
    """Parse ``read,control``; raises ValueError naming an unknown or missing scope."""
    scopes = frozenset(s.strip() for s in text.split(",") if s.strip())
    if not scopes:
        raise ValueError(f"give at least one scope of {', '.join(SCOPES)}")
    unknown = scopes - set(SCOPES)
    if unknown:
        raise ValueError(f"unknown scope(s) {', '.join(sorted(unknown))}; use {', '.join(SCOPES)}")
    return scopes


def create_key(session: Session, name: str, scopes: frozenset[str], project: str | None) -> str:
    """Store a new key and return its plaintext (shown once)."""
    plaintext = KEY_PREFIX + secrets.token_urlsafe(32)
    session.add(
        ApiKey(
            name=name,
            key_hash=hash_key(plaintext),
            prefix=plaintext[:8],
            scopes=",".join(sorted(scopes)),
            project=project,
        )
    )
    session.flush()
    return plaintext


# Built once (a statement memoizes its cache key): every authenticated request runs it.
_LOOKUP = select(
    ApiKey.__table__.c.name,
    ApiKey.__table__.c.scopes,
    ApiKey.__table__.c.project,
    ApiKey.__table__.c.id,
).where(
    ApiKey.__table__.c.key_hash == bindparam("key_hash"), ApiKey.__table__.c.revoked_at.is_(None)
)


def authenticate(session: Session, plaintext: str) -> KeyInfo | None:
    """The key's identity, or None when it is unknown or revoked. Reads with Core on the
    session's connection: no ORM object per request."""
    if not plaintext.startswith(KEY_PREFIX):
        return None
    row = session.connection().execute(_LOOKUP, {"key_hash": hash_key(plaintext)}).first()
    if row is None:
        return None
    name, scopes, project, key_id = row
    return KeyInfo(name, frozenset(scopes.split(",")), project, key_id)


def list_keys(session: Session) -> list[dict]:
    """Every key, oldest first: ``{id, name, prefix, scopes, project, created_at, revoked}``
    (never the key or its hash)."""
    return [_key_row(r) for r in session.scalars(select(ApiKey).order_by(ApiKey.id))]


def _key_row(r: ApiKey) -> dict:
    return {
        "id": r.id,
        "name": r.name,
        "prefix": r.prefix,
        "scopes": r.scopes,
        "project": r.project,
        "created_at": iso(r.created_at),
        "revoked": r.revoked_at is not None,
    }


class AmbiguousKey(ValueError):
    """A revoke whose name or prefix matches more than one active key; ``matches`` lists them
    as ``list_keys`` rows."""

    def __init__(self, key: str, matches: list[dict]):
        self.matches = matches
        super().__init__(f"'{key}' matches {len(matches)} active keys")


def revoke_key(session: Session, key: str, every_match: bool = False) -> list[dict]:
    """Revoke the active key that ``key`` is (its plaintext), or whose id, name or prefix it is,
    and return it as a `list_keys` row (an empty list when none matches). The key itself names
    one key; an id, name or prefix may match several (a name may look like another key's id),
    which raises `AmbiguousKey` unless ``every_match`` revokes them all."""
    rows = session.scalars(select(ApiKey).where(ApiKey.revoked_at.is_(None))).all()
    key = key.removesuffix("…")  # a prefix pasted as `keys list` shows it
    digest = hash_key(key)
    hits = [r for r in rows if r.key_hash == digest]
    # an id, a name or a prefix: a name "1" beside key id 1 is ambiguous, not key 1 (revoking
    # "1" must not revoke id 1 and leave the key named "1" active)
    hits = hits or [r for r in rows if key in (str(r.id), r.name, r.prefix)]
    if len(hits) > 1 and not every_match:
        raise AmbiguousKey(key, [_key_row(r) for r in hits])
    now: datetime = utcnow()
    for r in hits:
        r.revoked_at = now
    return [_key_row(r) for r in hits]
