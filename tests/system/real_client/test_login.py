"""``xmanager login --no-browser``, then the API with nothing but the cached token (contract 1.6, 8 step 9).

The real ``xmanager`` command runs as a subprocess in its own session (no
controlling terminal, so its getpass prompt reads the code from stdin), with
``XMANAGER_ENDPOINT`` unset and ``XMC_API_URL`` pointing at ``live_server``.
Alice's browser is Django's test client, signed in: it opens the printed
login URL, presses Authorize and reads the one-time code, which is typed
into the CLI. Then an ESS call with only ``XMANAGER_ENDPOINT`` (and
``XMC_API_URL``, from which the client derives the credentials' origin) set.
"""
from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.test import Client as BrowserClient

from experiments.models import Experiment
from tests.api.auth.cli_steps import PRINTED_LOGIN_URL, authorize, code_from_page, read_until
from tests.system.real_client.conftest import ALICE, Client

pytestmark = pytest.mark.django_db(transaction=True)




def test_it_logs_the_real_cli_in_and_calls_the_api_with_only_the_cached_token(
    make_client: Callable[..., Client], alice: Any, live_server: Any, tmp_path: Path
) -> None:
    client = make_client(None)  # holds no token: everything below rests on the login
    credentials = tmp_path / "credentials.json"
    login_env = client.env(
        XMANAGER_ENDPOINT=None, XMC_API_URL=live_server.url, XMC_CREDENTIALS_FILE=str(credentials)
    )
    cli = subprocess.Popen(
        [str(client.venv / "bin" / "xmanager"), "login", "--no-browser"],
        cwd=client.workdir,
        env=login_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # no controlling tty: getpass falls back to stdin
    )
    assert cli.stdin is not None and cli.stdout is not None
    printed: list[str] = []
    try:
        url = read_until(cli.stdout, PRINTED_LOGIN_URL, printed, timeout_s=60).group(1)
        assert url.startswith(f"{live_server.url}/api/cli/login?mode=manual&state=")

        browser = BrowserClient(enforce_csrf_checks=True)
        browser.force_login(alice)
        split = urlsplit(url)
        code = code_from_page(authorize(browser, f"{split.path}?{split.query}"))
        cli.stdin.write(code + "\n")
        cli.stdin.flush()
        rest, _ = cli.communicate(timeout=60)  # closes stdin, reads the rest
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    output = "".join(printed) + rest
    assert cli.returncode == 0, output
    assert f"as {ALICE}" in output
    stored = json.loads(credentials.read_text())
    assert list(stored["deployments"]) == [live_server.url]

    status = client.xmanager(
        "login", "--status", XMANAGER_ENDPOINT=None, XMC_API_URL=live_server.url, XMC_CREDENTIALS_FILE=str(credentials)
    ).ok()
    assert ALICE in status.stdout + status.stderr

    # The ESS client with the http endpoint and no XMC_AUTH_TOKEN: the cached token is used.
    call = client.python(
        """
        from xmanager import xm_cloud
        exp = xm_cloud.create_experiment(experiment_title="logged in")
        report({"id": exp.id, "author": exp.author})
        """,
        XMC_API_URL=live_server.url,
        XMC_CREDENTIALS_FILE=str(credentials),
    ).ok()
    assert call.result["author"] == ALICE
    assert Experiment.objects.get(id=call.result["id"]).creator == ALICE

    # logout forgets the token: the same call now carries none and is refused.
    client.xmanager(
        "logout", XMANAGER_ENDPOINT=None, XMC_API_URL=live_server.url, XMC_CREDENTIALS_FILE=str(credentials)
    ).ok()
    refused = client.python(
        """
        import grpc
        from xmanager import xm_cloud
        try:
            xm_cloud.create_experiment()
        except grpc.RpcError as exc:
            report({"code": exc.code().name})
        """,
        XMC_API_URL=live_server.url,
        XMC_CREDENTIALS_FILE=str(credentials),
        XMC_USER_EMAIL=ALICE,  # an email alone, no token (contract 1.4 row 3)
    ).ok()
    assert refused.result == {"code": "UNAUTHENTICATED"}
