"""The web's input middleware: every path, query parameter and form field checked by `core.inputs`.

Installed early in ``MIDDLEWARE`` (`xmc.settings`), before sessions and
views, so no view, form or ORM lookup ever sees a NUL character or a lone
surrogate in a path, a query parameter (name or value) or a form field:
Postgres refuses the first and UTF-8 cannot encode the second, and either
used to end as an HTTP 500 deep inside a view. The answer is 400, in the
API's error shape under ``/v1/`` and as plain text elsewhere, naming the
parameter.
"""
from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse

from core import inputs
from core.errors import InvalidArgument
from xmc.api.rest import error_body

_FORM = "application/x-www-form-urlencoded"


class InputMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        try:
            check_request(request)
        except InvalidArgument as exc:
            return _bad_request(request, exc)
        return self.get_response(request)


def check_request(request: HttpRequest) -> None:
    """INVALID_ARGUMENT naming the first path, query or form value that is not storable text."""
    inputs.check_text(request.path, "path", limit=8 * 1024)
    sources = [("query parameter", request.GET)]
    if request.content_type == _FORM and request.method not in ("GET", "HEAD"):
        sources.append(("form field", request.POST))
    for kind, values in sources:
        for key, items in values.lists():
            inputs.check_text(key, f"{kind} name {key[:40]!r}", limit=256)
            for item in items:
                inputs.check_text(item, key[:40] or kind)


def _bad_request(request: HttpRequest, exc: InvalidArgument) -> HttpResponseBase:
    if request.path.startswith("/v1/"):
        return JsonResponse(error_body(400, "INVALID_ARGUMENT", exc.message, field=exc.field), status=400)
    return HttpResponse(exc.message + "\n", status=400, content_type="text/plain; charset=utf-8")
