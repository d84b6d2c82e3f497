"""The hardening stories reuse the REST cast (Alice's world, Bob, the test client)
and the live gRPC server of the gRPC tests."""
from __future__ import annotations

from tests.api.grpc_server.conftest import (  # noqa: F401 - fixtures
    _server_connections_closed_after_each_test,
    channel,
    ess,
    grpc_server,
    grpc_target,
    operations,
)
from tests.api.rest.conftest import _rest_urls, world  # noqa: F401 - fixtures
