"""Who may call what: every RPC x owner / writer / reader / other / staff.

Runs through ``xmc.api.registry.invoke`` (the code both transports call);
the transports' own tests add the anonymous column (UNAUTHENTICATED).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from google.protobuf import field_mask_pb2

from experiments.acl import Role
from tests import factories
from workunits import services as wu_services
from workunits.models import Operation
from xmc import pb
from xmc.api.registry import ESS, OPERATIONS, RPCS, Caller, invoke
from xmc.auth.identity import Identity
from xmc.errors import PermissionDenied

pytestmark = pytest.mark.django_db

api = pb.api
lro = pb.longrunning

PERSONAS = {
    "owner": (Identity("alice@example.com", False, frozenset()), Role.OWNER),
    "writer": (Identity("bob@example.com", False, frozenset()), Role.WRITER),
    "reader_by_group": (Identity("carol@example.com", False, frozenset({"ml-team"})), Role.READER),
    "reader_by_domain": (Identity("erin@partner.org", False, frozenset()), Role.READER),
    "other": (Identity("dave@other.com", False, frozenset({"other-team"})), Role.NONE),
    "staff": (Identity("sam@example.com", True, frozenset()), Role.OWNER),
}


@dataclass
class World:
    xid: int
    wid: int
    aid: int
    op_name: str
    done_op_name: str

    @property
    def exp(self) -> str:
        return f"experiments/{self.xid}"

    @property
    def wu(self) -> str:
        return f"experiments/{self.xid}/workUnits/{self.wid}"


@pytest.fixture
def world() -> World:
    acls = pb.xid.XidAcls(
        owners=[pb.xid.XidAcls.Role(user="alice@example.com")],
        writers=[pb.xid.XidAcls.Role(user="BOB@example.com")],
        readers=[pb.xid.XidAcls.Role(group="ml-team"), pb.xid.XidAcls.Role(domain="partner.org")],
    )
    exp = factories.experiment(acls=acls)
    wu = factories.work_unit(exp, wid=1)
    artifact = invoke(ESS, "CreateArtifact", api.CreateArtifactRequest(
        parent=exp.name, artifact=pb.artifact.Artifact(payload=pb.artifact.ArtifactPayload(
            text=pb.artifact.TextArtifact(title="t", text="x")))), Caller(PERSONAS["owner"][0]))
    op = Operation.objects.get(work_unit=wu, action_type="CREATE")
    done = wu_services.stop_work_units(exp.id, None, batch=True)  # nothing stoppable? it stops wu 1
    Operation.objects.filter(id=done.id).update(done=True)
    return World(exp.id, wu.wid, int(artifact.name.split("/")[-1]), op.name, done.name)


def mask(*paths: str) -> field_mask_pb2.FieldMask:
    return field_mask_pb2.FieldMask(paths=list(paths))


# (service, method) -> (request builder, role needed). CreateExperiment needs no role.
CASES: dict[tuple[str, str], tuple[Callable[[World], Any], Role]] = {
    (ESS, "CreateExperiment"): (lambda w: api.CreateExperimentRequest(), Role.NONE),
    (ESS, "UpdateExperimentLaunchState"): (
        lambda w: api.UpdateExperimentLaunchStateRequest(name=w.exp, launch_state=2), Role.WRITER),
    (ESS, "GetExperiment"): (lambda w: api.GetExperimentRequest(name=w.exp), Role.READER),
    (ESS, "GetExperimentStatus"): (lambda w: api.GetExperimentStatusRequest(name=w.exp), Role.READER),
    (ESS, "UpdateExperiment"): (lambda w: api.UpdateExperimentRequest(
        experiment=pb.experiment.Experiment(name=w.exp, title="t"), update_mask=mask("title")), Role.WRITER),
    (ESS, "CreateWorkUnit"): (lambda w: api.CreateWorkUnitRequest(
        parent=w.exp, work_unit=factories.work_unit_message(), work_unit_id=5), Role.WRITER),
    (ESS, "GetWorkUnit"): (lambda w: api.GetWorkUnitRequest(name=w.wu), Role.READER),
    (ESS, "GetCurrentWorkUnitExecution"): (lambda w: api.GetCurrentWorkUnitExecutionRequest(name=w.wu), Role.READER),
    (ESS, "ListWorkUnitExecutions"): (lambda w: api.ListWorkUnitExecutionsRequest(parent=w.wu), Role.READER),
    (ESS, "ListWorkUnits"): (lambda w: api.ListWorkUnitsRequest(parent=w.exp), Role.READER),
    (ESS, "SearchWorkUnits"): (lambda w: api.ListWorkUnitsRequest(parent=w.exp), Role.READER),
    (ESS, "StopWorkUnit"): (lambda w: api.StopWorkUnitRequest(name=w.wu), Role.WRITER),
    (ESS, "BatchStopWorkUnits"): (lambda w: api.BatchStopWorkUnitsRequest(parent=w.exp), Role.WRITER),
    (ESS, "RestartWorkUnit"): (lambda w: api.RestartWorkUnitRequest(name=w.wu), Role.WRITER),
    (ESS, "BatchRestartWorkUnits"): (lambda w: api.BatchRestartWorkUnitsRequest(parent=w.exp), Role.WRITER),
    (ESS, "UpdateWorkUnit"): (lambda w: api.UpdateWorkUnitRequest(
        work_unit=pb.work_unit.WorkUnit(name=w.wu, notes="n"), update_mask=mask("notes")), Role.WRITER),
    (ESS, "CreateArtifact"): (lambda w: api.CreateArtifactRequest(parent=w.wu, artifact=pb.artifact.Artifact()),
                              Role.WRITER),
    (ESS, "GetArtifact"): (lambda w: api.GetArtifactRequest(name=f"artifacts/{w.aid}"), Role.READER),
    (ESS, "DeleteArtifact"): (lambda w: api.DeleteArtifactRequest(name=f"artifacts/{w.aid}"), Role.WRITER),
    (ESS, "UpdateArtifact"): (lambda w: api.UpdateArtifactRequest(
        artifact=pb.artifact.Artifact(name=f"artifacts/{w.aid}", notes="n"), update_mask=mask("notes")), Role.WRITER),
    (ESS, "ListStatusMessages"): (lambda w: api.ListStatusMessagesRequest(parent=w.exp), Role.READER),
    (ESS, "SearchStatusMessages"): (lambda w: api.ListStatusMessagesRequest(parent=w.wu), Role.READER),
    (OPERATIONS, "GetOperation"): (lambda w: lro.GetOperationRequest(name=w.op_name), Role.READER),
    (OPERATIONS, "ListOperations"): (lambda w: lro.ListOperationsRequest(name=w.exp), Role.READER),
    (OPERATIONS, "WaitOperation"): (lambda w: lro.WaitOperationRequest(name=w.done_op_name), Role.READER),
    (OPERATIONS, "CancelOperation"): (lambda w: lro.CancelOperationRequest(name=w.op_name), Role.WRITER),
    (OPERATIONS, "DeleteOperation"): (lambda w: lro.DeleteOperationRequest(name=w.done_op_name), Role.WRITER),
}
# Lists scoped to what the caller may read (no error, fewer rows) are checked separately.
SCOPED = {(ESS, "ListExperiments"), (ESS, "SearchExperiments"), (ESS, "ListArtifacts"), (ESS, "SearchArtifacts")}


def test_it_covers_every_rpc() -> None:
    import xmc.api.handlers  # noqa: F401

    assert set(RPCS) == set(CASES) | SCOPED


@pytest.mark.parametrize("persona", sorted(PERSONAS))
@pytest.mark.parametrize("key", sorted(CASES), ids=lambda k: k[1])
def test_it_enforces_the_acl(world: World, key: tuple[str, str], persona: str) -> None:
    identity, role = PERSONAS[persona]
    build, needed = CASES[key]
    request = build(world)
    if role >= needed:
        response = invoke(*key, request, Caller(identity))
        assert response is not None
    else:
        with pytest.raises(PermissionDenied) as exc:
            invoke(*key, request, Caller(identity))
        assert identity.email in exc.value.message


def test_it_lets_only_owners_change_acls(world: World) -> None:
    request = api.UpdateExperimentRequest(
        experiment=pb.experiment.Experiment(name=world.exp, acls=pb.xid.XidAcls()), update_mask=mask("acls"))
    with pytest.raises(PermissionDenied):
        invoke(ESS, "UpdateExperiment", request, Caller(PERSONAS["writer"][0]))
    invoke(ESS, "UpdateExperiment", request, Caller(PERSONAS["owner"][0]))


@pytest.mark.parametrize("persona", sorted(PERSONAS))
def test_it_lists_only_what_the_caller_may_read(world: World, persona: str) -> None:
    identity, role = PERSONAS[persona]
    factories.experiment(creator="zoe@example.com")  # nobody above but staff may read it
    experiments = invoke(ESS, "ListExperiments", api.ListExperimentsRequest(), Caller(identity)).experiments
    artifacts = invoke(ESS, "ListArtifacts", api.ListArtifactsRequest(), Caller(identity)).artifacts
    visible = {e.name for e in experiments}
    if identity.is_staff:
        assert len(visible) == 2
    elif role >= Role.READER:
        assert visible == {world.exp}
        assert [a.name for a in artifacts] == [f"artifacts/{world.aid}"]
    else:
        assert visible == set() and list(artifacts) == []


def test_it_shares_experiments_with_all_authenticated_users() -> None:
    acls = pb.xid.XidAcls(owners=[pb.xid.XidAcls.Role(user="alice@example.com")],
                          readers=[pb.xid.XidAcls.Role(all_authenticated_users=True)])
    exp = factories.experiment(acls=acls)
    stranger = Caller(Identity("nobody@else.net", False, frozenset()))
    assert invoke(ESS, "GetExperiment", api.GetExperimentRequest(name=exp.name), stranger).name == exp.name
    with pytest.raises(PermissionDenied):
        invoke(ESS, "UpdateExperiment", api.UpdateExperimentRequest(
            experiment=pb.experiment.Experiment(name=exp.name), update_mask=mask("title")), stranger)
