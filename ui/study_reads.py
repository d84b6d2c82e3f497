"""The study page's reads: a study's trials sorted and paginated in the database, its best trial, its
history, its parallel coordinates, and an experiment's studies (``ui.studies`` renders them).

The page's own reads, beside the studies app's services (``studies.services``: the REST API's, whose
best trial and counts the page uses too); each is one or
two SQL queries whatever the number of trials (`trial_page` sorts and cuts in the database,
`history_points` reads two columns, `parallel_data` at most `PARALLEL_MAX` rows).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, F, Q, QuerySet
from django.db.models.fields.json import KeyTransform
from django.http import Http404

from core.errors import NotFound, PermissionDenied
from studies.models import Study, Trial, TrialState
from ui import reads
from xmc.auth.identity import Identity

#: Rows per page of the trials table (the first is the default).
PAGE_SIZES = (50, 100, 500)
#: Columns the trials table sorts by (besides ``param:<name>``), to the model's fields.
SORTS = {"number": "number", "wid": "wid", "state": "state", "value": "value", "pruned": "pruned_at_step"}
#: Trials the parallel coordinates draw at most (the best ones: lines beyond that are a grey wall).
PARALLEL_MAX = 500
#: Studies the experiment page links at most (the newest).
EXPERIMENT_STUDIES = 10


@dataclass(frozen=True)
class TrialQuery:
    sort: str = "number"
    desc: bool = False
    page: int = 1
    size: int = PAGE_SIZES[0]


@dataclass(frozen=True)
class TrialPage:
    rows: list[dict[str, Any]]
    total: int
    query: TrialQuery

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.query.size))


def trial_query(get: Mapping[str, str], names: Sequence[str]) -> TrialQuery:
    """The table's query string (``sort``, ``dir``, ``page``, ``size``); anything unknown is the default."""
    sort = get.get("sort", "number")
    if sort not in SORTS and not (sort.startswith("param:") and sort[len("param:"):] in names):
        sort = "number"
    size = int(get["size"]) if get.get("size", "") in {str(n) for n in PAGE_SIZES} else PAGE_SIZES[0]
    page_text = get.get("page", "1")
    page = int(page_text) if page_text.isascii() and page_text.isdigit() and len(page_text) <= 9 else 1
    return TrialQuery(sort=sort, desc=get.get("dir") == "desc", page=max(1, page), size=size)


def get_study(identity: Identity, xid: int, sid: int) -> tuple[Any, Study]:
    """The caller's role on the experiment and its study ``sid``; 404 when either is not theirs to read."""
    try:
        role, _ = reads.role(identity, xid)
    except (NotFound, PermissionDenied):
        raise Http404("not found") from None
    study = Study.objects.filter(experiment_id=xid, id=sid).first()
    if study is None:
        raise Http404("not found")
    return role, study


def _ordering(study: Study, query: TrialQuery) -> list[Any]:
    if query.sort.startswith("param:"):
        key: Any = KeyTransform(query.sort[len("param:"):], "parameters")
    else:
        key = F(SORTS[query.sort])
    first = key.desc(nulls_last=True) if query.desc else key.asc(nulls_last=True)
    return [first, F("number").desc() if query.desc else F("number").asc()]


def trial_page(study: Study, query: TrialQuery) -> TrialPage:
    """One page of the study's trials, sorted and cut in the database."""
    trials = Trial.objects.filter(study=study)
    total = trials.count()
    page = min(query.page, max(1, -(-total // query.size)))
    start = (page - 1) * query.size
    rows: list[dict[str, Any]] = [dict(row) for row in trials.order_by(*_ordering(study, query)).values(
        "number", "wid", "state", "parameters", "value", "pruned_at_step", "message")[start:start + query.size]]
    return TrialPage(rows, total, TrialQuery(query.sort, query.desc, page, query.size))


def finished(study: Study) -> QuerySet[Trial]:
    """Trials with an objective value (completed ones; pruned ones keep the value they were stopped at)."""
    return Trial.objects.filter(study=study, value__isnull=False)


def history_points(study: Study, width: int) -> tuple[list[int], list[float | None], list[float | None]]:
    """(trial numbers, each completed trial's value, the best value so far), at most about ``width``
    points: with more trials than that, each bucket of consecutive numbers keeps its best trial."""
    minimize = study.goal == "MINIMIZE"
    rows: list[tuple[int, float]] = [(number, float(value)) for number, value in finished(study)
                                     .filter(state=TrialState.COMPLETED).order_by("number").values_list("number", "value")
                                     if value is not None]
    bucket = max(1, -(-len(rows) // max(1, width)))
    xs: list[int] = []
    values: list[float | None] = []
    best: list[float | None] = []
    so_far = math.inf if minimize else -math.inf
    for i in range(0, len(rows), bucket):
        chunk = rows[i:i + bucket]
        number, value = (min if minimize else max)(chunk, key=lambda r: r[1])
        so_far = min(so_far, value) if minimize else max(so_far, value)
        xs.append(number)
        values.append(value)
        best.append(so_far)
    return xs, values, best


def parallel_data(study: Study, names: Sequence[str]) -> dict[str, Any]:
    """The parallel coordinates' axes (the parameters, log-uniform ones on a log scale, then the
    objective) and up to `PARALLEL_MAX` trials (the best ones), as ``compare.js`` draws them; ``wid``
    ties a line to its table row."""
    order = F("value").asc(nulls_last=True) if study.goal == "MINIMIZE" else F("value").desc(nulls_last=True)
    rows = (Trial.objects.filter(study=study).exclude(state=TrialState.RUNNING).order_by(order, "number")
            .values("wid", "parameters", "value")[:PARALLEL_MAX])
    space = study.parameters or {}
    axes = [*({"name": n, "kind": "arg", **({"scale": "log"} if "logUniform" in (space.get(n) or {}) else {})}
              for n in names), {"name": study.metric, "kind": "metric"}]
    return {"axes": axes, "units": [
        {"wid": r["wid"], "values": [*((r["parameters"] or {}).get(n) for n in names), r["value"]]} for r in rows]}


def trial_wids(study: Study) -> Any:
    """The study's trials' work unit ids, as a subquery (parameter importance over exactly them;
    a ``values`` queryset, typed ``Any`` as `xmc.api.importance.importance` takes it)."""
    return Trial.objects.filter(study=study).values("wid")


def studies_of(xid: int) -> tuple[list[dict[str, Any]], int]:
    """The newest `EXPERIMENT_STUDIES` studies of an experiment (for its page's links) and how many it has."""
    studies = Study.objects.filter(experiment_id=xid)
    rows = list(studies.order_by("-id").annotate(done=Count("trials", filter=~Q(trials__state=TrialState.RUNNING)))
                .values("id", "state", "metric", "goal", "max_trials", "done")[:EXPERIMENT_STUDIES])
    return rows, studies.count() if len(rows) == EXPERIMENT_STUDIES else len(rows)
