"""Which URLs a webhook or Slack subscription may call, and the address a send connects to
(SSRF protection). Called by ``notifications.services`` when a subscription is written and by
``notifications.channels`` right before every send.

The policy is an allow-list, not a deny-list:

* only ``http`` and ``https``, with a host, without user info;
* every address the host resolves to must be a **globally routable unicast**
  address (:func:`refusal`: ``ipaddress``'s ``is_global`` and not multicast),
  and the IPv4 address carried inside an IPv6 one (IPv4-mapped ``::ffff:a.b.c.d``,
  IPv4-compatible ``::a.b.c.d``, 6to4 ``2002::/16``, Teredo ``2001::/32``,
  NAT64 ``64:ff9b::/96``) must be one too: ``2002:a9fe:a9fe::`` is the cloud
  metadata address 169.254.169.254 however global its prefix looks;
* the only exception is ``XMC_WEBHOOK_ALLOWED_HOSTS`` (host names or
  addresses), the documented local setting a development system uses to reach
  a receiver on loopback.

The check is made on the address the send connects to: :func:`resolve` looks
the host up **once** and returns a :class:`Target` pinned to the first
address, and ``notifications.channels`` connects to that address (the URL's
host still goes in the ``Host`` header and the TLS SNI, and the certificate is
checked against it). No second lookup happens between the check and the
connection, so a DNS answer that changes in between (DNS rebinding) changes
nothing.
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

from core.errors import InvalidArgument

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")


def _allowed_hosts() -> set[str]:
    return {h.strip().lower() for h in settings.XMC_WEBHOOK_ALLOWED_HOSTS if h.strip()}


def _embedded(ip: ipaddress.IPv6Address) -> list[tuple[str, ipaddress.IPv4Address]]:
    """The IPv4 addresses an IPv6 address carries (and in which form), to be checked as well."""
    found: list[tuple[str, ipaddress.IPv4Address]] = []
    if ip.ipv4_mapped is not None:
        found.append(("IPv4-mapped", ip.ipv4_mapped))
    if ip.sixtofour is not None:
        found.append(("6to4", ip.sixtofour))
    if ip.teredo is not None:
        server, client = ip.teredo
        found += [("Teredo server", server), ("Teredo client", client)]
    if ip in _NAT64:
        found.append(("NAT64", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)))
    if ip in _IPV4_COMPATIBLE and int(ip) > 1:  # ::a.b.c.d (deprecated); :: and ::1 are refused on their own
        found.append(("IPv4-compatible", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)))
    return found


def _kind(ip: IPAddress) -> str:
    """A word for why an address is not globally routable unicast (for the error message)."""
    if ip.is_loopback:
        return "loopback"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED:
        return "shared address space (100.64.0.0/10)"
    if ip.is_private:
        return "private"
    if ip.is_reserved:
        return "reserved"
    return "not globally routable"


def refusal(address: str | IPAddress) -> str | None:
    """Why a webhook may not connect to ``address`` (None: a globally routable unicast address)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0]) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address):  # the embedded address first: it is where the packet goes
        for form, inner in _embedded(ip):
            why = refusal(inner)
            if why is not None:
                return f"{form} form of {inner}, {why}"
    if not ip.is_global or ip.is_multicast:
        return _kind(ip)
    return None


@dataclass(frozen=True)
class Target:
    """A checked URL pinned to the address a send connects to."""

    url: str
    scheme: str
    #: The URL's host (lower case, IPv6 without brackets): the TLS SNI and the certificate's name.
    host: str
    port: int
    #: The ``Host`` header: the URL's authority as written.
    host_header: str
    #: Path and query to request.
    path: str
    #: The checked address the connection goes to (no second lookup).
    address: str


def _parse(url: str, field: str) -> tuple[str, str, int, str, str]:
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
    if any(ord(c) < 0x21 or c == "\x7f" for c in url):
        raise InvalidArgument(f"{field} must not contain spaces or control characters", field=field)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, host, port or (443 if parts.scheme == "https" else 80), parts.netloc, path


def resolve(url: str, *, field: str) -> Target:
    """Resolve the URL's host once and check every address; the target pinned to the first.

    INVALID_ARGUMENT naming ``field`` when the URL is malformed, does not
    resolve, or any address it resolves to is refused (:func:`refusal`) and
    not listed in ``XMC_WEBHOOK_ALLOWED_HOSTS``.
    """
    scheme, host, port, netloc, path = _parse(url, field)
    allowed = _allowed_hosts()
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise InvalidArgument(f"{field}: the host {host!r} does not resolve ({exc})", field=field) from None
    addresses: list[str] = []
    for info in infos:
        address = str(info[4][0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise InvalidArgument(f"{field}: the host {host!r} has no address", field=field)
    for address in addresses:
        if host in allowed or address.lower() in allowed:
            continue
        why = refusal(address)
        if why is not None:
            raise InvalidArgument(
                f"{field}: the host {host!r} resolves to {address} ({why}); webhooks may only call globally "
                "routable addresses (XMC_WEBHOOK_ALLOWED_HOSTS lists local exceptions)", field=field)
    return Target(url=url, scheme=scheme, host=host, port=port, host_header=netloc, path=path,
                  address=addresses[0])


def check_url(url: str, *, field: str) -> str:
    """The URL if it may be called now; INVALID_ARGUMENT naming ``field`` otherwise (when a
    subscription is written; a send checks again, on the address it connects to)."""
    return resolve(url, field=field).url

