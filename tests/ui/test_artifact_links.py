"""Links into the site are built from the configured origin when read, never stored absolute.

The real client gives an artifact the work unit's page as its link, made from
``XMANAGER_UI_URL`` (``http://127.0.0.1:8000/experiments/3/workUnits/1``). Kept
as it came, that link breaks the day the site moves (another port after a
restart, a new domain). ``artifacts.wire`` keeps it site-relative and gives it
``XMC_PUBLIC_URL`` again on every read: the API's messages and the pages.
"""
from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from artifacts import services as artifact_services
from artifacts.models import Artifact
from artifacts.wire import artifact_to_proto
from core import pb
from tests import factories
from tests.ui import pages

pytestmark = pytest.mark.django_db


def _with_link(xid: int, wid: int, url: str) -> Artifact:
    message = pb.artifact.Artifact(url=pb.url.Url(url=url, display_name="profile"))
    return artifact_services.create_artifact(xid, wid, message)


def test_it_keeps_a_link_into_the_site_relative_and_serves_it_from_the_current_origin(
        settings: Any, client: Client) -> None:
    settings.XMC_PUBLIC_URL = "http://127.0.0.1:8000"
    exp = factories.experiment(creator="alice@example.com")
    factories.work_unit(exp, wid=1)
    own = _with_link(exp.id, 1, f"http://127.0.0.1:8000/experiments/{exp.id}/workUnits/1?tab=logs")
    elsewhere = _with_link(exp.id, 1, "https://tensorboard.example.com/run/7")
    assert Artifact.objects.get(id=own.id).url["url"] == f"/experiments/{exp.id}/workUnits/1?tab=logs"
    assert Artifact.objects.get(id=elsewhere.id).url["url"] == "https://tensorboard.example.com/run/7"

    # The site restarts on another port: every read says the new address.
    settings.XMC_PUBLIC_URL = "http://127.0.0.1:8123/"
    served = artifact_to_proto(Artifact.objects.get(id=own.id)).url
    assert (served.url, served.display_name) == (f"http://127.0.0.1:8123/experiments/{exp.id}/workUnits/1?tab=logs",
                                                 "profile")
    assert artifact_to_proto(Artifact.objects.get(id=elsewhere.id)).url.url == "https://tensorboard.example.com/run/7"
    page = pages.signed_in("alice", client).get(f"/experiments/{exp.id}/workUnits/1").content.decode()
    assert f'href="http://127.0.0.1:8123/experiments/{exp.id}/workUnits/1?tab=logs"' in page
    assert "127.0.0.1:8000" not in page
