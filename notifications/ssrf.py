"""Which URLs a webhook or Slack subscription may call (SSRF protection).

* only ``http`` and ``https``, with a host, without user info;
* every address the host resolves to must be public (not private, loopback,
  link-local, multicast, reserved or unspecified), unless the host (name or
  address) is listed in ``XMC_WEBHOOK_ALLOWED_HOSTS``.

Checked when a subscription is created or changed (``field`` names the
request field) and again right before every send, on a fresh resolution.
"""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings

from core.errors import InvalidArgument


def _allowed_hosts() -> set[str]:
    return {h.strip().lower() for h in settings.XMC_WEBHOOK_ALLOWED_HOSTS if h.strip()}


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast
                or ip.is_reserved or ip.is_unspecified)


def check_url(url: str, *, field: str, resolve: bool = True) -> str:
    """The URL if it may be called; INVALID_ARGUMENT naming ``field`` otherwise."""
    if not isinstance(url, str) or not url:
        raise InvalidArgument(f"{field} is required", field=field)
    if len(url) > 2048:
        raise InvalidArgument(f"{field} is longer than 2048 characters", field=field)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidArgument(f"{field} is not a valid URL: {exc}", field=field) from None
    if parts.scheme not in ("http", "https"):
        raise InvalidArgument(f"{field} must be an http or https URL, not {parts.scheme or 'none'!r}", field=field)
    host = (parts.hostname or "").lower()
    if not host:
        raise InvalidArgument(f"{field} has no host", field=field)
    if parts.username is not None or parts.password is not None:
        raise InvalidArgument(f"{field} must not carry a user name or password", field=field)
    if not resolve:
        return url
    if host in _allowed_hosts():
        return url
    try:
        infos = socket.getaddrinfo(host, port or (443 if parts.scheme == "https" else 80), type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise InvalidArgument(f"{field}: the host {host!r} does not resolve ({exc})", field=field) from None
    for info in infos:
        address = str(info[4][0])
        if address.lower() in _allowed_hosts():
            continue
        if not _public(address):
            raise InvalidArgument(
                f"{field}: the host {host!r} resolves to {address}, a private, loopback or link-local "
                "address; webhooks may not target internal addresses (XMC_WEBHOOK_ALLOWED_HOSTS lists exceptions)",
                field=field)
    return url


def endpoint_of(url: str) -> str:
    """``scheme://host:port``: the unit the circuit breaker counts failures by."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"
