"""``xmanager login --no-browser`` finished in a real browser, then a launch with the token it stored.

The unit test of the same flow (`test_login`) posts with Django's test
client, which sends no ``Origin`` header; Chromium does, and under a
``no-referrer`` policy it sends ``Origin: null``, which Django's CSRF check
refuses. Here the browser is Debian's headless ``chromium`` driven by
Playwright: it opens the URL the real command printed, signs in, presses
Authorize, and the code on the page is typed into the waiting command. The
command's cached token then launches a work unit with ``xmanager launch``.
At a phone's width (390 px) and a desktop's (1440 px); the pages'
screenshots go to docs/screenshots/.
"""
from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from experiments.models import Experiment
from tests.api.auth.cli_steps import PRINTED_LOGIN_URL, read_until
from tests.fixtures.browsers import needs_chromium
from tests.fixtures.people import PASSWORD
from tests.system.real_client.conftest import ALICE, Client
from workunits.models import WorkUnit

SHOTS = Path(__file__).resolve().parents[3] / "docs" / "screenshots"
pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]

LAUNCH = """
from absl import app
from xmanager import xm, xm_cloud
from xmanager.xm_local import executables


def main(_):
    experiment = xm_cloud.create_experiment(experiment_title="signed in from the browser")
    with experiment:
        experiment.add(
            xm.Job(
                executable=executables.GoogleContainerRegistryImage(name="t", image_path="gcr.io/proj/t:v1"),
                executor=xm_cloud.KubernetesJobExecutor(requirements=xm.JobRequirements(cpu=1, memory=xm.GiB)),
                name="t",
            ),
            settings=xm_cloud.WorkUnitSettings(),
        )
    report({"id": experiment.id})

if __name__ == "__main__":
    app.run(main)
"""


@pytest.mark.parametrize(("width", "height", "name"), [(390, 844, "phone"), (1440, 900, "desktop")])
def test_it_logs_the_real_cli_in_through_chromium_and_launches_with_the_token(
    make_client: Callable[..., Client],
    alice: Any,
    live_server: Any,
    browser: Any,
    tmp_path: Path,
    width: int,
    height: int,
    name: str,
) -> None:
    client = make_client(None)  # holds no token: everything below rests on the login
    credentials = tmp_path / "credentials.json"
    cli = subprocess.Popen(
        [str(client.venv / "bin" / "xmanager"), "login", "--no-browser"],
        cwd=client.workdir,
        env=client.env(XMANAGER_ENDPOINT=None, XMC_API_URL=live_server.url, XMC_CREDENTIALS_FILE=str(credentials)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # no controlling tty: getpass reads the code from stdin
    )
    assert cli.stdin is not None and cli.stdout is not None
    printed: list[str] = []
    refused: list[str] = []
    try:
        url = read_until(cli.stdout, PRINTED_LOGIN_URL, printed, timeout_s=60).group(1)
        page = browser.new_page(viewport={"width": width, "height": height})
        page.on("response", lambda r: refused.append(f"{r.status} {r.url}") if r.status == 403 else None)
        page.goto(url)
        page.wait_for_selector("#id_username")
        page.screenshot(path=str(SHOTS / f"cli-signin-{name}.png"), full_page=True)
        page.fill("#id_username", "alice")
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_selector("button[name=authorize]")
        assert ALICE in page.inner_text("body")
        page.screenshot(path=str(SHOTS / f"cli-authorize-{name}.png"), full_page=True)
        page.click("button[name=authorize]")
        page.wait_for_selector("#code")
        page.screenshot(path=str(SHOTS / f"cli-code-{name}.png"), full_page=True)
        code = page.inner_text("#code").strip()
        # The pages are styled like the others: the site's stylesheet, no bare browser defaults.
        assert page.evaluate("getComputedStyle(document.documentElement).backgroundColor") == "rgb(247, 248, 250)"
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        cli.stdin.write(code + "\n")
        cli.stdin.flush()
        rest, _ = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    output = "".join(printed) + rest
    assert refused == []
    assert cli.returncode == 0, output
    assert f"as {ALICE}" in output
    assert list(json.loads(credentials.read_text())["deployments"]) == [live_server.url]

    script = client.write("launch.py", LAUNCH)
    run = client.xmanager(
        "launch", str(script), XMC_API_URL=live_server.url, XMC_CREDENTIALS_FILE=str(credentials)
    ).ok()
    xid = run.result["id"]
    assert Experiment.objects.get(id=xid).creator == ALICE
    assert WorkUnit.objects.filter(experiment_id=xid).count() == 1
