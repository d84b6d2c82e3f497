"""The client's address of a request, with forwarded headers trusted only from known proxies.

Called by the sign-in throttle (`xmc.auth.throttle`). The web server itself
never rewrites the peer address from ``X-Forwarded-For`` (its worker class,
`xmc.web_worker.UvicornWorker`, turns uvicorn's proxy headers off), so
``REMOTE_ADDR`` is always the address that opened the connection. Only when
that address is inside ``XMC_TRUSTED_PROXIES`` (comma-separated addresses or
CIDR networks; empty by default) is ``X-Forwarded-For`` read, from the right:
the first entry that is not itself a trusted proxy is the client. Anyone else
who sends the header is ignored, so the header cannot pick the address a
throttle counts.
"""
from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable

from django.conf import settings
from django.http import HttpRequest

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@functools.lru_cache(maxsize=8)
def _networks(spec: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(item.strip(), strict=False) for item in spec if item.strip())


def trusted_networks() -> tuple[Network, ...]:
    """``XMC_TRUSTED_PROXIES`` as networks (validated when `xmc.settings` loads)."""
    return _networks(tuple(settings.XMC_TRUSTED_PROXIES))


def _parse(value: str) -> Address | None:
    value = value.strip()
    if value.startswith("[") and "]" in value:  # "[2001:db8::1]:443"
        value = value[1:value.index("]")]
    elif value.count(":") == 1:  # "192.0.2.1:443"
        value = value.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _trusted(address: Address, networks: Iterable[Network]) -> bool:
    return any(address.version == net.version and address in net for net in networks)


def client_address(request: HttpRequest | None) -> str:
    """The address a throttle counts for ``request`` ("unknown" without one)."""
    if request is None:
        return "unknown"
    peer = _parse(str(request.META.get("REMOTE_ADDR") or ""))
    if peer is None:
        return "unknown"
    networks = trusted_networks()
    if not networks or not _trusted(peer, networks):
        return str(peer)
    client = peer
    forwarded = str(request.META.get("HTTP_X_FORWARDED_FOR") or "")
    for hop in reversed([part for part in forwarded.split(",") if part.strip()]):
        address = _parse(hop)
        if address is None:
            break  # garbage: stop at the last hop a trusted proxy vouched for
        client = address
        if not _trusted(address, networks):
            break
    return str(client)
