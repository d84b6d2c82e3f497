"""The real client's launch reaches the cluster: xm_cloud work units become JobSets.

``xmanager launch`` runs the launch script of test_launch.py against the
in-process gRPC server while a real actuator worker (tests/k8s_bridge/actuator) turns the
committed operations into JobSets in the simulator; the client's own
``google.longrunning`` stubs then see the operations done.
"""
from __future__ import annotations

from typing import Any

import pytest
from django.db import close_old_connections

from tests.k8s_bridge.actuator.conftest import (  # noqa: F401 - fixtures
    get_jobset,
    real_deliver,
    worker,
    workers,
)
from tests.system.real_client.conftest import Client
from tests.system.real_client.test_launch import LAUNCH_SCRIPT
from tests.waiting import eventually
from workunits.models import Operation

pytestmark = pytest.mark.django_db(transaction=True)

WAIT_SCRIPT = """
import os, sys
import grpc
from google.longrunning import operations_pb2, operations_pb2_grpc
from google.protobuf import duration_pb2

names = sys.argv[1:] if len(sys.argv) > 1 else os.environ["OP_NAMES"].split(",")
channel = grpc.insecure_channel(os.environ["XMANAGER_ENDPOINT"].removeprefix("http://"))
stub = operations_pb2_grpc.OperationsStub(channel)
md = [("authorization", "Bearer " + os.environ["XMC_AUTH_TOKEN"])]
seen = {}
for name in names:
    waited = stub.WaitOperation(operations_pb2.WaitOperationRequest(
        name=name, timeout=duration_pb2.Duration(seconds=30)), metadata=md)
    got = stub.GetOperation(operations_pb2.GetOperationRequest(name=name), metadata=md)
    seen[name] = {"waited_done": waited.done, "done": got.done, "error": got.error.code,
                  "response": got.response.type_url}
report(seen)
"""


def test_it_turns_a_launch_scripts_work_units_into_jobsets(alice_client: Client, worker: Any, api_cluster: Any) -> None:
    script = alice_client.write("launch_story.py", LAUNCH_SCRIPT)
    xid = alice_client.xmanager("launch", str(script), timeout=300).ok().result["id"]

    for wid in (1, 2):
        eventually(lambda wid=wid: get_jobset(api_cluster, xid, wid), timeout=120, what=f"the JobSet of work unit {wid}")
    cpu, group = get_jobset(api_cluster, xid, 1), get_jobset(api_cluster, xid, 2)
    assert [r["name"] for r in cpu["spec"]["replicatedJobs"]] == ["trainer"]
    assert cpu["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "cpu-queue"
    assert [r["name"] for r in group["spec"]["replicatedJobs"]] == ["server", "worker"]
    assert group["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"
    server_pod = group["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert server_pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"}

    close_old_connections()
    names = sorted(op.name for op in Operation.objects.filter(experiment_id=xid, action_type="CREATE")
                   .select_related("work_unit"))
    seen = alice_client.python(WAIT_SCRIPT, OP_NAMES=",".join(names), timeout=180).ok().result
    assert set(seen) == set(names)
    for name in names:
        assert seen[name] == {"waited_done": True, "done": True, "error": 0,
                              "response": "type.googleapis.com/cloud.xmanager.v1.WorkUnit"}
