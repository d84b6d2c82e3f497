"""The real `xmanager login` code (xmanager 0.8.5.post1) against a live XMC web server.

`login_command.py` from the installed wheel uses only the standard library,
so we load that file as is -- without `xmanager.xm_cloud`'s heavy package
imports -- and call its `run_login` exactly as the `xmanager login` entry
point does, injecting only the two things a terminal provides: the browser
(`open_url`) and the pasted code (`prompt`). Its probe, its exchange and (in
loopback mode) its callback listener are the CLI's own code, talking real HTTP
to `live_server`.

The browser is Django's test client, signed in as Alice; it follows the pages
a person would click through (confirm, read the code).
"""
from __future__ import annotations

import importlib.util
import io
import json
import re
import stat
import threading
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.db import connections
from django.test import Client

from tests.api.auth.cli_steps import authorize, code_from_page
from xmc.auth.identity import authenticate_bearer

pytestmark = pytest.mark.django_db(transaction=True)

PRINTED_LOGIN_URL = re.compile(r"(https?://\S+/api/cli/login\?\S+)")


def _real_login_command() -> ModuleType:
    spec = importlib.util.find_spec("xmanager")
    assert spec is not None and spec.submodule_search_locations, "pip install -r requirements-xmanager.txt"
    path = Path(list(spec.submodule_search_locations)[0]) / "xm_cloud" / "cli" / "login_command.py"
    module_spec = importlib.util.spec_from_file_location("real_xmanager_login_command", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _path_of(url: str) -> str:
    split = urlsplit(url)
    return f"{split.path}?{split.query}"


def _stored_grant(credentials: Path, origin: str) -> dict[str, Any]:
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
    return json.loads(credentials.read_text())["deployments"][origin]


def test_it_logs_the_real_cli_in_with_a_pasted_code(live_server: Any, alice: Any, tmp_path: Path) -> None:
    cli = _real_login_command()
    credentials = tmp_path / "credentials.json"
    env = {"XMC_API_URL": live_server.url, "XMC_CREDENTIALS_FILE": str(credentials)}
    out, err = io.StringIO(), io.StringIO()
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)

    def alice_pastes_the_code(prompt: str) -> str:
        printed = PRINTED_LOGIN_URL.search(out.getvalue())
        assert printed, out.getvalue()
        assert printed.group(1).startswith(f"{live_server.url}/api/cli/login?mode=manual&state=")
        return code_from_page(authorize(browser, _path_of(printed.group(1))))

    def no_browser(url: str) -> bool:
        raise AssertionError("--no-browser must not open a browser")

    status = cli.run_login(["--no-browser"], env=env, out=out, err=err, open_url=no_browser, prompt=alice_pastes_the_code)

    assert status == 0, err.getvalue()
    assert "Logged in to" in out.getvalue() and "as alice@example.com" in out.getvalue()
    grant = _stored_grant(credentials, live_server.url)
    assert grant["email"] == "alice@example.com"
    assert authenticate_bearer(f"Bearer {grant['access_token']}").email == "alice@example.com"

    printed = io.StringIO()
    assert cli.run_login(["--print-token"], env=env, out=printed, err=err) == 0
    assert printed.getvalue().strip() == grant["access_token"]


def _run_loopback_login(live_server: Any, user: Any, tmp_path: Path, button: str) -> tuple[int, str, list[Any]]:
    """Run the real CLI in browser mode; the 'browser' presses ``button`` on the consent page."""
    cli = _real_login_command()
    env = {
        "XMC_API_URL": live_server.url,
        "XMC_CREDENTIALS_FILE": str(tmp_path / "credentials.json"),
        "DISPLAY": ":0",  # a GUI is present and there is no SSH_*: the CLI picks browser mode
    }
    out, err = io.StringIO(), io.StringIO()
    landed: list[Any] = []
    browsers: list[threading.Thread] = []

    def open_url(url: str) -> bool:
        def browse() -> None:
            try:
                browser = Client(enforce_csrf_checks=True)
                browser.force_login(user)
                to_cli = authorize(browser, _path_of(url), button=button)
                assert to_cli.status_code == 302
                # The CLI's listener answers with a redirect to our success page.
                with urllib.request.urlopen(to_cli["Location"], timeout=10) as page:
                    landed.append((page.geturl(), page.read().decode()))
            except BaseException as exc:  # noqa: BLE001 - reported by the test below
                landed.append(exc)
            finally:
                connections.close_all()

        assert url.startswith(f"{live_server.url}/api/cli/login?port=")
        thread = threading.Thread(target=browse)
        thread.start()
        browsers.append(thread)
        return True

    status = cli.run_login(["--timeout", "30"], env=env, out=out, err=err, open_url=open_url)
    for thread in browsers:
        thread.join(timeout=30)
    return status, err.getvalue() + out.getvalue(), landed


def test_it_logs_the_real_cli_in_through_the_browser_and_its_loopback_listener(
    live_server: Any, alice: Any, tmp_path: Path
) -> None:
    status, output, landed = _run_loopback_login(live_server, alice, tmp_path, "authorize")

    assert status == 0, output
    [(final_url, page)] = landed
    assert final_url == f"{live_server.url}/api/cli/success"
    assert "You are signed in" in page
    grant = _stored_grant(tmp_path / "credentials.json", live_server.url)
    assert authenticate_bearer(f"Bearer {grant['access_token']}").email == "alice@example.com"


def test_it_tells_the_real_cli_when_alice_declines(live_server: Any, alice: Any, tmp_path: Path) -> None:
    status, output, landed = _run_loopback_login(live_server, alice, tmp_path, "deny")

    assert status == 1
    assert "Authentication failed: access_denied" in output
    [(final_url, page)] = landed
    assert final_url.startswith(f"{live_server.url}/api/cli/success?error=access_denied")
    assert "Sign-in failed" in page
    assert not (tmp_path / "credentials.json").exists()
