"""The one read for a sweep: an experiment's work units with their arguments and metric summaries.

`summarize` is the read the experiment page (``ui``), the CLI (``xmc compare``, ``xmc status``, over
REST) and the API (``GET /v1/experiments/{xid}/workUnits:summarize``, `SummarizeView`) share: one
page of work units, filtered, ordered and paginated in the database by the listing machinery
(`xmc.listing`, the same AIP-160 parser as ListWorkUnits) over the work unit fields plus
``args.<name>`` and ``metrics.<name>.<last|min|max>`` (`xmc.api.sweep_columns`). It reads metric
summaries (`metrics.summaries`), never a point. See docs/architecture/sweeps.md.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.urls import URLPattern, path
from rest_framework.request import Request
from rest_framework.response import Response

from core import names
from core.errors import InvalidArgument
from core.identity import Identity
from experiments.acl import Role
from metrics import summaries
from metrics.summaries import Stats
from workunits import arguments
from xmc import listing
from xmc.api import handlers, reads
from xmc.api.rest import BearerView
from xmc.api.sweep_columns import SweepColumns, prepare

#: The order when the request names none.
DEFAULT_ORDER = ("wid",)
_LISTING_FIELDS = {"FilterError": "filter", "OrderByError": "orderBy", "PageTokenError": "pageToken",
                   "PageSizeError": "pageSize"}


@dataclass(frozen=True)
class SweepRow:
    """One work unit of a sweep: who it is, what it ran with, what it found (its current execution's)."""

    wid: int
    job_name: str
    state: str
    tags: list[str]
    notes: str
    args: dict[str, str]
    metrics: dict[str, Stats]

    def to_json(self) -> dict[str, Any]:
        return {"workUnitId": self.wid, "jobName": self.job_name, "state": self.state, "tags": self.tags,
                "notes": self.notes, "args": self.args,
                "metrics": {name: stats.to_json() for name, stats in self.metrics.items()}}


@dataclass(frozen=True)
class SweepPage:
    """A page of `SweepRow` and what the table around it needs."""

    rows: list[SweepRow]
    next_page_token: str
    #: The metric columns asked for (or every metric of the experiment, at most 50), sorted as asked.
    metrics: list[str]
    #: Arguments every work unit of the experiment has with the same value (the page shows them once).
    args_in_common: dict[str, str] = field(default_factory=dict)
    #: Arguments that differ between work units (the table's argument columns), sorted.
    varying_args: list[str] = field(default_factory=list)
    #: How many work units match the filter (all pages).
    total_size: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"workUnits": [row.to_json() for row in self.rows], "nextPageToken": self.next_page_token,
                "metrics": self.metrics, "argsInCommon": self.args_in_common, "varyingArgs": self.varying_args,
                "totalSize": self.total_size}


def _metric_columns(xid: int, wanted: Sequence[str] | None) -> list[str]:
    if not wanted:
        return summaries.experiment_metrics(xid)
    names = list(dict.fromkeys(name.strip() for name in wanted if name.strip()))
    if len(names) > summaries.MAX_METRICS:
        raise InvalidArgument(f"metrics: at most {summaries.MAX_METRICS} metrics, got {len(names)}", field="metrics")
    for name in names:
        if not summaries.has_metric(xid, name):
            raise InvalidArgument(f"metrics: experiments/{xid} has no metric {name!r}", field="metrics")
    return names


def summarize(identity: Identity, xid: int, *, metrics: Sequence[str] | None = None, filter: str = "",  # noqa: A002
              order_by: str = "", page_size: int = 0, page_token: str = "") -> SweepPage:
    """One page of experiment ``xid``'s work units with their arguments and metric summaries.

    * ``metrics``: the metric columns (default: every metric of the experiment, at most 50; an
      unknown one is INVALID_ARGUMENT naming ``metrics``).
    * ``filter``: AIP-160 over ListWorkUnits' fields (``state``, ``wid``, ``tags``, ``notes``, ...)
      plus ``args.<name>`` (a number comparison when both sides are numbers, else text) and
      ``metrics.<name>.<last|min|max>``.
    * ``order_by``: AIP-132 over ``wid``, ``state``, ``create_time``, ``update_time``, ``args.<name>``
      (numerically when every value of it is a number) and ``metrics.<name>.<stat>`` (units without
      the metric last); default ``wid``.
    * ``page_size`` (0: 100, at most 1,000) and ``page_token`` (opaque, bound to filter and order).

    Access first: a caller who may not read the experiment gets PERMISSION_DENIED whatever else is
    wrong. Every other mistake is INVALID_ARGUMENT naming the field (``filter``, ``orderBy``,
    ``pageToken``, ``pageSize``, ``metrics``). Filtering, ordering and paging run in the database
    (one query for the page's keys, one for its rows, one for their summaries, one for the count
    when filtered); the arguments' statistics are the rows the create path keeps (`xmc.api.sweep_columns.arg_stats`).
    """
    experiment = reads.experiment(xid, identity, Role.READER)
    counts: dict[str, Any] = getattr(experiment, "child_state_counts", None) or {}
    units = sum((int(n) for n in counts.values()), 0)
    names = _metric_columns(xid, metrics)
    with transaction.atomic(), connection.cursor() as cursor:
        # Over a large experiment the planner's cost estimates cross jit_above_cost, and compiling the
        # query (up to a second) would cost more than running it (about 100 ms at 100,000 units).
        cursor.execute("SET LOCAL jit = off")
        return _summarize(xid, units, names, filter, order_by, page_size, page_token)


def _summarize(xid: int, units: int, names: list[str], filter: str, order_by: str,  # noqa: A002
               page_size: int, page_token: str) -> SweepPage:
    columns = SweepColumns(xid, handlers.WORK_UNIT_FIELDS, handlers.WORK_UNIT_ORDER)
    prepare(columns, filter, order_by)
    base = columns.apply(handlers.work_units_of(xid))
    try:
        condition = listing.compile_filter(filter, columns.fields)
        order = listing.parse_order_by(order_by, columns.orderable, default=DEFAULT_ORDER)
        matching = base.filter(condition)
        # The page's keys first (narrow rows through the join and the sort), then its rows.
        keys, next_token = listing.paginate(
            matching.values("pk"), order=order, page_size=listing.resolve_page_size(page_size),
            page_token=page_token,
            fingerprint=listing.fingerprint_of(f"workUnits:summarize|experiments/{xid}", filter, order_by))
    except listing.ListingError as exc:
        raise InvalidArgument(str(exc), field=_LISTING_FIELDS.get(type(exc).__name__)) from None
    pks = [key["pk"] for key in keys]
    units_of: Any = handlers.work_units_of(xid)  # annotated (api_name): beyond what the stubs can see
    by_pk = {row["pk"]: row for row in units_of.filter(pk__in=pks).values(
        "pk", "wid", "current_eid", "executable", "current_state", "tags", "notes", "args")}
    items = [by_pk[pk] for pk in pks if pk in by_pk]
    found = summaries.summaries_of(((row["pk"], row["current_eid"]) for row in items), names)
    rows = [SweepRow(wid=row["wid"], job_name=arguments.job_name(row["executable"]), state=row["current_state"] or "",
                     tags=list(row["tags"] or []), notes=row["notes"], args=dict(row["args"] or {}),
                     metrics=found.get(row["pk"], {}))
            for row in items]
    stats = columns.args()
    common = {name: stat.common for name, stat in sorted(stats.items())
              if stat.units == units and stat.common is not None}
    return SweepPage(rows=rows, next_page_token=next_token, metrics=names, args_in_common=common,
                     varying_args=sorted(name for name in stats if name not in common),
                     total_size=matching.count() if filter.strip() else units)


# --- REST ----------------------------------------------------------------------------------------


def _int_param(request: Request, *names: str) -> int:
    for name in names:
        raw = request.query_params.get(name)
        if raw is not None and raw.strip():
            try:
                return int(raw)
            except ValueError:
                raise InvalidArgument(f"{names[0]} must be an integer, got {raw!r}", field=names[0]) from None
    return 0


def _param(request: Request, *names: str) -> str:
    for name in names:
        raw = request.query_params.get(name)
        if raw is not None:
            return str(raw)
    return ""


class SweepView(BearerView):
    http_method_names = ["get"]


class SummarizeView(SweepView):
    """``GET /v1/experiments/{xid}/workUnits:summarize``: `summarize` as JSON (lowerCamelCase)."""

    def get(self, request: Request, xid: int) -> Response:
        metrics = [m for m in _param(request, "metrics").split(",") if m.strip()]
        page = summarize(request.user.identity, int(xid), metrics=metrics, filter=_param(request, "filter"),
                         order_by=_param(request, "orderBy", "order_by"),
                         page_size=_int_param(request, "pageSize", "page_size"),
                         page_token=_param(request, "pageToken", "page_token"))
        return Response(page.to_json())


names.register_converters()  # <id:...>: ids spelled once (core.names.IdConverter)
urlpatterns: list[URLPattern] = [
    path("v1/experiments/<id:xid>/workUnits:summarize", SummarizeView.as_view(),
            name="rest-sweep-summarize"),
]


def openapi_paths() -> dict[str, Any]:
    """These endpoints in the OpenAPI document (merged by `xmc.api.openapi.build_document`)."""
    error = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    xid = {"name": "xid", "in": "path", "required": True, "schema": {"type": "string"}, "description": "experiment id"}

    def query(name: str, description: str, kind: str = "string") -> dict[str, Any]:
        return {"name": name, "in": "query", "required": False, "schema": {"type": kind}, "description": description}

    return {"/v1/experiments/{xid}/workUnits:summarize": {"get": {
        "operationId": "SummarizeWorkUnits",
        "x-path-template": "/v1/experiments/{xid}/workUnits:summarize",
        "x-not-an-rpc": True,
        "tags": ["experiments"],
        "summary": "A sweep's work units with their arguments and metric summaries (docs/architecture/sweeps.md)",
        "parameters": [
            xid,
            query("metrics", "comma-separated metric names (default: every metric of the experiment, at most 50)"),
            query("filter", "AIP-160 over ListWorkUnits' fields, args.<name> and metrics.<name>.<last|min|max>"),
            query("orderBy", "AIP-132: wid, state, create_time, update_time, args.<name>, metrics.<name>.<stat>"),
            query("pageSize", "at most 1000 (0: 100)", "integer"),
            query("pageToken", "from the previous page's nextPageToken"),
        ],
        "responses": {"200": {"description": "a page of work units", "content": {"application/json": {"schema": {
            "type": "object", "properties": {
                "workUnits": {"type": "array", "items": {"type": "object"}},
                "nextPageToken": {"type": "string"}, "metrics": {"type": "array", "items": {"type": "string"}},
                "argsInCommon": {"type": "object"}, "varyingArgs": {"type": "array", "items": {"type": "string"}},
                "totalSize": {"type": "integer"}}}}}},
            "400": error, "401": error, "403": error, "404": error, "429": error},
    }}}
