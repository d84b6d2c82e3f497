"""`xmc` with no token but the credentials file the real ``xmanager login --no-browser`` wrote.

The real ``xmanager`` command (xmanager 0.8.5.post1, tests/system/real_client's
virtualenv) logs Alice in against ``live_server``: her browser (Django's test
client, signed in) opens the printed URL, presses Authorize and reads the
code, which is typed into the CLI. The installed ``xmc`` then reads the file
the way the launch client does: the default XDG path, the entry of the
origin in ``XMC_API_URL``, its expiry.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.test import Client as BrowserClient

from tests import factories
from tests.api.auth.cli_steps import PRINTED_LOGIN_URL, authorize, code_from_page, read_until
from tests.system.cli.runner import ALICE, Xmc
from tests.system.real_client.client_env import ensure_client_venv

pytestmark = pytest.mark.django_db(transaction=True)




def _login(venv: Path, home: Path, api: str, alice: Any) -> str:
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
           "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1", "XMC_API_URL": api}
    cli = subprocess.Popen([str(venv / "bin" / "xmanager"), "login", "--no-browser"], cwd=home, env=env,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)  # no controlling tty: getpass reads the code from stdin
    assert cli.stdin is not None and cli.stdout is not None
    printed: list[str] = []
    try:
        url = read_until(cli.stdout, PRINTED_LOGIN_URL, printed, timeout_s=60).group(1)
        browser = BrowserClient(enforce_csrf_checks=True)
        browser.force_login(alice)
        split = urlsplit(url)
        cli.stdin.write(code_from_page(authorize(browser, f"{split.path}?{split.query}")) + "\n")
        cli.stdin.flush()
        rest, _ = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    output = "".join(printed) + rest
    assert cli.returncode == 0, output
    return output


def test_it_uses_the_login_the_real_xmanager_cli_saved(live_server: Any, alice: Any, tmp_path: Path) -> None:
    from tests.system.cli.cli_env import ensure_cli_venv

    experiment = factories.experiment(title="logged in", creator=ALICE)
    factories.work_unit(experiment)
    stranger = factories.experiment(title="not alice's", creator="bob@example.com")
    home = tmp_path / "home"
    (home / ".config").mkdir(parents=True)
    api = live_server.url

    output = _login(ensure_client_venv(), home, api, alice)
    assert f"as {ALICE}" in output
    credentials = home / ".config" / "xmc" / "credentials.json"
    assert api.lower() in json.loads(credentials.read_text())["deployments"]

    xmc = Xmc(ensure_cli_venv(), home, api)
    no_token = {"XDG_CONFIG_HOME": str(home / ".config")}
    status = xmc("status", str(experiment.id), token=None, **no_token).ok()
    assert status.stdout.splitlines()[0] == f"Experiment {experiment.id}  logged in"
    assert "owner alice@example.com" in status.stdout
    listed = xmc("list", "--mine", "--json", token=None, **no_token).ok().json["experiments"]
    assert [e["xid"] for e in listed] == [experiment.id]  # --mine: the email of the saved login
    refused = xmc("status", str(stranger.id), token=None, **no_token)
    assert refused.returncode == 4 and refused.stderr.strip() == f"xmc: experiment {stranger.id} not found"

    # The entry is per origin: the same server under another spelling of its origin has no login.
    other = xmc("list", token=None, XMC_API_URL=api.replace("localhost", "127.0.0.1"), **no_token)
    assert other.returncode == 4 and "not logged in to" in other.stderr and "run xmanager login" in other.stderr

    # Expiry is honoured with the client's 60 s margin.
    data = json.loads(credentials.read_text())
    data["deployments"][api.lower()]["expires_at"] = int(time.time()) + 30
    credentials.write_text(json.dumps(data))
    expired = xmc("status", str(experiment.id), token=None, **no_token)
    assert expired.returncode == 4 and "expired: run xmanager login" in expired.stderr

    # A file others can read is refused, naming it.
    os.chmod(credentials, 0o644)
    loose = xmc("list", token=None, **no_token)
    assert loose.returncode == 4 and str(credentials) in loose.stderr and "0600" in loose.stderr

    # XMC_AUTH_TOKEN wins over the file, as in the launch client.
    bad = xmc("list", token="not-a-token", **no_token)
    assert bad.returncode == 4 and "XMC_AUTH_TOKEN was refused" in bad.stderr
