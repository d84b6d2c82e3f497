"""The operators' admin: pages render, filters work, actions call the services."""
from __future__ import annotations

import pytest
from django.test import Client

from tests import factories
from workunits.models import Operation, WorkUnitExecution

pytestmark = pytest.mark.django_db


def test_it_lists_and_shows_every_model(operator: Client) -> None:
    exp = factories.experiment(title="edge")
    wu = factories.work_unit(exp)
    for url in ["/admin/", "/admin/experiments/experiment/", f"/admin/experiments/experiment/{exp.id}/change/",
                "/admin/workunits/workunit/", f"/admin/workunits/workunit/{wu.id}/change/",
                "/admin/workunits/workunitexecution/", "/admin/workunits/operation/",
                "/admin/workunits/statushistory/", "/admin/workunits/statusmessage/",
                "/admin/workunits/pausedtask/", "/admin/workunits/deadletter/",
                "/admin/workunits/schedulingswitch/", "/admin/artifacts/artifact/",
                "/admin/xmc/cliauthorizationcode/", "/admin/k8s_bridge/podlogarchive/"]:
        assert operator.get(url).status_code == 200, url
    page = operator.get(f"/admin/workunits/workunit/{wu.id}/change/").content.decode()
    assert "Initializing" in page  # the execution inline


def test_it_filters_work_units_by_current_state(operator: Client) -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    assert wu.name in operator.get("/admin/workunits/workunit/?state=INITIALIZING").content.decode()
    assert wu.name not in operator.get("/admin/workunits/workunit/?state=RUNNING").content.decode()


def test_it_stops_and_restarts_through_admin_actions(operator: Client) -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    operator.post("/admin/workunits/workunit/", {"action": "stop_work_units", "_selected_action": [wu.id]})
    assert WorkUnitExecution.objects.get(work_unit=wu, eid=1).state == "STOPPING"
    assert Operation.objects.get(action_type="STOP").original_requester == "olivia@example.com"
    operator.post("/admin/workunits/workunit/", {"action": "restart_work_units", "_selected_action": [wu.id]})
    assert WorkUnitExecution.objects.get(work_unit=wu, eid=2).state == "RESTARTING"


def test_it_edits_an_experiment_through_the_service(operator: Client) -> None:
    exp = factories.experiment(title="before")
    response = operator.post(f"/admin/experiments/experiment/{exp.id}/change/",
                             {"title": "after", "notes": "", "tags": "a,b"})
    assert response.status_code == 302
    exp.refresh_from_db()
    assert (exp.title, exp.tags) == ("after", ["a", "b"])
