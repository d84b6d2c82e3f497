"""The few raw API calls the generated client has no method for (through ``k8s_bridge.client``).

* :func:`json_patch`: an RFC 6902 JSON patch of a custom object (the
  generated ``patch_namespaced_custom_object`` always sends a merge patch,
  which cannot carry a ``test`` operation on the resourceVersion);
* :func:`get_json`: a GET of any path, e.g. Kueue's visibility API
  ``/apis/visibility.kueue.x-k8s.io/v1beta1/clusterqueues/{cq}/pendingworkloads``.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from k8s_bridge import client

VISIBILITY_PATH = "/apis/visibility.kueue.x-k8s.io/v1beta1/clusterqueues/{cq}/pendingworkloads"


def json_patch(group: str, version: str, namespace: str, plural: str, name: str,
               operations: Sequence[dict[str, Any]]) -> Any:
    return client.api_client().call_api(
        "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}", "PATCH",
        {"group": group, "version": version, "namespace": namespace, "plural": plural, "name": name},
        [],
        {"Accept": "application/json", "Content-Type": "application/json-patch+json"},
        body=list(operations),
        response_type="object",
        auth_settings=["BearerToken"],
        _return_http_data_only=True,
        _request_timeout=15,
    )


def get_json(path: str, path_params: dict[str, str] | None = None) -> Any:
    response = client.api_client().call_api(
        path, "GET", path_params or {}, [], {"Accept": "application/json"},
        auth_settings=["BearerToken"], _return_http_data_only=True, _preload_content=False,
        _request_timeout=10,
    )
    return json.loads(response.data)
