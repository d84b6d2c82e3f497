"""Lost access closes open event streams (issue 40, item 3).

The attack: Bob opens the experiment's event stream while Alice shares it
with him; Alice takes the share back (or an admin deactivates Bob), and Bob's
open stream must stop at once: it re-checks access before every event it
sends and at least every ``XMC_STREAM_RECHECK_S`` (short here), and ends
with a final ``denied`` event. Served by a real uvicorn on ``xmc.asgi``.
"""
from __future__ import annotations

import time
from typing import Any

import pytest
import requests
from django.contrib.auth.models import User

from experiments.models import Experiment
from tests import factories
from tests.ui import pages
from tests.ui.asgi_server import asgi_server  # noqa: F401 - fixture
from tests.ui.test_events import Reader
from xmc.auth.tokens import issue_token

pytestmark = pytest.mark.django_db(transaction=True)

ALICE, BOB = "alice@example.com", "bob@example.com"


@pytest.fixture(autouse=True)
def _short_recheck(settings: Any) -> None:
    settings.XMC_STREAM_RECHECK_S = 0.3


def _open(url: str, token: str) -> tuple[requests.Response, Reader]:
    response = requests.get(url, headers={"Accept": "text/event-stream", "Authorization": f"Bearer {token}"},
                            stream=True, timeout=10)
    assert response.status_code == 200, response.text[:300]
    reader = Reader(response)
    reader.start()
    reader.wait_for("hello")
    return response, reader


def _unshare(xid: int) -> None:
    Experiment.objects.filter(id=xid).update(acls={})  # Alice takes the share back (creator-only again)


def test_it_ends_bobs_open_stream_with_denied_once_the_share_is_taken_back_even_with_no_events(
        asgi_server: str) -> None:
    exp = factories.experiment(creator=ALICE, acls=pages.shared_with(BOB))
    factories.work_unit(exp)
    response, reader = _open(f"{asgi_server}/experiments/{exp.id}/events", issue_token(BOB))
    try:
        _unshare(exp.id)
        reader.wait_for("denied", timeout=3.0)  # no event was sent: the periodic re-check found it
    finally:
        response.close()


def test_it_sends_bob_no_state_change_after_the_share_is_taken_back(asgi_server: str, settings: Any) -> None:
    settings.XMC_STREAM_RECHECK_S = 60.0  # only the check before each event can catch it
    exp = factories.experiment(creator=ALICE, acls=pages.shared_with(BOB))
    factories.work_unit(exp)
    response, reader = _open(f"{asgi_server}/experiments/{exp.id}/events", issue_token(BOB))
    try:
        _unshare(exp.id)
        pages.move(exp.id, 1, 1, "SCHEDULING")
        reader.wait_for("denied", timeout=3.0)
        after_hello = reader.events[[e[1] for e in reader.events].index("hello") + 1:]  # (replays come before)
        assert [e[1] for e in after_hello] == ["denied"], reader.events
    finally:
        response.close()


def test_it_ends_the_stream_of_a_deactivated_user(asgi_server: str) -> None:
    exp = factories.experiment(creator=ALICE, acls=pages.shared_with(BOB))
    factories.work_unit(exp)
    pages.person("bob")
    session = requests.Session()
    login = session.get(f"{asgi_server}/login", timeout=10)
    csrf = session.cookies["csrftoken"]
    assert session.post(f"{asgi_server}/login", data={"username": "bob", "password": pages.PASSWORD,
                                                        "csrfmiddlewaretoken": csrf},
                        headers={"Referer": login.url}, timeout=10).status_code in (200, 302)
    response = session.get(f"{asgi_server}/experiments/{exp.id}/events", headers={"Accept": "text/event-stream"},
                           stream=True, timeout=10)
    assert response.status_code == 200, response.text[:300]
    reader = Reader(response)
    reader.start()
    try:
        reader.wait_for("hello")
        User.objects.filter(username="bob").update(is_active=False)
        reader.wait_for("denied", timeout=3.0)
    finally:
        response.close()
