"""Short names for the generated ``cloud.xmanager.v1`` modules.

The modules come from the ``xmanager`` wheel (installed without its
dependencies); this is the only place that knows their import paths, so the
rest of the code says ``pb.status.WorkUnitStatus`` and never copies generated
code.
"""
from __future__ import annotations

from google.longrunning import operations_pb2 as longrunning
from google.rpc import code_pb2 as rpc_code
from google.rpc import status_pb2 as rpc_status
from xmanager_cloud.dashboard_service.proto import dashboard_service_pb2 as dashboard_api
from xmanager_cloud.dashboard_service.proto import dashboard_service_pb2_grpc as dashboard_grpc
from xmanager_cloud.dashboard_service.proto import messages_pb2 as dashboard
from xmanager_cloud.experiment_state_server.proto import api_pb2 as api
from xmanager_cloud.experiment_state_server.proto import api_pb2_grpc as api_grpc
from xmanager_cloud.experiment_state_server.proto import artifact_pb2 as artifact
from xmanager_cloud.experiment_state_server.proto import experiment_pb2 as experiment
from xmanager_cloud.experiment_state_server.proto import operations_pb2 as operations
from xmanager_cloud.experiment_state_server.proto import priority_pb2 as priority
from xmanager_cloud.experiment_state_server.proto import resources_pb2 as resources
from xmanager_cloud.experiment_state_server.proto import status_message_pb2 as status_message
from xmanager_cloud.experiment_state_server.proto import status_pb2 as status
from xmanager_cloud.experiment_state_server.proto import structured_message_pb2 as structured_message
from xmanager_cloud.experiment_state_server.proto import url_pb2 as url
from xmanager_cloud.experiment_state_server.proto import work_unit_execution_pb2 as work_unit_execution
from xmanager_cloud.experiment_state_server.proto import work_unit_pb2 as work_unit
from xmanager_cloud.xid_service.proto import messages_pb2 as xid

__all__ = [
    "api", "api_grpc", "artifact", "dashboard", "dashboard_api", "dashboard_grpc", "experiment", "longrunning", "operations", "priority",
    "resources", "rpc_code", "rpc_status", "status", "status_message", "structured_message",
    "url", "work_unit", "work_unit_execution", "xid",
]
