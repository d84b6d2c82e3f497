"""A page of a live site as a signed-in person sees it, through the site's own sign-in form (``/login``)."""
from __future__ import annotations

import http.cookiejar
import re
import urllib.parse
import urllib.request


def page(ui: str, username: str, password: str, path: str) -> str:
    """``path`` of the site at ``ui`` after signing in as ``username`` (a cookie jar of its own)."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    with opener.open(f"{ui}/login", timeout=30) as form:
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.read().decode())
    assert token
    body = urllib.parse.urlencode({"csrfmiddlewaretoken": token.group(1), "username": username,
                                   "password": password, "next": "/experiments"}).encode()
    opener.open(urllib.request.Request(f"{ui}/login", data=body, headers={"Referer": f"{ui}/login"}), timeout=30)
    with opener.open(f"{ui}{path}", timeout=60) as answer:
        return str(answer.read().decode())
