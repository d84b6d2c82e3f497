"""The only module that imports the ``kubernetes`` SDK.

Everything else in the project (actuator, reconciler, commands) asks this
module for API objects, for the few SDK types it needs and for the two raw
calls the generated client lacks (`json_patch`, `get_json`), so the SDK stays
behind one seam (an import-linter contract keeps it so). It loads the
kubeconfig named by ``settings.KUBECONFIG``, else the in-cluster service
account, else ``~/.kube/config``; nothing here knows whether the API server is
a real cluster or the bundled simulator.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from jobsets.contract import JOBSET_GROUP, JOBSET_PLURAL, JOBSET_VERSION

__all__ = [
    "ApiException",
    "JOBSET_GROUP", "JOBSET_VERSION", "JOBSET_PLURAL",
    "KUEUE_GROUP", "KUEUE_VERSION", "WORKLOAD_PLURAL",
    "VISIBILITY_PATH", "VISIBILITY_LQ_PATH", "api_client", "batch", "coordination", "core", "custom_objects", "get_json", "json_patch",
    "reset", "watch",
]

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
WORKLOAD_PLURAL = "workloads"

_lock = threading.Lock()
_client: Any = None


def _load_configuration() -> Any:
    configuration = k8s.Configuration()
    if settings.KUBECONFIG:
        k8s_config.load_kube_config(config_file=settings.KUBECONFIG, client_configuration=configuration)
        return configuration
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except ConfigException:
        k8s_config.load_kube_config(client_configuration=configuration)
    return configuration


def api_client() -> Any:
    """The process-wide ``kubernetes.client.ApiClient`` (thread-safe, pooled)."""
    global _client
    with _lock:
        if _client is None:
            _client = k8s.ApiClient(_load_configuration())
        return _client


def reset() -> None:
    """Forget the cached client (tests point processes at a new kubeconfig)."""
    global _client
    with _lock:
        if _client is not None:
            _client.close()
        _client = None


def custom_objects() -> Any:
    return k8s.CustomObjectsApi(api_client())


def core() -> Any:
    return k8s.CoreV1Api(api_client())


def batch() -> Any:
    return k8s.BatchV1Api(api_client())


def coordination() -> Any:
    return k8s.CoordinationV1Api(api_client())


def watch() -> Any:
    """A new ``kubernetes.watch.Watch`` (one per stream)."""
    return k8s_watch.Watch()


# --- Raw calls the generated client has no method for -----------------------------
#
# * `json_patch`: an RFC 6902 JSON patch of a custom object (the generated
#   ``patch_namespaced_custom_object`` always sends a merge patch, which cannot
#   carry a ``test`` operation on the resourceVersion);
# * `get_json`: a GET of any path, e.g. Kueue's visibility API (`VISIBILITY_PATH`).

VISIBILITY_PATH = "/apis/visibility.kueue.x-k8s.io/v1beta1/clusterqueues/{cq}/pendingworkloads"
VISIBILITY_LQ_PATH = "/apis/visibility.kueue.x-k8s.io/v1beta1/namespaces/{namespace}/localqueues/{lq}/pendingworkloads"


def json_patch(group: str, version: str, namespace: str, plural: str, name: str,
               operations: Sequence[dict[str, Any]]) -> Any:
    return api_client().call_api(
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


def get_json(path: str, path_params: dict[str, str] | None = None,
             query: Sequence[tuple[str, str]] = ()) -> Any:
    response = api_client().call_api(
        path, "GET", path_params or {}, list(query), {"Accept": "application/json"},
        auth_settings=["BearerToken"], _return_http_data_only=True, _preload_content=False,
        _request_timeout=10,
    )
    return json.loads(response.data)
