"""The study page: a hyperparameter study's trials, its best trial, its history, and the sweep analysis views.

``GET /experiments/<xid>/studies/<sid>`` (`study`): the study's summary and best trial so far; the
optimisation history (each finished trial's objective and the best so far, by trial number; data at
``.../history``, `history`, drawn by the chart script like any chart); parameter importance and
parallel coordinates, the experiment page's and compare view's own (``ui.compare.importance``
restricted to the study's trials, ``ui/static/ui/compare.js``); and the trials table, sorted and
paginated in the database (`trial_page`). Live: the page listens to its experiment's event stream and
reads its live part again (``?fragment=live``), and its history, on each ``study-<sid>`` event: the
study controller's committed change of a trial (started, completed, failed, pruned) or of the study
(``studies.hooks`` -> ``ui.live.publish_study``), so a trial's result shows as soon as it is
written. Permission first, as every page (``ui.reads.role``); someone else's study is
404. The reads are the page's own, `ui.study_reads`.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from experiments.acl import Role
from studies import services as study_services
from studies.models import Study, TrialState
from ui import live, plotdata, reads
from ui.study_reads import (PAGE_SIZES, PARALLEL_MAX, SORTS, TrialPage, TrialQuery, get_study, history_points, parallel_data,
                            trial_page, trial_query)
from ui.views import _ids, signed_in
from xmc.auth.identity import Identity



def _sort_links(get: Mapping[str, str], query: TrialQuery, keys: Sequence[str]) -> dict[str, dict[str, str]]:
    params = {k: v for k, v in get.items() if k in ("size",)}

    def link(key: str) -> dict[str, str]:
        on = query.sort == key
        direction = ("asc" if query.desc else "desc") if on else "asc"
        return {"href": "?" + urlencode({**params, "sort": key, "dir": direction}),
                "dir": ("desc" if query.desc else "asc") if on else ""}

    return {key: link(key) for key in keys}


def _page_links(query: TrialQuery, page: TrialPage) -> dict[str, str]:
    base = {"sort": query.sort, "dir": "desc" if query.desc else "asc", "size": str(query.size)}

    def at(n: int) -> str:
        return "?" + urlencode({**base, "page": str(n)})

    current = page.query.page
    return {"first_url": at(1) if current > 1 else "", "prev_url": at(current - 1) if current > 1 else "",
            "next_url": at(current + 1) if current < page.pages else "",
            "last_url": at(page.pages) if current < page.pages else ""}


def _context(request: HttpRequest, xid: int, study: Study) -> dict[str, Any]:
    names = list(study.parameters or {})
    query = trial_query(request.GET, names)
    page = trial_page(study, query)
    counts = {state: n for state, n in study_services.counts(study.id).items() if n}
    keys = [*SORTS, *(f"param:{n}" for n in names)]
    parallel = parallel_data(study, names)
    sorts = _sort_links(request.GET, query, keys)
    live_params = {k: v for k, v in request.GET.items() if k in ("sort", "dir", "page", "size")}
    return {
        "xid": xid, "study": study, "names": names, "page": page, "query": page.query,
        "rows": [{**r, "cells": [(r["parameters"] or {}).get(n, "") for n in names]} for r in page.rows],
        "counts": sorted(counts.items()), "trials": sum(counts.values()),
        "running": counts.get(TrialState.RUNNING, 0), "best": study_services.best_trial(study),
        "sorts": sorts, "param_sorts": [(n, sorts[f"param:{n}"]) for n in names],
        "parallel": parallel, "parallel_max": PARALLEL_MAX, "parallel_json": json.dumps(parallel), "sizes": PAGE_SIZES,
        "first_row": (page.query.page - 1) * query.size + 1, "last_row": (page.query.page - 1) * query.size + len(page.rows),
        "live_url": reverse("ui-study", args=[xid, study.id]) + "?" + urlencode({**live_params, "fragment": "live"}),
        **_page_links(query, page),
    }


@require_GET
@signed_in
def study(request: HttpRequest, identity: Identity, xid: str, sid: str) -> HttpResponse:
    x, s = _ids(xid, sid)
    role, found = get_study(identity, x, s)
    context = {**_context(request, x, found), "can_write": role >= Role.WRITER}
    if request.GET.get("fragment") == "live":
        return render(request, "ui/_study_live.html", context)
    _, exp = reads.role(identity, x)
    return render(request, "ui/study.html", {
        **context, "exp": exp,
        "history_src": reverse("ui-study-history", args=[x, s]),
        "importance_src": reverse("ui-importance", args=[x]) + "?" + urlencode(
            {"metric": found.metric, "goal": found.goal, "stat": found.stat, "study": found.id}),
        "events_url": f"{reverse('ui-experiment-events', args=[x])}?{urlencode({'since': live.top_id()})}",
    })


@require_GET
@signed_in
def history(request: HttpRequest, identity: Identity, xid: str, sid: str) -> HttpResponse:
    """The optimisation history as the chart script's JSON (``ui.plotdata``'s ``lines`` plot): x is the
    trial number, one series of completed trials' values (drawn as points) and one of the best so far."""
    x, s = _ids(xid, sid)
    _, found = get_study(identity, x, s)
    width = plotdata.width_of(request.GET.get("width"))
    xs, values, best = history_points(found, width)
    goal = "lowest" if found.goal == "MINIMIZE" else "highest"
    plot = {"kind": "lines", "x": "step", "x_label": "trial", "x_scale": "linear", "y_scale": "linear",
            "style": "line", "xs": xs, "title": f"{found.metric} ({found.stat}) by trial",
            "series": [{"label": f"trial {found.metric}", "metric": found.metric, "wid": None, "y": values,
                        "style": "points"},
                       {"label": f"best so far ({goal})", "metric": found.metric, "wid": None, "y": best}],
            "hlines": [], "vlines": [], "points": len(xs)}
    response = JsonResponse({"name": found.name, "width": width, "layout": {"kind": "wrap", "columns": 1, "cells": {}},
                             "plots": [plot], "points": len(xs)})
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@signed_in
def stop(request: HttpRequest, identity: Identity, xid: str, sid: str) -> HttpResponse:
    """"Stop study" (a writer's button): ``studies.services.stop_study``, as ``:stop`` over REST; the
    controller then stops the running trials and ends the study STOPPED. Back to the page."""
    x, s = _ids(xid, sid)
    role, _ = get_study(identity, x, s)
    if role < Role.WRITER:
        return render(request, "ui/error.html", {"message": "You may only read this experiment."}, status=403)
    study_services.stop_study(x, s)
    return redirect("ui-study", x, s)
