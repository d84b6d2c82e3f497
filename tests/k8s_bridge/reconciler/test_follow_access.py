"""Issue 40, item 3: a followed log stops when its reader loses access.

Alice shares an experiment with Bob; Bob follows a running job's log, by the
REST API (``follow=true``) and in the logs panel (the page's Follow stream);
Alice takes the share back. Bob must get no line written after that: the
REST response ends, the page's stream sends ``denied`` and closes. Real
simulator pods, the real endpoints (the page's through a real uvicorn).
"""
from __future__ import annotations

from typing import Any

import pytest
import requests

from experiments.models import Experiment
from k8s_bridge.logs import slots
from tests import factories
from tests.k8s_bridge.reconciler.conftest import Cluster, state_of
from tests.k8s_bridge.reconciler.test_logs import archive_url, get, logs_reconciler, url  # noqa: F401
from tests.ui import pages
from tests.ui.asgi_server import asgi_server  # noqa: F401 - fixture
from tests.ui.test_events import Reader
from tests.waiting import eventually
from workunits.choices import WorkUnitState as S
from xmc.auth.tokens import issue_token

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = "pull=0s;log=every:1s:step {n};run=forever"


@pytest.fixture(autouse=True)
def _quick(settings: Any) -> Any:
    settings.XMC_STREAM_RECHECK_S = 0.3
    slots.reset()
    yield
    slots.reset()


def shared_running(cluster: Cluster) -> Any:
    wu = factories.work_unit(factories.experiment(creator=factories.ALICE, acls=pages.shared_with(factories.BOB)))
    cluster.create_jobset(wu, script=SCRIPT)
    eventually(lambda: state_of(wu) == S.RUNNING, what="RUNNING")
    return wu


def test_it_ends_bobs_rest_follow_once_the_share_is_taken_back(cluster: Cluster, logs_reconciler: Any,  # noqa: F811
                                                             settings: Any) -> None:
    settings.XMC_STREAM_RECHECK_S = 0  # every line checked (else a line may go out up to that long after)
    logs_reconciler()
    wu = shared_running(cluster)
    response = get(url(wu, query="follow=true"), email=factories.BOB)
    assert response.status_code == 200
    chunks = iter(response.streaming_content)
    assert any(b"step" in chunk for chunk in chunks)  # up to its first step line
    Experiment.objects.filter(id=wu.experiment_id).update(acls={})  # Alice takes the share back
    after = list(chunks)  # ends: the next line is checked before it is sent
    response.close()
    assert after == []
    assert slots.held() == 0


def test_it_ends_bobs_follow_in_the_logs_panel_with_denied(cluster: Cluster, logs_reconciler: Any,  # noqa: F811
                                                         asgi_server: str) -> None:  # noqa: F811
    logs_reconciler()
    wu = shared_running(cluster)
    response = requests.get(f"{asgi_server}/experiments/{wu.experiment_id}/workUnits/{wu.wid}/logs/follow",
                            headers={"Accept": "text/event-stream",
                                     "Authorization": f"Bearer {issue_token(factories.BOB)}"},
                            stream=True, timeout=30)
    assert response.status_code == 200, response.text[:300]
    reader = Reader(response)
    reader.start()
    try:
        reader.wait_for("line", timeout=15)
        Experiment.objects.filter(id=wu.experiment_id).update(acls={})
        denied = reader.wait_for("denied", timeout=5)
        assert [e for e in reader.events if e[1] == "line" and e[3] > denied[3]] == []
        reader.join(timeout=5)
        assert not reader.is_alive(), "the stream stayed open after denied"
    finally:
        response.close()
    eventually(lambda: slots.held() == 0, what="the follow slot given back")
