"""Every method of the client's ESS wrapper against XMC (client contract 7: the delegation table as a live smoke test).

``ExperimentStateGRpcApi`` is the complete list of RPCs the client can ever
issue. The script finds its public methods by introspection (so a method the
wheel adds is noticed), calls each with a minimal valid request on a small
launched experiment, and reports the reply type or the status code. Every
one must give a typed reply or a clean client error -- never UNIMPLEMENTED,
INTERNAL or UNKNOWN. Then the ``list`` helper's printer and its endless loop.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.system.real_client.conftest import Client

pytestmark = pytest.mark.django_db(transaction=True)

SMOKE = """
import grpc
from google.protobuf import field_mask_pb2
from xmanager import xm, xm_cloud
from xmanager.xm_local import executables
from xmanager_cloud.experiment_state_server import experiment_state_api
from xmanager_cloud.experiment_state_server.proto import api_pb2 as api, artifact_pb2, experiment_pb2
from xmanager_cloud.experiment_state_server.proto import status_pb2, work_unit_pb2

wrapper = experiment_state_api.get_experiment_state_api()
experiment = xm_cloud.create_experiment(experiment_title="smoke")
with experiment:
    experiment.add(
        xm.Job(
            executable=executables.GoogleContainerRegistryImage(name="t", image_path="gcr.io/proj/t:v1"),
            executor=xm_cloud.KubernetesJobExecutor(requirements=xm.JobRequirements(cpu=1, memory=xm.GiB)),
            name="t",
        ),
        settings=xm_cloud.WorkUnitSettings(),
    )
x = experiment.resource_name
w = f"{x}/workUnits/1"
text = artifact_pb2.Artifact(payload=artifact_pb2.ArtifactPayload(text=artifact_pb2.TextArtifact(text="hi")))
made = wrapper.create_artifact(api.CreateArtifactRequest(parent=x, artifact=text))
doomed = wrapper.create_artifact(api.CreateArtifactRequest(parent=w, artifact=text))

requests = {
    "create_experiment": api.CreateExperimentRequest(),
    "create_work_unit": api.CreateWorkUnitRequest(parent=x, work_unit=work_unit_pb2.WorkUnit()),
    "get_experiment": api.GetExperimentRequest(name=x),
    "list_experiments": api.ListExperimentsRequest(page_size=10),
    "search_experiments": api.ListExperimentsRequest(page_size=10, filter='title:"smoke"'),
    "get_work_unit": api.GetWorkUnitRequest(name=w),
    "list_work_units": api.ListWorkUnitsRequest(parent=x),
    "search_work_units": api.ListWorkUnitsRequest(parent=x),
    "update_experiment_launch_state": api.UpdateExperimentLaunchStateRequest(
        name=x, launch_state=status_pb2.ExperimentStatus.LaunchState.COMPLETED),
    "update_experiment": api.UpdateExperimentRequest(
        experiment=experiment_pb2.Experiment(name=x, notes="n"), update_mask=field_mask_pb2.FieldMask(paths=["notes"])),
    "update_work_unit": api.UpdateWorkUnitRequest(
        work_unit=work_unit_pb2.WorkUnit(name=w, notes="n"), update_mask=field_mask_pb2.FieldMask(paths=["notes"])),
    "create_artifact": api.CreateArtifactRequest(parent=w, artifact=text),
    "list_artifacts": api.ListArtifactsRequest(parent=x),
    "search_artifacts": api.ListArtifactsRequest(parent=w),
    "delete_artifact": api.DeleteArtifactRequest(name=doomed.name),
    "update_artifact": api.UpdateArtifactRequest(
        artifact=artifact_pb2.Artifact(name=made.name, notes="n"), update_mask=field_mask_pb2.FieldMask(paths=["notes"])),
    "list_status_messages": api.ListStatusMessagesRequest(parent=x),
    "search_status_messages": api.ListStatusMessagesRequest(parent=w),
    "batch_stop_work_units": api.BatchStopWorkUnitsRequest(parent=x),
    "batch_restart_work_units": api.BatchRestartWorkUnitsRequest(parent=x),
}
methods = sorted(name for name in dir(wrapper) if not name.startswith("_") and callable(getattr(wrapper, name)))
outcomes = {}
for name in methods:
    if name not in requests:
        outcomes[name] = "no request in this test"
        continue
    try:
        outcomes[name] = type(getattr(wrapper, name)(requests[name])).__name__
    except grpc.RpcError as exc:
        outcomes[name] = exc.code().name + ": " + exc.details()
report(outcomes)
"""


def test_it_answers_every_method_of_the_clients_wrapper(alice_client: Client) -> None:
    outcomes = alice_client.python(SMOKE).ok().result

    assert len(outcomes) == 20  # contract 0.1: the client uses 20 of the 26 methods
    assert {name: outcome for name, outcome in outcomes.items() if outcome.split(":")[0] in {
        "UNIMPLEMENTED", "INTERNAL", "UNKNOWN", "no request in this test"
    }} == {}
    # An empty work unit is the caller's mistake, said so; everything else succeeds.
    assert outcomes.pop("create_work_unit").startswith("INVALID_ARGUMENT")
    assert outcomes == {
        "batch_restart_work_units": "Operation",
        "batch_stop_work_units": "Operation",
        "create_artifact": "Artifact",
        "create_experiment": "Experiment",
        "delete_artifact": "Empty",  # the wrapper's annotation says Artifact; the wire type is Empty
        "get_experiment": "Experiment",
        "get_work_unit": "WorkUnit",
        "list_artifacts": "ListArtifactsResponse",
        "list_experiments": "ListExperimentsResponse",
        "list_status_messages": "ListStatusMessagesResponse",
        "list_work_units": "ListWorkUnitsResponse",
        "search_artifacts": "ListArtifactsResponse",
        "search_experiments": "ListExperimentsResponse",
        "search_status_messages": "ListStatusMessagesResponse",
        "search_work_units": "ListWorkUnitsResponse",
        "update_artifact": "Artifact",
        "update_experiment": "Experiment",
        "update_experiment_launch_state": "Experiment",
        "update_work_unit": "WorkUnit",
    }


def test_it_gives_the_list_helper_a_printable_page_and_ends_its_endless_loop(
    make_client: Callable[..., Client], fresh_email: Callable[[str], str], settings: Any
) -> None:
    # The list helper prints only after its loop, which never ends on its own
    # (contract 0.6): print the first page with its own printer (enum names must
    # be valid), then let the rate limit end the loop under a watchdog.
    settings.XMC_RATE_LIMIT_BURST = 40  # a small bucket, so the loop meets the limit quickly
    settings.XMC_RATE_LIMIT_PER_S = 5
    client = make_client(fresh_email("lister"))
    run = client.python(
        """
        import os, threading
        import grpc
        from absl import flags
        from xmanager import xm_cloud
        from xmanager.xm_cloud.cli import list_command
        from xmanager_cloud.experiment_state_server import experiment_state_api

        flags.FLAGS(["list"])
        xm_cloud.create_experiment(experiment_title="listed one")
        page, _ = xm_cloud.list_experiments(experiment_state_api.get_experiment_state_api())
        list_command._print_experiments(page)

        outcome = {}
        def loop():
            try:
                list_command.list_command()
                outcome["ended"] = "returned"
            except grpc.RpcError as exc:
                outcome["ended"] = exc.code().name
        worker = threading.Thread(target=loop, daemon=True)
        worker.start()
        worker.join(30)
        report({"ended": outcome.get("ended", "still paging after 30 s")})
        os._exit(0)
        """,
        timeout=90,
    ).ok()

    assert "listed one" in run.stdout
    assert "ACTIVE" in run.stdout  # Status column: ActiveState.Name() of our value
    assert run.result == {"ended": "RESOURCE_EXHAUSTED"}
