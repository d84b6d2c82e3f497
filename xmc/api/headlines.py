"""``GET /v1/experiments/{xid}/headlines``: each work unit's state and one-line why, as the server reads it.

The headline is computed once, on the server (``workunits.headline``): the
pages show it and ``xmc status`` / ``xmc why`` print it rather than reading
the messages themselves. Thin: authenticate (bearer), the reader check of
the API (``xmc.api.reads``: PERMISSION_DENIED as for GetExperiment), one
query. Answer: ``{"headlines": [{"name", "executionId", "state", "headline"}]}``.
Mounted by ``xmc.api.rest_urls``.
"""
from __future__ import annotations

from django.urls import URLPattern, re_path
from rest_framework.request import Request
from rest_framework.response import Response

from experiments.acl import Role
from workunits import headline
from xmc.api import reads
from xmc.api.rest import BearerView
from xmc.auth.drf import IdentityUser


class HeadlinesView(BearerView):
    http_method_names = ["get"]

    def get(self, request: Request, xid: str) -> Response:
        user = request.user
        assert isinstance(user, IdentityUser)
        reads.require_experiment_role(int(xid), user.identity, Role.READER)
        return Response({"headlines": headline.for_experiment(int(xid))})


urlpatterns: list[URLPattern] = [
    re_path(r"^v1/experiments/(?P<xid>[0-9]{1,18})/headlines$", HeadlinesView.as_view(), name="rest-headlines"),
]
