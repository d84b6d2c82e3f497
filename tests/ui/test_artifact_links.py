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


def test_it_opens_a_code_source_and_sends_the_xprof_chip_to_the_profile(settings: Any, client: Client) -> None:
    settings.XMC_PUBLIC_URL = "http://127.0.0.1:8000"
    settings.XMC_MLRUN_PROJECT, settings.XMC_MLRUN_LOCATION = "proj", "us-central1"
    exp = factories.experiment(creator="alice@example.com")
    factories.work_unit(exp, wid=1)
    unit_page = f"http://127.0.0.1:8000/experiments/{exp.id}/workUnits/1"  # the client's default link
    code = artifact_services.create_artifact(exp.id, 1, pb.artifact.Artifact(
        url=pb.url.Url(url=unit_page, display_name="launch.py"),
        payload=pb.artifact.ArtifactPayload(code_source=pb.artifact.CodeSourceArtifact(
            title="launch.py", code_block="import xm\nprint('<b>hi</b>')\n"))))
    profile = artifact_services.create_artifact(exp.id, 1, pb.artifact.Artifact(
        url=pb.url.Url(url=unit_page, display_name="profile"),
        payload=pb.artifact.ArtifactPayload(managed_xprof=pb.artifact.ManagedXprofArtifact(display_name="profile"))))
    alice_signed_in = pages.signed_in("alice", client)
    page = alice_signed_in.get(f"/experiments/{exp.id}/workUnits/1").content.decode()
    assert f'href="/experiments/{exp.id}/artifacts/{code.id}"' in page
    xprof_href = "https://console.cloud.google.com/kubernetes/aiml/run/us-central1/"
    assert f'href="{xprof_href}xmc-{exp.id}-1-1?project=proj"' in page  # not the unit's own page
    opened = alice_signed_in.get(f"/experiments/{exp.id}/artifacts/{code.id}")
    assert opened.status_code == 200
    body = opened.content.decode()
    assert "import xm\nprint(&#x27;&lt;b&gt;hi&lt;/b&gt;&#x27;)" in body and "launch.py" in body
    # Someone else's artifact reads as a missing one.
    assert pages.signed_in("bob").get(f"/experiments/{exp.id}/artifacts/{code.id}").status_code == 404
    assert alice_signed_in.get(f"/experiments/{exp.id}/artifacts/{profile.id + 100}").status_code == 404
