"""The admin honours Django permissions and never writes work units outside the services."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.contrib.admin import site
from django.test import Client, RequestFactory

from tests import factories
from tests.fixtures.people import new_user
from workunits import services
from workunits.models import WorkUnit, WorkUnitExecution

pytestmark = pytest.mark.django_db


def staff_with(*codenames: str) -> Client:
    user = new_user("vera", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def test_it_does_not_let_a_viewer_stop_work_units() -> None:
    wu = factories.work_unit(factories.experiment())
    viewer = staff_with("view_workunit")
    assert viewer.get("/admin/workunits/workunit/").status_code == 200
    viewer.post("/admin/workunits/workunit/", {"action": "stop_work_units", "_selected_action": [wu.id]})
    assert WorkUnitExecution.objects.get(work_unit=wu, eid=1).state == "INITIALIZING"


def test_it_lets_a_user_with_change_permission_stop_work_units() -> None:
    wu = factories.work_unit(factories.experiment())
    changer = staff_with("view_workunit", "change_workunit")
    changer.post("/admin/workunits/workunit/", {"action": "stop_work_units", "_selected_action": [wu.id]})
    assert WorkUnitExecution.objects.get(work_unit=wu, eid=1).state == "STOPPING"


def test_it_hides_executions_from_staff_without_their_view_permission() -> None:
    assert staff_with("view_workunit").get("/admin/workunits/workunitexecution/").status_code == 403


def test_it_never_rewinds_current_eid_from_a_stale_change_form() -> None:
    wu = factories.work_unit(factories.experiment())
    stale = WorkUnit.objects.get(id=wu.id)  # what a change form loaded (current_eid 1)
    services.restart_work_units(wu.experiment_id, [wu.wid], batch=False)  # meanwhile: current_eid 2
    request = RequestFactory().post("/")
    request.user = new_user("olivia", is_superuser=True)
    model_admin = site._registry[WorkUnit]
    form = model_admin.get_form(request, stale)(instance=stale, data={})
    assert form.is_valid()
    model_admin.save_model(request, stale, form, change=True)
    assert WorkUnit.objects.get(id=wu.id).current_eid == 2
    assert WorkUnitExecution.objects.get(work_unit=wu, execution_state="ACTIVE").eid == 2


def test_it_explains_a_bad_or_taken_email_on_the_user_form() -> None:
    from xmc.admin import NormalizedEmailUserChangeForm

    new_user("first", "taken@example.com")
    user = new_user("second")
    for email, why in (("not-an-email", "valid email address"), ("TAKEN@example.com", "already has the email")):
        form = NormalizedEmailUserChangeForm(instance=user, data={"username": "second", "email": email,
                                                                   "date_joined": "2026-01-01 00:00:00"})
        assert not form.is_valid()
        assert why in str(form.errors["email"])
