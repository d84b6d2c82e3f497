"""Where XMC is and who we are: the same rules as the launch client.

The REST origin is ``XMC_API_URL``, else ``XMANAGER_UI_URL`` (else ``XMC_DOMAIN``,
else ``https://<domain>`` for an ``XMANAGER_ENDPOINT`` of ``grpc.<domain>``),
normalised exactly as xmanager 0.8.5.post1 does in
``xmanager_cloud/experiment_state_server/experiment_state_api.py``
(``_resolve_xmc_origin``): scheme and host lower-cased, no path.

The token is ``XMC_AUTH_TOKEN`` when set, else the entry for that origin in
the credentials file ``xmanager login`` writes: ``$XMC_CREDENTIALS_FILE``
(absolute), else ``$XDG_CONFIG_HOME/xmc/credentials.json`` (absolute), else
``~/.config/xmc/credentials.json``; ``{"version": 1, "deployments": {origin:
{"access_token", "email", "expires_at"}}}``, a 0600 regular file, the entry
used only while ``expires_at`` is more than 60 s away (the client's buffer).
"""
from __future__ import annotations

import base64
import json
import math
import os
import stat
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xmc_cli.errors import CliError, Unauthenticated

EXPIRY_BUFFER_S = 60.0
_LOOPBACK = ("localhost", "127.0.0.1", "::1")


def _grpc_host(endpoint: str) -> str:
    target = endpoint.strip().lower().removeprefix("dns:///")
    try:
        return urllib.parse.urlsplit(f"//{target}").hostname or ""
    except ValueError:
        return ""


def resolve_origin(env: Mapping[str, str]) -> str:
    """The deployment's origin (``http://127.0.0.1:8000``), or a CliError saying what to set."""
    raw = (env.get("XMC_API_URL", "").strip() or env.get("XMANAGER_UI_URL", "").strip()
           or env.get("XMC_DOMAIN", "").strip())
    if not raw:
        host = _grpc_host(env.get("XMANAGER_ENDPOINT", ""))
        if host.startswith("grpc.") and host != "grpc.":
            return f"https://{host.removeprefix('grpc.')}"
        raise CliError("no XMC server: set XMC_API_URL (e.g. XMC_API_URL=http://127.0.0.1:8000, as ./dev run prints)")
    parts = urllib.parse.urlsplit(raw if "://" in raw else f"https://{raw}")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise CliError(f"invalid XMC_API_URL {raw!r}: bad port") from None
    if (parts.scheme.lower() not in ("http", "https") or not parts.hostname
            or any((parts.username, parts.password, parts.query, parts.fragment))):
        raise CliError(f"invalid XMC_API_URL {raw!r}: expected http(s)://host[:port]")
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


def ui_base(env: Mapping[str, str], origin: str) -> str:
    """Where the researcher pages are: ``XMANAGER_UI_URL`` when set, else the API origin."""
    ui = env.get("XMANAGER_UI_URL", "").strip().rstrip("/")
    return ui if ui.startswith(("http://", "https://")) else origin


def credentials_path(env: Mapping[str, str]) -> Path:
    custom = os.path.expanduser(env.get("XMC_CREDENTIALS_FILE", "").strip())
    if os.path.isabs(custom):
        return Path(custom)
    xdg = env.get("XDG_CONFIG_HOME", "").strip()
    if os.path.isabs(xdg):
        return Path(xdg) / "xmc" / "credentials.json"
    home = env.get("HOME", "").strip()
    return (Path(home) if os.path.isabs(home) else Path.home()) / ".config" / "xmc" / "credentials.json"


def read_deployments(path: Path) -> dict[str, Any]:
    """The ``deployments`` map of a credentials file ({} when there is none).

    A file that is not a 0600 regular file, or not the version-1 schema, is
    an error naming the file (the launch client ignores it with a warning; a
    command line should say why it does not use it).
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise CliError(f"cannot read the credentials file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or (st.st_mode & 0o077):
            raise CliError(f"refusing the credentials file {path}: mode {oct(stat.S_IMODE(st.st_mode))}, "
                           "it must be 0600 (chmod 600 it, or run xmanager login again)")
        try:
            data = json.load(f)
        except ValueError:
            raise CliError(f"the credentials file {path} is not JSON: run xmanager logout --all, then xmanager login") from None
    if not isinstance(data, dict) or data.get("version") != 1:
        raise CliError(f"the credentials file {path} has an unknown format: run xmanager login")
    deployments = data.get("deployments")
    return deployments if isinstance(deployments, dict) else {}


@dataclass(frozen=True)
class Identity:
    origin: str
    token: str
    email: str  # "" when the token carries none
    source: str  # "XMC_AUTH_TOKEN" or the credentials file path


def email_of_token(token: str) -> str:
    """The email claim of a JWT, unverified (the server verifies; this only fills ``--mine``)."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return ""
    if not isinstance(claims, dict):
        return ""
    for claim in ("email", "preferred_username", "sub"):
        value = claims.get(claim)
        if isinstance(value, str) and "@" in value:
            return value
    return ""


def identity(env: Mapping[str, str], now: float | None = None) -> Identity:
    origin = resolve_origin(env)
    token = env.get("XMC_AUTH_TOKEN", "").strip()
    if token:
        return Identity(origin, token, email_of_token(token), "XMC_AUTH_TOKEN")
    path = credentials_path(env)
    entry = read_deployments(path).get(origin)
    if not isinstance(entry, dict):
        raise Unauthenticated(f"not logged in to {origin}: run xmanager login (with XMC_API_URL={origin})")
    saved, expires_at = entry.get("access_token"), entry.get("expires_at")
    if (not isinstance(saved, str) or not saved.strip() or isinstance(expires_at, bool)
            or not isinstance(expires_at, (int, float)) or not math.isfinite(expires_at)):
        raise Unauthenticated(f"the login for {origin} in {path} is incomplete: run xmanager login")
    if expires_at <= (time.time() if now is None else now) + EXPIRY_BUFFER_S:
        raise Unauthenticated(f"your login to {origin} has expired: run xmanager login")
    email = entry.get("email")
    return Identity(origin, saved.strip(), email if isinstance(email, str) and email else email_of_token(saved), str(path))
