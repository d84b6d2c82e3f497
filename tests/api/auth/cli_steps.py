"""The HTTP requests the real `xmanager login` makes, step by step (the real xmanager client's behaviour, tests/system/real_client).

Mirrors `xmanager/xm_cloud/cli/login_command.py` of xmanager 0.8.5.post1:
`build_login_url` puts the parameters in this order, the exchange is a form
POST with ``Accept: application/json``, and a grant is accepted only if it
passes the same checks as the CLI's `exchange_code`. Written independently,
so the tests do not depend on the CLI's private functions.
"""
from __future__ import annotations

import base64
import hashlib
import re
import threading
import secrets
from typing import Any
from urllib.parse import urlencode

from django.test import Client

CODE_ON_PAGE = re.compile(r'<p class="code" id="code">([^<]+)</p>')
CSRF_FIELD = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def pkce_pair() -> tuple[str, str]:
    """(code_verifier, S256 code_challenge), as RFC 7636 and the CLI make them."""
    verifier = secrets.token_urlsafe(32)
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def login_path(state: str, challenge: str, *, port: int | None = None, method: str = "S256") -> str:
    """``/api/cli/login?...`` with the CLI's parameter order: port|mode, state, challenge, method."""
    params = [("port", str(port))] if port is not None else [("mode", "manual")]
    params += [("state", state), ("code_challenge", challenge), ("code_challenge_method", method)]
    return f"/api/cli/login?{urlencode(params)}"


def csrf_token_of(page: Any) -> str:
    match = CSRF_FIELD.search(page.content.decode())
    assert match, page.content
    return match.group(1)


def authorize(client: Client, path: str, button: str = "authorize") -> Any:
    """What the signed-in user does in the browser: open the page, press Authorize.

    The form's CSRF token goes along, so this works with
    ``Client(enforce_csrf_checks=True)`` as a real browser would.
    """
    page = client.get(path)
    assert page.status_code == 200, page.content
    assert b"Authorize" in page.content
    return client.post(path, {button: "1", "csrfmiddlewaretoken": csrf_token_of(page)})


def code_from_page(response: Any) -> str:
    match = CODE_ON_PAGE.search(response.content.decode())
    assert match, response.content
    return match.group(1)


def exchange(client: Client, code: str, verifier: str, grant_type: str = "authorization_code") -> Any:
    """``POST /api/cli/token`` exactly as the CLI sends it."""
    return client.post(
        "/api/cli/token",
        data=urlencode({"grant_type": grant_type, "code": code, "code_verifier": verifier}),
        content_type="application/x-www-form-urlencoded",
        HTTP_ACCEPT="application/json",
    )


def cli_accepts_grant(body: dict[str, Any]) -> bool:
    """The CLI's own validity check of a token response ("Malformed token response" otherwise)."""
    token, email, expires_in = body.get("access_token"), body.get("email"), body.get("expires_in")
    return (
        isinstance(token, str)
        and bool(token)
        and isinstance(email, str)
        and bool(email)
        and isinstance(expires_in, int)
        and not isinstance(expires_in, bool)
        and expires_in > 0
        and str(body.get("token_type", "")).lower() == "bearer"
    )


#: The sign-in URL `xmanager login --no-browser` prints for the user to open.
PRINTED_LOGIN_URL = re.compile(r"(https?://\S+/api/cli/login\?mode=manual\S+)")


def read_until(stream: Any, pattern: re.Pattern[str], seen: list[str], timeout_s: float) -> re.Match[str]:
    """Read lines from ``stream`` until one matches (in a thread, so a silent CLI cannot hang the test)."""
    found: list[re.Match[str]] = []

    def read() -> None:
        for line in stream:
            seen.append(line)
            match = pattern.search(line)
            if match:
                found.append(match)
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout_s)
    assert found, "".join(seen)
    return found[0]
