"""URLs of the REST API: every binding of `xmc.api.rest.BINDINGS`, the OpenAPI document and its page.

Included at the site root by ``xmc.urls`` (``path("", include("xmc.api.rest_urls"))``),
so the paths are exactly the protos' (``/v1/experiments/1/workUnits/2:stop``).
The staff-only scheduling switch (`xmc.api.scheduling`) and the endpoints
upper apps register in `xmc.api.extensions` (the execution logs,
`k8s_bridge.logs.views`) sit next to them.
Anything else under ``/v1/`` answers 404 in the API's error shape.
"""
from __future__ import annotations

from django.urls import URLPattern, path, re_path

from xmc.api import extensions, headlines, importance, metrics_write, openapi, rest, scheduling, studies, sweeps

urlpatterns: list[URLPattern] = [
    path("v1/openapi.json", openapi.openapi_json, name="rest-openapi"),
    path("v1/docs", openapi.docs_page, name="rest-docs"),
    *metrics_write.urlpatterns,  # jobs write metric points (not an RPC: its own token)
    *sweeps.urlpatterns,  # the sweep read (not an RPC: no such message in the proto)
    *importance.urlpatterns,  # a sweep's parameter importance (likewise)
    *studies.urlpatterns,  # studies (docs/architecture/studies.md; likewise)
    *extensions.urlpatterns,  # e.g. container logs (not an RPC: plain text or NDJSON, streamed)
    *rest.urlpatterns(),
    *scheduling.urlpatterns,  # staff-only: the scheduling switch
    *headlines.urlpatterns,  # each work unit's one-line why (workunits.headline)
    re_path(r"^v1(?:/.*)?$", rest.not_found, name="rest-not-found"),
]
