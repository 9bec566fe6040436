"""Notification targets (docs/design.md §6): what an entry of a rule's `notify` names, and
whether Vantage may send there.

An entry is one of:

- an http(s) URL: a webhook that gets the JSON body; ``https://hooks.slack.com/services/...`` is
  a Slack incoming webhook and ``https://discord.com/api/webhooks/...`` (or ``discordapp.com``)
  a Discord one, each sent its own format;
- ``slack+`` or ``discord+`` before an http(s) URL (``slack+https://chat.example/hook``): that
  format to that URL, for a proxy, a Slack-compatible chat (Mattermost, Rocket.Chat) or a test
  receiver, whose host says nothing of its format;
- ``mailto:ADDRESS`` or a bare ``ADDRESS``: an e-mail over the server's SMTP settings, stored as
  ``mailto:ADDRESS``.

An entry stays one string, so that the outbox, its order and its rate limit (one message per
second per entry) are the same for every kind.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple
from urllib.parse import urlsplit

import httpx

Kind = Literal["webhook", "slack", "discord", "email"]
FORMAT_PREFIXES: tuple[Kind, ...] = ("slack", "discord")
DISCORD_HOSTS = frozenset(
    {"discord.com", "discordapp.com", "ptb.discord.com", "canary.discord.com"}
)

# Cloud metadata services that do not live in the link-local ranges (Alibaba, AWS over IPv6,
# Oracle, Azure's WireServer).
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("100.100.100.200", "fd00:ec2::254", "192.0.0.192", "168.63.129.16")
)
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata", "instance-data"})

# An ASCII e-mail address (RFC 5322's dot-atom local part, a host name): no blanks, quotes,
# commas or line breaks, which would add recipients or headers to the message.
_ADDRESS = re.compile(
    r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
    r"@[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*"
)
MAX_ADDRESS_CHARS = 254  # RFC 5321's longest path


class RefusedTarget(ValueError):
    """A notification target that Vantage will not send to."""


class Target(NamedTuple):
    """What a `notify` entry names: ``kind`` and ``address``, the URL to post to (without a
    ``slack+``/``discord+`` prefix) or the e-mail address."""

    kind: Kind
    address: str


def parse_target(entry: str) -> Target:
    """The kind and address of a `notify` entry (see the module's docstring); never raises,
    `check_target` says what is wrong with an entry."""
    if entry[:7].lower() == "mailto:":
        return Target("email", entry[7:])
    scheme, sep, rest = entry.partition("://")
    if not sep:
        return Target("email", entry) if "@" in entry else Target("webhook", entry)
    kind, plus, transport = scheme.partition("+")
    if plus and kind.lower() in FORMAT_PREFIXES:
        return Target(kind.lower(), f"{transport}://{rest}")  # type: ignore[arg-type]
    try:
        parts = urlsplit(entry)
        host = (parts.hostname or "").rstrip(".")
    except ValueError:
        return Target("webhook", entry)
    if host == "hooks.slack.com" and parts.path.startswith("/services/"):
        return Target("slack", entry)  # Slack's workflow webhooks (/triggers/) take any JSON
    if host in DISCORD_HOSTS and parts.path.startswith("/api/webhooks/"):
        return Target("discord", entry)
    return Target("webhook", entry)


def smtp_missing(settings: Any) -> list[str]:
    """The SMTP settings an e-mail target needs that ``settings`` lacks, by variable name."""
    needed = {"VANTAGE_SMTP_HOST": settings.smtp_host, "VANTAGE_SMTP_FROM": settings.smtp_from}
    return [name for name, value in needed.items() if not value]


def check_target(
    entry: str, allow: str | None, resolve: bool = True, smtp_missing: Sequence[str] = ()
) -> str:
    """The entry as stored if Vantage may send there, else RefusedTarget saying why. A URL:
    not an http(s) URL that the sender can call (httpx parses it; a bad port, an unbracketed
    IPv6 address, blanks), a link-local or cloud-metadata address, or outside
    VANTAGE_WEBHOOK_ALLOW (checked on the URL without its ``slack+``/``discord+`` prefix). An
    e-mail address: not one address, or the server lacks the ``smtp_missing`` settings; stored
    as ``mailto:ADDRESS``."""
    target = parse_target(entry)
    if target.kind == "email":
        return "mailto:" + _check_address(target.address, smtp_missing)
    _check_url(target.address, allow, resolve)
    return entry


def _check_address(address: str, missing: Sequence[str]) -> str:
    if len(address) > MAX_ADDRESS_CHARS or not _ADDRESS.fullmatch(address):
        raise RefusedTarget(
            f"e-mail target '{address}' is not one plain address like ops@example.com (no "
            "name, blanks, quotes or second address; ASCII only)"
        )
    if missing:
        raise RefusedTarget(
            f"e-mail target '{address}' needs the server's SMTP settings: set "
            f"{' and '.join(missing)} (and VANTAGE_SMTP_USER/VANTAGE_SMTP_PASSWORD if the mail "
            "server asks for a login), then restart it"
        )
    return address


def _check_url(url: str, allow: str | None, resolve: bool) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RefusedTarget(
            f"webhook '{url}' must be an http:// or https:// URL with a host (or an e-mail "
            "address, mailto:ops@example.com)"
        )
    try:
        if url != url.strip() or any(c.isspace() for c in url):
            raise ValueError("it holds blanks")
        if parts.port == 0:  # raises for a port that is no number or above 65535
            raise ValueError("port 0 is no port to send to")
        httpx.URL(url)
    except (ValueError, httpx.InvalidURL) as exc:
        hint = " (an IPv6 address goes in brackets: http://[fe80::1]/)" if "::" in url else ""
        raise RefusedTarget(f"webhook '{url}' cannot be called: {exc}{hint}") from None
    host = parts.hostname.lower().rstrip(".")
    if host in METADATA_HOSTS:
        raise RefusedTarget(f"webhook host '{host}' is a cloud metadata service")
    addresses = _resolve(host) if resolve else []
    with contextlib.suppress(ValueError):
        addresses = addresses or [ipaddress.ip_address(host)]
    for ip in addresses:
        if _address_refused(ip):
            raise RefusedTarget(
                f"webhook '{url}' points at {ip}, a link-local or cloud-metadata address"
            )
    if not _allowed(url, host, addresses, allow):
        raise RefusedTarget(f"webhook '{url}' is not allowed by VANTAGE_WEBHOOK_ALLOW")


def _address_refused(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_link_local or ip in METADATA_ADDRESSES or ip.is_multicast or ip.is_unspecified


def _allowed(url: str, host: str, addresses: list[Any], allow: str | None) -> bool:
    """VANTAGE_WEBHOOK_ALLOW: comma-separated URL prefixes (http...), CIDR ranges or IPs, and
    host names (``*.example.com`` matches subdomains)."""
    if not allow:
        return True
    for entry in (e.strip() for e in allow.split(",")):
        if not entry:
            continue
        if entry.startswith(("http://", "https://")):
            if url.startswith(entry):
                return True
            continue
        try:
            net = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            pattern = entry.lower()
            if pattern.startswith("*."):
                if host.endswith(pattern[1:]) or host == pattern[2:]:
                    return True
            elif host == pattern:
                return True
            continue
        if addresses and all(a in net for a in addresses):
            return True
    return False


def _resolve(host: str) -> list[Any]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return []  # unresolvable now: the send fails and retries, it is not a refusal
    return list({ipaddress.ip_address(i[4][0].split("%")[0]) for i in infos})


def redact_target(entry: str) -> str:
    """A target without what may be a secret: ``https://hooks.slack.com/services/T/B/x`` →
    ``https://hooks.slack.com/…`` (user info, path, query and fragment dropped; the port
    kept), ``mailto:ops@example.com`` → ``mailto:…@example.com``. The entry was checked when
    saved (`check_target`)."""
    target = parse_target(entry)
    if target.kind == "email":
        return f"mailto:…@{target.address.rpartition('@')[2]}"
    parts = urlsplit(entry)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}/…"
