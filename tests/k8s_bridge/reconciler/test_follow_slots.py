"""Issue 40, item 5: one user following logs cannot take every follow slot of a web process.

Alice follows her jobs' logs as much as the server lets her; Bob then follows
his own and must get his stream, not 429. The global cap (``XMC_LOGS_MAX_FOLLOWS``)
still holds for everyone together. Real simulator pods, the real logs endpoint.
"""
from __future__ import annotations

from typing import Any

import pytest

from k8s_bridge.logs import slots
from tests import factories
from tests.k8s_bridge.reconciler.conftest import Cluster, state_of
from tests.k8s_bridge.reconciler.test_logs import archive_url, get, logs_reconciler, url  # noqa: F401
from tests.waiting import eventually
from workunits.choices import WorkUnitState as S

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = "pull=0s;log=every:1s:step {n};run=forever"


def running_for(cluster: Cluster, owner: str) -> Any:
    wu = factories.work_unit(factories.experiment(creator=owner))
    cluster.create_jobset(wu, script=SCRIPT)
    eventually(lambda: state_of(wu) == S.RUNNING, what="RUNNING")
    return wu


@pytest.fixture(autouse=True)
def _no_slots_held() -> Any:
    slots.reset()
    yield
    slots.reset()


def test_it_leaves_a_slot_for_another_when_one_user_follows_his_logs(cluster: Cluster, logs_reconciler: Any,  # noqa: F811
                                                               settings: Any) -> None:
    settings.XMC_LOGS_MAX_FOLLOWS = 2
    logs_reconciler()
    alices = running_for(cluster, factories.ALICE)
    bobs = running_for(cluster, factories.BOB)
    first = get(url(alices, query="follow=true"))
    assert first.status_code == 200
    # Alice's second follow would fill the process: it is hers to wait for, not Bob's.
    second = get(url(alices, query="follow=true"))
    assert second.status_code == 429 and second.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert factories.ALICE in second.json()["error"]["message"]
    bob = get(url(bobs, query="follow=true"), email=factories.BOB)
    assert bob.status_code == 200
    # Now the process is full: the global cap turns away anyone else.
    carol = get(url(alices, query="follow=true"), email="carol@example.com")
    assert carol.status_code in (404, 429)  # Carol may not even read Alice's experiment
    bob_again = get(url(bobs, query="follow=true"), email=factories.BOB)
    assert bob_again.status_code == 429
    first.close()
    bob.close()
    assert slots.held() == 0


def test_it_lets_a_user_alone_hold_half_the_cap_and_always_gives_a_newcomer_one() -> None:
    cap = 8
    assert [slots.fair_share(cap, others) for others in range(5)] == [4, 2, 2, 1, 1]
    assert slots.fair_share(1, 0) == 1 and slots.fair_share(2, 0) == 1
