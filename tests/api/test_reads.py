"""The one-statement reads (`xmc.api.reads`) answer exactly what the ORM path built.

The oracle is the conversion of model objects (`core.convert`), the path the
handlers used before; each read must also be one SQL statement and keep the
ACL and NOT_FOUND answers.
"""
from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core import convert, pb

from experiments.wire import experiment_status_to_proto, experiment_to_proto

from core.errors import NotFound, PermissionDenied
from core.pb import longrunning as lro
from experiments.acl import Role
from experiments.models import Experiment
from tests import factories
from tests.api.acl_cases import PERSONAS
from workunits import services as wu_services
from workunits import state
from workunits.models import WorkUnit, WorkUnitExecution
from workunits.state import ExecutionUpdate
from workunits.wire import execution_to_proto, work_unit_to_proto
from xmc.api import reads
from xmc.api.registry import ESS, OPERATIONS, Caller, invoke
from xmc.auth.identity import Identity

pytestmark = pytest.mark.django_db
api = pb.api
ALICE = Identity(factories.ALICE)


def _rich_world() -> tuple[Experiment, list[WorkUnit]]:
    """Work units with restarts, messages, urls, tags and a stopped one: every column non-default somewhere."""
    acls = pb.xid.XidAcls(owners=[pb.xid.XidAcls.Role(user=factories.ALICE)],
                          writers=[pb.xid.XidAcls.Role(user="BOB@example.com")],
                          readers=[pb.xid.XidAcls.Role(group="ml-team"), pb.xid.XidAcls.Role(domain="partner.org")])
    exp = factories.experiment(acls=acls)
    wus = [factories.work_unit(exp) for _ in range(3)]
    now_ns = convert.ns_from_datetime(timezone.now())
    wu_services.update_work_unit_executions([ExecutionUpdate(
        xid=exp.id, wid=wus[0].wid, eid=1, mask=(state.STATE, "status.system_message", "status.detailed_status"),
        state="RUNNING", state_update_time_ns=now_ns + 1_000,
        system_message={"userFacingText": "pulled", "severity": "INFO"},
        detailed_status={"jobsetStatus": {"restarts": 2}},
    )])
    wu_services.restart_work_units(exp.id, [wus[1].wid], batch=False)
    wu_services.stop_work_units(exp.id, [wus[2].wid], batch=False)
    invoke(ESS, "UpdateWorkUnit", api.UpdateWorkUnitRequest(
        work_unit=pb.work_unit.WorkUnit(name=wus[0].name, tags=["a", "b"], notes="n",
                                        urls=[pb.url.Url(url="http://x", display_name="x")]),
        update_mask={"paths": ["tags", "notes", "urls"]}), Caller(ALICE))
    return exp, wus


def _one_query(call: Any) -> Any:
    with CaptureQueriesContext(connection) as queries:
        result = call()
    assert len(queries.captured_queries) == 1, [q["sql"] for q in queries.captured_queries]
    return result


def test_it_answers_get_work_unit_exactly_as_the_model_path_in_one_statement() -> None:
    exp, wus = _rich_world()
    for wu in WorkUnit.objects.filter(experiment=exp):
        active = WorkUnitExecution.objects.filter(work_unit=wu, execution_state="ACTIVE").first()
        expected = work_unit_to_proto(wu, active)
        got = _one_query(lambda: reads.work_unit(exp.id, wu.wid, ALICE))
        assert got == expected
        assert got.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)


def test_it_answers_current_execution_and_executions_exactly_as_the_model_path() -> None:
    exp, wus = _rich_world()
    for wu in WorkUnit.objects.filter(experiment=exp):
        current = WorkUnitExecution.objects.get(work_unit=wu, eid=wu.current_eid)
        assert _one_query(lambda: reads.current_execution(exp.id, wu.wid, ALICE)) == \
            execution_to_proto(current, wu)
        every = [execution_to_proto(ex, wu) for ex in WorkUnitExecution.objects.filter(work_unit=wu)
                 .order_by("eid")]
        assert _one_query(lambda: reads.executions(exp.id, wu.wid, ALICE)) == every
    assert len(reads.executions(exp.id, wus[1].wid, ALICE)) == 2  # the restart is there


def test_it_answers_get_experiment_and_its_status_exactly_as_the_model_path() -> None:
    exp, _ = _rich_world()
    exp.refresh_from_db()
    assert _one_query(lambda: reads.get_experiment(exp.id, ALICE)) == experiment_to_proto(exp)
    assert _one_query(lambda: reads.get_experiment_status(exp.id, ALICE)) == experiment_status_to_proto(exp)


@pytest.mark.parametrize("persona", sorted(PERSONAS))
def test_it_keeps_the_acl_answers_of_every_persona(persona: str) -> None:
    exp, wus = _rich_world()
    identity, role = PERSONAS[persona]
    calls = [lambda: reads.work_unit(exp.id, wus[0].wid, identity),
             lambda: reads.current_execution(exp.id, wus[0].wid, identity),
             lambda: reads.executions(exp.id, wus[0].wid, identity),
             lambda: reads.get_experiment(exp.id, identity)]
    for call in calls:
        if role >= Role.READER:
            call()
        else:
            with pytest.raises(PermissionDenied, match=f"{identity.email} may not read"):
                call()


def test_it_answers_not_found_naming_the_missing_resource() -> None:
    exp, _ = _rich_world()
    staff = Identity("sre@example.com", is_staff=True)
    for who, call, name in [
        (ALICE, lambda who: reads.work_unit(exp.id, 999, who), f"experiments/{exp.id}/workUnits/999"),
        (ALICE, lambda who: reads.current_execution(exp.id, 999, who), f"experiments/{exp.id}/workUnits/999"),
        # A missing experiment is NOT_FOUND only for staff, who may read everything (AIP-211).
        (staff, lambda who: reads.work_unit(987654321, 1, who), "experiments/987654321/workUnits/1"),
        (staff, lambda who: reads.executions(987654321, 1, who), "experiments/987654321/workUnits/1"),
        (staff, lambda who: reads.get_experiment(987654321, who), "experiments/987654321"),
    ]:
        with pytest.raises(NotFound) as missing:
            call(who)
        assert missing.value.message == f"{name} not found"
        assert missing.value.field == "name"


def test_it_answers_a_stranger_permission_denied_whether_or_not_the_experiment_exists() -> None:
    exp, _ = _rich_world()
    stranger = Identity("mallory@example.net")
    answers = []
    for xid in (exp.id, 987654321):
        for call in (lambda: reads.work_unit(xid, 1, stranger), lambda: reads.get_experiment(xid, stranger),
                     lambda: reads.executions(xid, 1, stranger)):
            with pytest.raises(PermissionDenied) as denied:
                call()
            answers.append(denied.value.message.replace(f"experiments/{xid}/", "experiments/X/")
                           .replace(f"experiments/{xid}", "experiments/X"))  # not the unit's own 1
    assert answers[:3] == answers[3:]  # not a byte of difference between "exists" and "missing"


def test_it_lists_work_units_with_their_current_execution_exactly_as_the_model_path() -> None:
    exp, _ = _rich_world()
    expected = [
        work_unit_to_proto(wu, WorkUnitExecution.objects.filter(work_unit=wu, execution_state="ACTIVE").first())
        for wu in WorkUnit.objects.filter(experiment=exp).order_by("wid")
    ]
    listed = _one_query(lambda: invoke(ESS, "ListWorkUnits", api.ListWorkUnitsRequest(parent=exp.name), Caller(ALICE)))
    assert list(listed.work_units) == expected
    assert [w.SerializeToString(deterministic=True) for w in listed.work_units] == \
        [w.SerializeToString(deterministic=True) for w in expected]


def test_it_still_answers_permission_first_for_a_list_in_one_statement() -> None:
    exp, _ = _rich_world()
    stranger = Caller(Identity("mallory@example.com"))
    with pytest.raises(PermissionDenied):  # rows were read, none is returned
        invoke(ESS, "ListWorkUnits", api.ListWorkUnitsRequest(parent=exp.name), stranger)
    with pytest.raises(PermissionDenied):  # a bad filter is judged only after access
        invoke(ESS, "ListWorkUnits", api.ListWorkUnitsRequest(parent=exp.name, filter="nope ="), stranger)
    with pytest.raises(PermissionDenied):  # an empty page falls back to the ACL read
        invoke(ESS, "ListWorkUnits", api.ListWorkUnitsRequest(parent=exp.name, filter="wid = 999"), stranger)
    with pytest.raises(PermissionDenied):
        invoke(OPERATIONS, "ListOperations", lro.ListOperationsRequest(name=f"{exp.name}/operations"), stranger)
    empty = invoke(ESS, "ListWorkUnits", api.ListWorkUnitsRequest(parent=exp.name, filter="wid = 999"), Caller(ALICE))
    assert list(empty.work_units) == []
