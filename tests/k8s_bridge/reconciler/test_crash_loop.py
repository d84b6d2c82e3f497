"""A container that fails every time reads as a crash loop, not as a queue (issues 38 and 39).

Between two tries of a failing pod the Job controller backs off (10 s
doubling) and nothing of the JobSet is active. The execution used to go back
to SCHEDULING ("Queued in cpu-queue: admitted; starting") for the whole
back-off, so a pod retry looked like a re-queue. It now stays STARTING (the
quota is held: `mapping.to_work_unit_state` rule 8a) with a WARNING naming
the last exit, the count and the limit, which the headline shortens.
"""
from __future__ import annotations

import re

import pytest

from tests import factories
from tests.k8s_bridge.reconciler.conftest import Cluster, execution
from tests.waiting import eventually
from workunits import headline
from workunits.choices import WorkUnitState
from workunits.models import StatusHistory, StatusMessage

pytestmark = pytest.mark.django_db(transaction=True)
S = WorkUnitState


def test_it_says_crash_looping_for_a_failing_pod_between_its_tries_and_never_makes_it_look_queued(cluster: Cluster, reconciler) -> None:
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=0s;run=1s;exit=3", backoff_limit=3)

    def warned(failures: int) -> str | None:
        ex = execution(wu)
        text = str((ex.system_message or {}).get("userFacingText", ""))
        wanted = f"{failures} failure(s) so far (backoffLimit 3)"
        return text if ex.state == S.STARTING and wanted in text else None

    text = eventually(lambda: warned(2), timeout=90, what="the crash loop's warning after two failures",
                      detail=lambda: repr((execution(wu).state, execution(wu).system_message)))
    ex = execution(wu)
    assert ex.system_message["severity"] == "WARNING"
    assert re.match(r"Crash-looping: replica main-0 \(pod xmc-\d+-\d+-main-0-[\w-]+\) container main exited with code 3 "
                    r"\(Error\); 2 failure\(s\) so far \(backoffLimit 3\); next try 20 s after the last exit$",
                    text), text
    head = headline.headline(ex.state, ex.system_message, ex.scheduling_information, "cpu-queue")
    assert head == "crash-looping: exited with code 3, 2 restarts (retry limit 3); next try 20 s after the last exit", head
    # One text per failure: it does not change while the pod runs again (no clock in it).
    texts = {m.content["userFacingText"] for m in StatusMessage.objects.filter(work_unit=wu, severity="WARNING")}
    assert len(texts) == 2, texts
    states = list(StatusHistory.objects.filter(execution=ex).order_by("time", "id").values_list("to_state", flat=True))
    admitted = states.index(S.STARTING) if S.STARTING in states else states.index(S.RUNNING)
    assert S.SCHEDULING not in states[admitted:], states  # a pod retry is not a re-queue
    eventually(lambda: execution(wu).state == S.FAILED, timeout=120, what="FAILED past the limit")
    assert headline.headline(S.FAILED, execution(wu).system_message, None).startswith("exited with code 3")
