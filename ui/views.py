"""The researcher's pages: thin views over ``ui.reads`` (what they show) and the services (what they do).

Who calls them: ``ui.urls`` at the URLs the xmanager client prints
(``/experiments``, ``/experiments/<xid>``, ``/experiments/<xid>/workUnits/<wid>``).
Every view signs the person in with the site's session (``/login``, the same
users and throttling as ``xmanager login``), builds their `Identity` and asks
``ui.reads``, which checks the API's ACL rules first: a caller who may not
read an experiment, or a missing one or work unit, gets the same 404.
Actions are CSRF-protected POSTs through the same service functions as the
API's StopWorkUnit / RestartWorkUnit, after the same WRITER check, and are
only offered to a caller who holds it. Templates print every user-written
value as text (Django's autoescape); links only for http/https
(``ui.present.safe_url``).
"""
from __future__ import annotations

import csv
import io
import json
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import datetime
from functools import wraps
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth.views import LoginView
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse, reverse_lazy
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_GET, require_POST

from google.protobuf import field_mask_pb2

from artifacts import wire as artifact_wire
from core import pb
from core.errors import InvalidArgument, NotFound, PermissionDenied, ServiceError
from experiments.acl import Role
from k8s_bridge.logs import service as logs
from metrics import summaries, system_names
from notifications import services as notify
from ui import chart_cards, live, present, reads, study_reads
from ui import render as render_rows
from workunits import arguments
from workunits import services as wu_services
from workunits import eta, timeline
from xmc.api import registry
from xmc.auth.identity import Identity, Unauthenticated, identity_for_email
from xmc.auth.throttle import ThrottledAuthenticationForm

log = logging.getLogger(__name__)

View = Callable[..., HttpResponse]


class SignInView(LoginView):
    """``/login``: Django's username/password form with the login flow's throttling (``xmc.auth.throttle``)."""

    template_name = "ui/login.html"
    authentication_form = ThrottledAuthenticationForm
    redirect_authenticated_user = True
    next_page = reverse_lazy("ui-experiments")  # type: ignore[assignment]  # lazy str, as Django documents

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return with_csp(super().dispatch(request, *args, **kwargs))


def signed_in(view: View) -> View:
    """Session required (else the sign-in page); passes the caller's `Identity`; API errors -> 404/400."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect(f"{reverse('ui-login')}?{urlencode({'next': request.get_full_path()})}")
        email = str(getattr(request.user, "email", "") or "").strip()
        if not email:
            return render(request, "ui/error.html", {"message": "Your account has no email address; ask an "
                                                                 "operator to set one."}, status=403)
        try:
            identity = identity_for_email(email)
        except Unauthenticated as exc:
            return render(request, "ui/error.html", {"message": str(exc)}, status=403)
        try:
            response = view(request, identity, *args, **kwargs)
        except (NotFound, PermissionDenied, Http404):
            # Permission first: someone else's experiment reads exactly as a missing one.
            response = render(request, "ui/404.html", status=404)
        return with_csp(response)

    return wrapper


#: No inline script or style, nothing from elsewhere: the vendored htmx and ui.js, ui.css, same-origin requests.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'")


def with_csp(response: HttpResponseBase) -> HttpResponse:
    response["Content-Security-Policy"] = CSP
    response["Referrer-Policy"] = "same-origin"
    response["X-Content-Type-Options"] = "nosniff"
    return response  # type: ignore[return-value]  # a page or a streamed download, both served as is


def _ids(*values: str) -> list[int]:
    out = [int(v) for v in values]
    if any(v <= 0 or v > 2**63 - 1 for v in out):
        raise Http404("not found")
    return out


# --- /experiments ---------------------------------------------------------------------------------

@require_GET
@signed_in
def experiments(request: HttpRequest, identity: Identity) -> HttpResponse:
    get = request.GET
    query = reads.ExperimentQuery(q=get.get("q", "")[:200], state=get.get("state", ""), mine=get.get("mine") == "1",
                                  filter=get.get("filter", "")[:2000], order=get.get("order", "create_time desc"),
                                  page=get.get("page", "")[:2000])
    error = ""
    rows: list[dict[str, Any]] = []
    next_page = ""
    try:
        page = reads.experiments_page(identity, query)
        next_page = page.next_page_token
        now = reads.now()
        for e in page.items:
            counts = e.child_state_counts or {}
            severities = e.message_severity_counts or {}
            rows.append({
                "xid": e.id, "title": e.title, "creator": e.creator, "create_time": e.create_time,
                "active": e.active_state, "launch": e.launch_state, "rollup": present.rollup(counts),
                "units": sum(int(v) for v in counts.values()),
                "errors": int(severities.get("ERROR", 0) or 0) + int(severities.get("CRITICAL", 0) or 0),
                "warnings": int(severities.get("WARNING", 0) or 0),
                "duration": present.duration(e.create_time, e.complete_time or now),
            })
    except InvalidArgument as exc:
        error = str(exc)
    params = {k: v for k, v in get.items() if k != "page"}
    context = {
        "query": query, "rows": rows, "error": error, "orders": reads.ORDER_CHOICES, "states": reads.STATE_CHOICES,
        "next_url": f"?{urlencode({**params, 'page': next_page})}" if next_page else "",
        "first_url": f"?{urlencode(params)}" if query.page else "",
        "events_url": f"{reverse('ui-experiments-events')}?"
                      + urlencode({"since": live.top_id(), "x": ",".join(str(r["xid"]) for r in rows)}),
        "me": identity.email,
    }
    return render(request, "ui/experiments.html", context)


# --- /experiments/<xid> -------------------------------------------------------------------------

def _admissions(units: list[dict[str, Any]]) -> dict[str, list[datetime]]:
    """The recent admissions of the queues that queued units (with a position) wait in; no query without."""
    queues = [present.queue_name(u["executable"]) for u in units
              if (u["current"] or {}).get("state") == "SCHEDULING" and present.queue_position(u["current"] or {})]
    return eta.recent_admissions(queues, eta.ESTIMATE_WINDOW_S) if queues and eta.shown() else {}


_estimate = eta.estimate_for


def _unit_row(unit: dict[str, Any], now: datetime, varying: list[str], args: dict[str, str],
              admissions: dict[str, list[datetime]]) -> dict[str, Any]:
    current = unit["current"] or {}
    state = str(current.get("state") or "")
    queue = present.queue_name(unit["executable"])
    started = current.get("create_time")
    ended = current.get("complete_time") or (now if state not in present.TERMINAL else current.get("update_time"))
    said = present.why(state, current, queue, _estimate(state, current, queue, admissions, now))
    why = str(said["sentence"])
    # The system message is what the headline ("why") shortens: said once, on the unit's page.
    last = present.text_of(current.get("user_message")) or ("" if why else present.text_of(current.get("system_message")))
    return {
        "wid": unit["wid"], "state": state, "words": present.words(state), "eid": current.get("eid") or unit["current_eid"],
        "job": arguments.job_name(unit["executable"]), "tags": list(unit["tags"] or []), "notes": unit["notes"] or "",
        "why": why, "reason": said["reason"]["code"], "last": last, "started": started, "duration": present.duration(started, ended),
        "seconds": present.seconds(started, ended),
        "cells": [args.get(name, "") for name in varying],
        "metrics": {name: stats.last for name, stats in (unit.get("metrics") or {}).items()}, "stoppable": state not in present.TERMINAL
        and state != "STOPPING", "links": present.links(unit["urls"]),
    }


def _artifact_chips(xid: int, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each artifact as a chip and what it opens.

    A managed xprof artifact opens its profile (the xprof URL the API returns),
    not its own link, which the client sets to the work unit's page; a code
    source opens the code (`artifact`); anything else its link, if http(s).
    """
    chips = []
    for a in rows:
        own = present.safe_url(artifact_wire.served_url(a["url"] or {}).get("url"))
        if a["payload_kind"] == "managed_xprof":
            href = present.safe_url(a["xprof_url"]) or own
        elif a["payload_kind"] == "code_source":
            href = reverse("ui-artifact", args=[xid, a["id"]])
        else:
            href = own
        chips.append({**a, "href": href,
                      "label": (a["url"] or {}).get("displayName") or a["notes"] or f"artifact {a['id']}"})
    return chips


@require_GET
@signed_in
def artifact(request: HttpRequest, identity: Identity, xid: str, aid: str) -> HttpResponse:
    """One artifact's content (a code source's code, a text), for readers of its experiment."""
    x, a = _ids(xid, aid)
    reads.role(identity, x)  # the read check first: someone else's artifact is the 404 of a missing one
    row = reads.artifact(x, a)
    payload = row.payload or {}
    code = payload.get("codeSource") or {}
    context = {
        "xid": x, "wid": row.work_unit.wid if row.work_unit else None, "artifact": row,
        "label": (row.url or {}).get("displayName") or code.get("title") or row.notes or f"artifact {row.id}",
        "code": str(code.get("codeBlock") or ""), "code_title": str(code.get("title") or ""),
        "text": str((payload.get("text") or {}).get("text") or "") if isinstance(payload.get("text"), dict) else "",
        "other": "" if code or payload.get("text") else present.pretty_json(payload),
    }
    return render(request, "ui/artifact.html", context)


def _rows(units: list[dict[str, Any]], varying: list[str]) -> list[dict[str, Any]]:
    now = reads.now()
    admissions = _admissions(units)
    return [_unit_row(u, now, varying, present.job_args(u["executable"]), admissions) for u in units]


#: Metric columns the page shows when the URL names none (the experiment's own first, by name).
DEFAULT_METRIC_COLUMNS = 3


def unit_query(get: Any, metrics: Sequence[str] = ()) -> reads.UnitQuery:
    """The table's query string: ``filter``, ``sort`` (a column), ``dir``, ``page``, ``size``, the metric
    columns ``m`` (``metrics`` when none) and ``goal`` overrides (``loss:max``)."""
    page_text, size_text = get.get("page", "1"), get.get("size", "")
    size = int(size_text) if (size_text.isascii() and size_text.isdigit()) and int(size_text) in reads.UNIT_PAGE_SIZES else 100
    chosen = list(dict.fromkeys(m[:256] for m in get.getlist("m")[:summaries.MAX_METRICS] if m.strip())) or metrics
    overrides = dict(g.rsplit(":", 1) for g in get.getlist("goal")[:100] if g.rsplit(":", 1)[-1] in ("min", "max"))
    return reads.UnitQuery(filter=get.get("filter", "")[:2000], sort=get.get("sort", "wid")[:300] or "wid",
                           desc=get.get("dir") == "desc", size=size,
                           page=int(page_text) if (page_text.isascii() and page_text.isdigit()) and len(page_text) <= 9 else 1,
                           metrics=tuple(chosen),
                           goals=tuple((m, overrides.get(m) or present.goal(m)) for m in chosen))


def _check_query(xid: int, query: reads.UnitQuery) -> None:
    """A sort the table has no column for, or a metric column the experiment has no metric for: words, not a 500."""
    if query.sort not in reads.UNIT_SORTS and not query.sort.startswith(("arg:", "metric:")):
        raise InvalidArgument(f"cannot sort by {query.sort!r}: choose a column of the table", field="sort")
    for metric in query.metrics:
        if not summaries.has_metric(xid, metric):
            raise InvalidArgument(f"metrics: experiments/{xid} has no metric {metric!r}", field="metrics")


def _experiment_context(identity: Identity, xid: int, get: Any) -> dict[str, Any]:
    role, exp = reads.role(identity, xid)
    varying, shared = reads.sweep_args(xid)
    available = summaries.experiment_metrics(xid)
    query = unit_query(get, system_names.own_metrics(list(available))[:DEFAULT_METRIC_COLUMNS])
    error = ""
    page = reads.UnitPage([], 0, query)
    try:
        _check_query(xid, query)
        page = reads.unit_page(xid, query)
    except InvalidArgument as exc:
        error = str(exc)
    rows = _rows(page.rows, varying)
    now = reads.now()
    counts = exp["child_state_counts"] or {}
    return {
        "xid": xid, "exp": exp, "rows": rows, "varying": varying, "shared": shared, "error": error,
        "metric_columns": list(query.metrics), "available_metrics": available, "best": page.best,
        "goals": dict(query.goals),
        "importance_goal": "MAXIMIZE" if query.goals and query.goals[0][1] == "max" else "MINIMIZE",
        "metric_choices": [(m, m in query.metrics, dict(query.goals).get(m) or present.goal(m)) for m in available],
        "filter": query.filter, "query": page.query, "page": page, "first_row": (page.query.page - 1) * query.size + 1,
        "last_row": (page.query.page - 1) * query.size + len(rows), "sizes": reads.UNIT_PAGE_SIZES,
        "rollup": present.rollup(counts), "units": sum(int(v) for v in counts.values()),
        "can_write": role >= Role.WRITER, "links": present.links(exp["urls"]),
        "artifacts": _artifact_chips(xid, reads.artifacts(xid)),
        "duration": present.duration(exp["create_time"], exp["complete_time"] or now),
        "events_url": f"{reverse('ui-experiment-events', args=[xid])}?{urlencode({'since': live.top_id()})}",
        # "Notify me", or a link to the caller's subscription to this experiment when there is one.
        "subscription": next((s.id for s in notify.list_for(identity) if s.experiment_id == xid), None),
        "studies": study_reads.studies_of(xid),
    }


def _table_urls(request: HttpRequest, context: dict[str, Any]) -> dict[str, Any]:
    """The links of the table: each header's sort, the pages, the exports (every other parameter kept)."""
    params = {k: v for k, v in request.GET.items() if k not in ("fragment", "export")}
    query: reads.UnitQuery = context["query"]
    page: reads.UnitPage = context["page"]

    def url(**changes: Any) -> str:
        return "?" + urlencode({k: v for k, v in {**params, **changes}.items() if v not in ("", None)})

    def sort(key: str) -> dict[str, str]:
        on = query.sort == key
        return {"href": url(sort=key, dir="asc" if on and query.desc else ("desc" if on else ""), page=""),
                "dir": ("desc" if query.desc else "asc") if on else ""}

    return {
        "sorts": {key: sort(key) for key in reads.UNIT_SORTS},
        "arg_sorts": [(name, sort(f"arg:{name}")) for name in context["varying"]],
        "metric_sorts": [(name, sort(f"metric:{name}"), context["goals"].get(name, "")) for name in context["metric_columns"]],
        "prev_url": url(page=query.page - 1) if query.page > 1 else "",
        "next_url": url(page=query.page + 1) if query.page < page.pages else "",
        "first_url": url(page="") if query.page > 1 else "",
        "last_url": url(page=page.pages) if query.page < page.pages else "",
        "csv_url": url(export="csv", page=""), "json_url": url(export="json", page=""),
        "compare_all_url": reverse("ui-compare", args=[context["xid"]]) + "?" + urlencode(
            {"all": "1", "filter": query.filter}),
        "hidden": {k: v for k, v in params.items() if k in ("sort", "dir", "size")},
    }


@require_GET
@signed_in
def experiment(request: HttpRequest, identity: Identity, xid: str) -> HttpResponse:
    (x,) = _ids(xid)
    fragment = request.GET.get("fragment")
    if fragment in ("row", "edit"):
        return _unit_row_fragment(request, identity, x, edit=fragment == "edit")
    if request.GET.get("export") in ("csv", "json"):
        return _export(request, identity, x, request.GET["export"])
    context = _experiment_context(identity, x, request.GET)
    if fragment == "summary":
        return render(request, "ui/_experiment_summary.html", context)
    # Escaped value by value in ui.render (a template loop over 1,000 rows was most of the page's time).
    context["rows_html"] = mark_safe(render_rows.unit_rows(  # noqa: S308
        context["rows"], x, context["can_write"], context["varying"], context["metric_columns"], context["best"]))
    return render(request, "ui/experiment.html", {**context, **_table_urls(request, context)})


#: The exported columns, in the table's order (the sweep's arguments go after ``job``).
EXPORT_HEAD = ("wid", "state", "exec", "job")
EXPORT_TAIL = ("tags", "notes", "why", "last_message", "started", "duration_s")


def _export_record(row: dict[str, Any], varying: list[str], metrics: Sequence[str]) -> dict[str, Any]:
    return {"wid": row["wid"], "state": row["state"], "exec": row["eid"], "job": row["job"],
            **{f"arg:{name}": cell for name, cell in zip(varying, row["cells"])},
            **{f"metric:{name}": row["metrics"].get(name) for name in metrics},
            "tags": row["tags"], "notes": row["notes"], "why": row["why"], "last_message": row["last"],
            "started": row["started"].isoformat() if row["started"] else "", "duration_s": row["seconds"]}


def _export(request: HttpRequest, identity: Identity, xid: int, kind: str) -> HttpResponse:
    """The table as CSV or JSON: every work unit the filter matches, in the table's order, with its columns."""
    reads.role(identity, xid)
    varying, _ = reads.sweep_args(xid)
    query = unit_query(request.GET, system_names.own_metrics(list(summaries.experiment_metrics(xid)))[:DEFAULT_METRIC_COLUMNS])
    try:
        _check_query(xid, query)
        reads.unit_page(xid, replace(query, size=1, page=1))  # a bad filter or sort: 400, before streaming
    except InvalidArgument as exc:
        return render(request, "ui/error.html", {"message": f"{exc.field}: {exc}"}, status=400)
    columns = [*EXPORT_HEAD, *(f"arg:{name}" for name in varying), *(f"metric:{m}" for m in query.metrics),
               *EXPORT_TAIL]

    def records() -> Iterator[dict[str, Any]]:
        for chunk in reads.unit_rows(xid, query):
            for row in _rows(chunk, varying):
                yield _export_record(row, varying, query.metrics)

    def csv_body() -> Iterator[str]:
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(columns)
        for record in records():
            writer.writerow(" ".join(v) if isinstance(v, list) else ("" if v is None else v)
                            for v in (record[c] for c in columns))
            if out.tell() > 64 * 1024:
                yield out.getvalue()
                out.seek(0)
                out.truncate()
        yield out.getvalue()

    def json_body() -> Iterator[str]:
        yield '{"columns": ' + json.dumps(columns) + ', "rows": ['
        for i, record in enumerate(records()):
            yield ("," if i else "") + json.dumps(record, default=str)
        yield "]}"

    body, content_type = (csv_body(), "text/csv; charset=utf-8") if kind == "csv" else \
        (json_body(), "application/json")
    response = StreamingHttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="xmc-{xid}-work-units.{kind}"'
    return with_csp(response)


def _unit_row_fragment(request: HttpRequest, identity: Identity, xid: int, *, edit: bool = False) -> HttpResponse:
    """One work unit's row again (an event re-fetches it), reading only that unit; ``col`` names the sweep columns.

    ``edit``: the row as a form for its tags and notes (a writer's "Edit").
    """
    role, _ = reads.role(identity, xid)
    wid_text = request.GET.get("wid", "")
    units = reads.work_units(xid, wids=[int(wid_text)]) if (wid_text.isascii() and wid_text.isdigit()) and len(wid_text) <= 18 else []
    if not units:
        raise Http404("not found")
    columns = [c[:200] for c in request.GET.getlist("col")[:200]]
    if edit:
        if role < Role.WRITER:
            return render(request, "ui/error.html", {"message": "You may only read this experiment."}, status=403)
        return _edit_row(request, xid, units[0], columns, request.GET)
    return HttpResponse(_row_html(xid, units[0], role >= Role.WRITER, columns, request.GET))


def _row_html(xid: int, unit: dict[str, Any], can_write: bool, columns: list[str], params: Any) -> str:
    """One row again, with the metric columns (``m``) and best values (``b``, ``metric:value``) its URL names."""
    metrics = [m[:256] for m in params.getlist("m")[:summaries.MAX_METRICS]]
    best: dict[str, float | None] = {}
    for item in params.getlist("b")[:summaries.MAX_METRICS]:
        name, _, value = item.rpartition(":")
        try:
            best[name] = float(value)
        except ValueError:
            continue
    unit = reads.with_metrics(unit, metrics)
    row = _unit_row(unit, reads.now(), columns, present.job_args(unit["executable"]), _admissions([unit]))
    return render_rows.unit_row(row, xid, can_write, columns, metrics, best)


def _edit_row(request: HttpRequest, xid: int, unit: dict[str, Any], columns: list[str], params: Any, *,
              tags: str | None = None, notes: str | None = None, error: str = "", status: int = 200) -> HttpResponse:
    keep = [(k, v[:300]) for k in ("m", "b") for v in params.getlist(k)[:summaries.MAX_METRICS]]
    return render(request, "ui/_edit_row.html", {
        "xid": xid, "wid": unit["wid"], "columns": columns, "keep": keep, "error": error,
        "span": 12 + len(columns) + len(params.getlist("m")),
        "tags": ", ".join(unit["tags"] or []) if tags is None else tags,
        "notes": unit["notes"] if notes is None else notes,
        "cancel": f"{reverse('ui-experiment', args=[xid])}?" + urlencode(
            [("fragment", "row"), ("wid", unit["wid"]), *(("col", c) for c in columns), *keep]),
    }, status=status)


#: Tags typed in the edit form: separated by commas (or new lines).
_TAG_SPLIT = re.compile(r"[,\n]")


@require_POST
@signed_in
def annotate(request: HttpRequest, identity: Identity, xid: str, wid: str) -> HttpResponse:
    """Save a work unit's tags and notes (the table's inline edit): the API's UpdateWorkUnit, as the caller.

    Its access check (WRITER) and validation are the API's; a refused value comes back in the form with the
    field it names (422, which htmx swaps in), and nothing is written. Answers the row, drawn again.
    """
    x, w = _ids(xid, wid)
    role, _ = reads.role(identity, x)
    units = reads.work_units(x, wids=[w])
    if not units:
        raise Http404("not found")
    columns = [c[:200] for c in request.POST.getlist("col")[:200]]
    tags_text, notes = request.POST.get("tags", ""), request.POST.get("notes", "")
    tags = [t.strip() for t in _TAG_SPLIT.split(tags_text) if t.strip()]
    message = pb.work_unit.WorkUnit(name=f"experiments/{x}/workUnits/{w}", tags=tags, notes=notes)
    try:
        registry.invoke(registry.ESS, "UpdateWorkUnit", pb.api.UpdateWorkUnitRequest(
            work_unit=message, update_mask=field_mask_pb2.FieldMask(paths=["tags", "notes"])),
            registry.Caller(identity))
    except PermissionDenied:
        return render(request, "ui/error.html", {"message": "You may only read this experiment."}, status=403)
    except ServiceError as exc:
        return _edit_row(request, x, units[0], columns, request.POST, tags=tags_text, notes=notes,
                         error=f"{exc.field or 'work_unit'}: {exc}", status=422)
    log.info("ui.annotate", extra={"xid": x, "wid": w, "by": identity.email})
    return HttpResponse(_row_html(x, reads.work_units(x, wids=[w])[0], role >= Role.WRITER, columns, request.POST))


_ACTIONS: dict[str, tuple[str, Callable[..., Any]]] = {
    "stop": ("Stop", wu_services.stop_work_units),
    "restart": ("Restart", wu_services.restart_work_units),
}


@require_POST
@signed_in
def act(request: HttpRequest, identity: Identity, xid: str) -> HttpResponse:
    """Bulk stop / restart of the selected work units: a confirmation page, then one result per unit."""
    (x,) = _ids(xid)
    role, exp = reads.role(identity, x)
    action = request.POST.get("action", "")
    if action not in _ACTIONS:
        return render(request, "ui/error.html", {"message": "Unknown action."}, status=400)
    if role < Role.WRITER:
        return render(request, "ui/error.html", {"message": "You may only read this experiment."}, status=403)
    wids = sorted({int(w) for w in request.POST.getlist("wid") if w.isdigit()})[:reads.MAX_ACTION_UNITS]
    label, service = _ACTIONS[action]
    context: dict[str, Any] = {"xid": x, "exp": exp, "action": action, "label": label, "wids": wids}
    if not wids:
        context["message"] = "Select at least one work unit."
        return render(request, "ui/confirm.html", context, status=400)
    if request.POST.get("confirm") != "yes":
        return render(request, "ui/confirm.html", context)
    requester = wu_services.Requester(email=identity.email)
    results = []
    for wid in wids:
        try:
            op = service(x, [wid], batch=False, requester=requester)
            results.append({"wid": wid, "ok": True, "text": f"{label.lower()} requested (operation {op.id})"})
        except ServiceError as exc:
            results.append({"wid": wid, "ok": False, "text": str(exc)})
    log.info("ui.action", extra={"xid": x, "action": action, "count": len(wids), "by": identity.email})
    return render(request, "ui/result.html", {**context, "results": results})


# --- /experiments/<xid>/workUnits/<wid> ------------------------------------------------------------

def _timeline(history: list[dict[str, Any]], end: datetime, title: str) -> str:
    bands = timeline.segments([(h["time"], h["to_state"]) for h in history], end)
    return timeline.svg(bands, title=title, inline_style=False) + timeline.legend(bands)


def _why(state: str, shown: dict[str, Any], queue: str, estimate: str) -> dict[str, str]:
    """The server's sentence and its reason's code (``workunits.headline``), as ``xmc why`` prints them."""
    said = present.why(state, shown, queue, estimate)
    return {"why": str(said["sentence"]), "reason": str(said["reason"]["code"])}


def _work_unit_context(identity: Identity, xid: int, wid: int) -> dict[str, Any]:
    role, exp = reads.role(identity, xid)
    unit, executions = reads.work_unit(xid, wid, identity)
    now = reads.now()
    queue = present.queue_name(unit["executable"])
    views = []
    for ex in executions:
        end = ex.complete_time or (ex.history[-1]["time"] if ex.state in present.TERMINAL and ex.history else now)
        failed = ex.state in ("FAILED", "PARTIALLY_FAILED")
        failure = (ex.system_message or {}) if failed else None
        shown = {"state": ex.state, "scheduling_information": ex.scheduling_information,
                 "system_message": ex.system_message}
        views.append({
            "ex": ex, "words": present.words(ex.state), "duration": present.duration(ex.create_time, end),
            "timeline": _timeline(ex.history, end, f"execution {ex.eid}") if ex.history else "",
            **_why(ex.state, shown, queue, _estimate(
                ex.state, shown, queue, _admissions([{"executable": unit["executable"], "current": shown}]), now)),
            "failed": failed, "failure": failure, "failure_trace": ((failure or {}).get("auxiliaryInfo") or {}).get("stackTrace", ""),
            "failure_link": present.safe_url((failure or {}).get("userFacingUrl")),
            "system": present.text_of(ex.system_message), "user": present.text_of(ex.user_message),
            "scheduling": present.text_of(ex.scheduling_information),
            "details": present.pretty_json(ex.detailed_status), "metadata": present.pretty_json(ex.metadata),
        })
    current = views[0] if views else None
    shown_above = present.failure_said(current["system"] if current and current["failed"] else "")
    messages = [{**m, "text": present.text_of(m["content"]),
                 "link": present.safe_url(m["content"].get("userFacingUrl")),
                 "trace": str((m["content"].get("auxiliaryInfo") or {}).get("stackTrace") or "")}
                for m in reads.messages(xid, wid) if not shown_above(present.text_of(m["content"]))]
    listed = {m["text"] for m in messages}
    for v in views:  # an execution's system message is in the messages list: not said again on its card
        v["system_listed"] = v["system"] in listed
    state = current["ex"].state if current else ""
    return {
        "xid": xid, "wid": wid, "exp": exp, "unit": unit, "executions": views, "current": current,
        "state": state, "words": present.words(state), "messages": messages,
        "args": present.job_args(unit["executable"]), "env": present.job_env(unit["executable"]),
        "queue": present.queue_name(unit["executable"]), "links": present.links(unit["urls"]),
        "artifacts": _artifact_chips(xid, reads.artifacts(xid, wid)),
        "can_write": role >= Role.WRITER, "stoppable": state not in present.TERMINAL and state != "STOPPING",
        "executable": present.pretty_json(unit["executable"]),
        "events_url": f"{reverse('ui-experiment-events', args=[xid])}?"
                      + urlencode({"since": live.top_id(), "wid": wid, "metrics": "1"}),
    }


@require_GET
@signed_in
def work_unit(request: HttpRequest, identity: Identity, xid: str, wid: str) -> HttpResponse:
    x, w = _ids(xid, wid)
    fragment = request.GET.get("fragment")
    if fragment == "metrics":  # the Metrics section's contents again: its first points, a new metric or chart
        reads.role(identity, x)
        reads.work_unit(x, w, identity)
        metrics = chart_cards.work_unit_metrics(x, w)
        if request.GET.get("have") == metrics["metrics_key"]:
            return HttpResponse(status=204)  # the same charts: the page keeps them (htmx swaps nothing)
        return render(request, "ui/_metrics_body.html", {"xid": x, "wid": w, **metrics})  # the section's contents
    context = _work_unit_context(identity, x, w)
    if fragment == "main":  # its Metrics section is a placeholder: the page keeps its drawn charts (hx-preserve)
        return render(request, "ui/_work_unit_main.html", {**context, "metrics_placeholder": True})
    return render(request, "ui/work_unit.html", {**context, **chart_cards.work_unit_metrics(x, w)})


# --- The logs panel -----------------------------------------------------------------------------

#: Lines one panel page shows; "older" asks for the next page (never the whole 10 MiB).
LOG_PAGE = 500
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,251}[a-z0-9])?$")


def _log_query(request: HttpRequest) -> tuple[int, str | None, str | None, int]:
    """(eid or 0 for the current one, replica, container, pages) from the panel's query string."""
    get = request.GET
    eid_text, pages_text = get.get("eid", ""), get.get("pages", "1")
    eid = int(eid_text) if eid_text.isdigit() and len(eid_text) <= 18 else 0
    replica = get.get("replica") or None
    container = get.get("container") or None
    for value in (replica, container):
        if value is not None and value != logs.ALL_REPLICAS and not _NAME.match(value):
            raise Http404("not found")
    pages = int(pages_text) if pages_text.isdigit() and len(pages_text) <= 3 else 1
    return eid, replica, container, max(1, min(pages, 400))


def highlight(text: str, needle: str) -> list[tuple[str, bool]]:
    """``text`` cut into (piece, is_match) for the template to print as text, matches in <mark>."""
    if not needle:
        return [(text, False)]
    out, pattern = [], re.compile(re.escape(needle), re.IGNORECASE)
    last = 0
    for match in pattern.finditer(text):
        out.append((text[last:match.start()], False))
        out.append((match.group(0), True))
        last = match.end()
    out.append((text[last:], False))
    return [piece for piece in out if piece[0]]


def line_matches(text: str, needle: str) -> bool:
    """Whether a log line matches the panel's search (case-insensitive; no search matches nothing)."""
    return bool(needle) and needle.lower() in text.lower()


def log_line_html(line: logs.LogLine, *, needle: str, timestamps: bool, with_replica: bool = False) -> SafeString:
    """One log line as the panel prints it inside its ``<pre>``: the line's ``<span>`` (class ``hit``
    when it matches ``needle``), the timestamp and replica when asked, the text escaped with the
    matches in ``<mark>``, and the newline. The panel and its Follow stream (``ui.logfollow``) both
    print lines with this."""
    body = "".join(f"<mark>{escape(piece)}</mark>" if hit else str(escape(piece))
                   for piece, hit in highlight(line.text, needle))
    stamp = f'<span class="ts">{escape(line.timestamp)} </span>' if timestamps else ""
    replica = f'<span class="rep">[{escape(line.replica)}] </span>' if with_replica else ""
    html = f'<span class="{"hit" if line_matches(line.text, needle) else ""}">{stamp}{replica}{body}\n</span>'
    return mark_safe(html)  # noqa: S308 - every piece of the line is escaped above


def log_target(request: HttpRequest, identity: Identity, x: int, w: int
                ) -> tuple[Any, int, str, str | None, str | None, int]:
    """The executions, the asked (or current) execution id, its namespace, replica, container and pages."""
    unit, executions = reads.work_unit(x, w, identity)
    eid, replica, container, pages = _log_query(request)
    eid = eid or unit["current_eid"]
    execution = next((ex for ex in executions if ex.eid == eid), None)
    if execution is None:
        raise Http404("not found")
    namespace = str((execution.metadata or {}).get("namespace") or settings.XMC_K8S_NAMESPACE)
    return executions, eid, namespace, replica, container, pages


@require_GET
@signed_in
def logs_panel(request: HttpRequest, identity: Identity, xid: str, wid: str) -> HttpResponse:
    """The panel (``hx-get`` from the work unit page): the last pages of one replica's container log."""
    x, w = _ids(xid, wid)
    executions, eid, namespace, replica, container, pages = log_target(request, identity, x, w)
    needle = request.GET.get("q", "")[:200]
    timestamps = request.GET.get("ts") == "1"
    follow = request.GET.get("follow") == "1"
    error, stream = "", None
    lines: list[dict[str, Any]] = []
    more = False
    try:
        stream = logs.open_logs(x, w, eid, namespace, logs.LogQuery(replica=replica, container=container,
                                                                    tail_lines=LOG_PAGE * pages + 1))
        got = list(stream.lines)
        more = len(got) > LOG_PAGE * pages
        with_replica = stream.replica == logs.ALL_REPLICAS
        lines = [{"ts": line.timestamp, "match": line_matches(line.text, needle),
                  "html": log_line_html(line, needle=needle, timestamps=timestamps, with_replica=with_replica)}
                 for line in got[-LOG_PAGE * pages:]]
    except ServiceError as exc:
        error = str(exc)
    params = {k: v for k, v in request.GET.items()}
    context = {
        "xid": x, "wid": w, "eid": eid, "eids": [ex.eid for ex in executions], "stream": stream, "lines": lines,
        "error": error, "q": needle, "ts": timestamps, "follow": follow, "more": more, "pages": pages,
        "older_url": "?" + urlencode({**params, "pages": pages + 1}),
        "download_url": reverse("ui-logs-download", args=[x, w]) + "?" + urlencode(
            {k: v for k, v in {"eid": eid, "replica": stream.replica if stream else "",
                               "container": stream.container if stream else ""}.items() if v}),
        "matches": sum(1 for line in lines if line["match"]),
        # Follow: the lines after the last one shown, pushed by ui.logfollow (an event stream).
        "follow_url": reverse("ui-logs-follow", args=[x, w]) + "?" + urlencode(
            {k: v for k, v in {"eid": eid, "replica": stream.replica if stream else "",
                               "container": stream.container if stream else "", "ts": "1" if timestamps else "",
                               "q": needle, "after": lines[-1]["ts"] if lines else ""}.items() if v}),
    }
    return render(request, "ui/_logs.html", context)


@require_GET
@signed_in
def logs_download(request: HttpRequest, identity: Identity, xid: str, wid: str) -> HttpResponse:
    """The whole log of one replica's container as a text file (streamed, up to the service's cap)."""
    x, w = _ids(xid, wid)
    _, eid, namespace, replica, container, _ = log_target(request, identity, x, w)
    try:
        stream = logs.open_logs(x, w, eid, namespace, logs.LogQuery(replica=replica, container=container))
    except ServiceError as exc:
        return render(request, "ui/error.html", {"message": str(exc)}, status=503)

    def body() -> Iterator[bytes]:
        for line in stream.lines:
            yield f"{line.timestamp} {line.text}\n".encode() if request.GET.get("ts") == "1" else \
                f"{line.text}\n".encode()

    response = StreamingHttpResponse(body(), content_type="text/plain; charset=utf-8")
    name = f"xmc-{x}-{w}-{eid}-{stream.replica}-{stream.container}.log".replace('"', "")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return with_csp(response)
