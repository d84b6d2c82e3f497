"""The ACL matrix's cases, shared by the handler, gRPC and REST matrix tests.

``CASES`` maps every RPC to a request builder and the least role that may
call it; ``PERSONAS`` are callers holding each role in the world
``build_world`` makes (owner by user, writer by user with odd case, readers
by group and by domain, a stranger, staff).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf import field_mask_pb2

from core import pb
from experiments.acl import Role
from metrics import services as metric_services
from tests import factories
from workunits import services as wu_services
from workunits.models import Operation
from xmc.api.registry import DASHBOARDS, ESS, OPERATIONS, Caller, invoke
from xmc.auth.identity import Identity

api = pb.api
lro = pb.longrunning
dash = pb.dashboard_api

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
    chart: str = ""  # Alice's chart on work unit 1
    dashboard: str = ""  # Alice's dashboard showing it

    @property
    def exp(self) -> str:
        return f"experiments/{self.xid}"

    @property
    def wu(self) -> str:
        return f"experiments/{self.xid}/workUnits/{self.wid}"


def build_world() -> World:
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
    chart = metric_services.create_chart(wu, pb.dashboard.Chart(title="loss", plots=[pb.dashboard.PlotSpec(
        plot_id="p", type=pb.dashboard.SCATTER, data=pb.dashboard.DataSpec(metrics=["loss"]))]), "",
        creator="alice@example.com")
    dashboard, _ = metric_services.create_dashboard(pb.dashboard.Dashboard(title="d"), "", owner="alice@example.com",
                                                    referenced=[chart], inline=[])
    return World(exp.id, wu.wid, int(artifact.name.split("/")[-1]), op.name, done.name, chart.name, dashboard.name)


#: RPCs whose names do not name an experiment (short chart names, dashboards): what the caller may not
#: read does not resolve at all, so it is NOT_FOUND, as a missing one is (issue 40, item 9).
NOT_FOUND_WHEN_UNREADABLE = {(DASHBOARDS, "GetChart"), (DASHBOARDS, "GetDashboard"),
                             (DASHBOARDS, "UpdateDashboard"), (DASHBOARDS, "DeleteDashboard")}


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
    (OPERATIONS, "ListOperations"): (lambda w: lro.ListOperationsRequest(name=f"{w.exp}/operations"), Role.READER),
    (OPERATIONS, "WaitOperation"): (lambda w: lro.WaitOperationRequest(name=w.done_op_name), Role.READER),
    (OPERATIONS, "CancelOperation"): (lambda w: lro.CancelOperationRequest(name=w.op_name), Role.WRITER),
    (OPERATIONS, "DeleteOperation"): (lambda w: lro.DeleteOperationRequest(name=w.done_op_name), Role.WRITER),
    # DashboardService: a chart follows its experiment's ACLs (readers may add views, writers change
    # another's); the dashboard is Alice's, readable by whoever reads every experiment it shows.
    (DASHBOARDS, "CreateChart"): (lambda w: dash.CreateChartRequest(parent=w.wu, chart=pb.dashboard.Chart(
        title="t", plots=[pb.dashboard.PlotSpec(plot_id="p", type=pb.dashboard.SCATTER,
                                                data=pb.dashboard.DataSpec(metrics=["m"]))])), Role.READER),
    # GetChart's only HTTP binding is charts/{chart_id}: the short name, so REST can call it too.
    (DASHBOARDS, "GetChart"): (lambda w: dash.GetChartRequest(name="charts/" + w.chart.rsplit("/", 1)[1]),
                               Role.READER),
    (DASHBOARDS, "GetChartData"): (lambda w: dash.GetChartDataRequest(name=w.chart), Role.READER),
    (DASHBOARDS, "ListCharts"): (lambda w: dash.ListChartsRequest(parent=w.wu), Role.READER),
    (DASHBOARDS, "UpdateChart"): (lambda w: dash.UpdateChartRequest(
        chart=pb.dashboard.Chart(name=w.chart, title="n"), update_mask=mask("title")), Role.WRITER),
    (DASHBOARDS, "DeleteChart"): (lambda w: dash.DeleteChartRequest(name=w.chart), Role.WRITER),
    (DASHBOARDS, "CreateDashboard"): (lambda w: dash.CreateDashboardRequest(
        dashboard=pb.dashboard.Dashboard(title="mine")), Role.NONE),
    (DASHBOARDS, "GetDashboard"): (lambda w: dash.GetDashboardRequest(name=w.dashboard), Role.READER),
    (DASHBOARDS, "UpdateDashboard"): (lambda w: dash.UpdateDashboardRequest(
        dashboard=pb.dashboard.Dashboard(name=w.dashboard, title="n"), update_mask=mask("title")), Role.OWNER),
    (DASHBOARDS, "DeleteDashboard"): (lambda w: dash.DeleteDashboardRequest(name=w.dashboard), Role.OWNER),
}
