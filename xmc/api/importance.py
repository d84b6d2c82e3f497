"""Parameter importance of a sweep: which arguments explain a metric across its completed work units.

``GET /v1/experiments/{xid}:importance?metric=loss&stat=last&goal=MINIMIZE`` (`ImportanceView`)
answers ``{"importances": {"lr": 0.83, "batch_size": 0.17}, ...}``: non-negative, summing to 1, over
the arguments that vary between the experiment's COMPLETED work units (their current execution's
summary of the metric, `metrics.summaries`; never a point). `importance` builds one Optuna trial per
work unit (its varying arguments as parameters: numbers as a FloatDistribution, anything else as a
CategoricalDistribution; the metric's stat as the value) and evaluates them with Optuna's fANOVA
evaluator (``optuna.importance.FanovaImportanceEvaluator``, a random forest's functional ANOVA,
seeded so one sweep always answers the same). docs/architecture/sweeps.md says why this library.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING, Any

from django.db.models import F
from django.urls import URLPattern, path
from rest_framework.request import Request
from rest_framework.response import Response

from core import names
from core.errors import FailedPrecondition, InvalidArgument
from core.identity import Identity
from experiments.acl import Role
from metrics import summaries
from workunits.choices import WorkUnitState
from xmc.api import handlers, reads
from xmc.api.sweeps import SweepView

#: Fewer completed work units than this, and there is no importance to speak of.
MIN_UNITS = 4
#: Work units read at most (the most recently created completed ones): fANOVA's cost grows with them.
MAX_UNITS = 5_000
GOALS = ("MINIMIZE", "MAXIMIZE")
#: The evaluator's seed and size: one sweep always gets the same answer. Trees of depth 6 (64 leaves)
#: keep the cost bounded when arguments take a new value in every unit (a random search, a seed): at
#: Optuna's default depth of 64, 1,000 such units took 40 s; at 6, about a second, same ranking.
SEED = 0
TREES = 64
MAX_DEPTH = 6

if TYPE_CHECKING:
    import optuna


@cache
def _optuna() -> ModuleType:
    """Optuna, imported on first use: it takes a second or two to import, which every web and gRPC
    process would otherwise pay at start for an endpoint few of them serve."""
    import optuna

    optuna.logging.set_verbosity(logging.WARNING)
    return optuna


@dataclass(frozen=True)
class Importance:
    metric: str
    stat: str
    goal: str
    units: int
    importances: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {"importances": self.importances, "metric": self.metric, "stat": self.stat, "goal": self.goal,
                "workUnits": self.units, "evaluator": "optuna.importance.FanovaImportanceEvaluator"}


def _trials(rows: list[tuple[dict[str, str], dict[str, float], float]]) -> list[optuna.trial.FrozenTrial]:
    """One complete trial per work unit over the arguments every unit has and that take several values."""
    op = _optuna()
    names = sorted(set.intersection(*(set(args) for args, _, _ in rows)))
    distributions: dict[str, optuna.distributions.BaseDistribution] = {}
    for name in names:
        values = {args[name] for args, _, _ in rows}
        if len(values) < 2:
            continue
        if all(name in numbers for _, numbers, _ in rows):
            found = [numbers[name] for _, numbers, _ in rows]
            distributions[name] = op.distributions.FloatDistribution(min(found), max(found))
        else:
            distributions[name] = op.distributions.CategoricalDistribution(sorted(values))
    if not distributions:
        raise FailedPrecondition("no argument takes different values across the completed work units: "
                                 "nothing to rank", field="metric")
    trials = []
    for args, numbers, value in rows:
        params = {name: numbers[name] if isinstance(dist, op.distributions.FloatDistribution) else args[name]
                  for name, dist in distributions.items()}
        trials.append(op.trial.create_trial(params=params, distributions=distributions, value=value))
    return trials


def importance(identity: Identity, xid: int, *, metric: str, stat: str = "last", goal: str = "MINIMIZE",
               wids: Any = None) -> Importance:
    """The importance of each varying argument for ``metric``'s ``stat`` over the completed work units.

    Access first (PERMISSION_DENIED); an unknown metric, stat or goal is INVALID_ARGUMENT naming it;
    fewer than `MIN_UNITS` completed units with the metric, or no varying argument, is
    FAILED_PRECONDITION saying so. The goal is recorded with the study (fANOVA measures how much of
    the metric's variance each argument explains, which is the same whichever way is better).
    ``wids`` (ids, or a subquery of them: a study's trials) narrows the units to those.
    """
    reads.experiment(xid, identity, Role.READER)
    if not metric:
        raise InvalidArgument("metric is required, e.g. metric=loss", field="metric")
    if stat not in summaries.STATS:
        raise InvalidArgument(f"stat must be one of {', '.join(summaries.STATS)}, got {stat!r}", field="stat")
    if goal not in GOALS:
        raise InvalidArgument(f"goal must be MINIMIZE or MAXIMIZE, got {goal!r}", field="goal")
    if not summaries.has_metric(xid, metric):
        raise InvalidArgument(f"experiments/{xid} has no metric {metric!r}", field="metric")
    units_of: Any = handlers.work_units_of(xid)  # annotated (api_name): beyond what the stubs can see
    if wids is not None:
        units_of = units_of.filter(wid__in=wids)
    rows = list(units_of.filter(current_state=WorkUnitState.COMPLETED)
                .annotate(summary=summaries.current_summary(metric)).annotate(value=F(f"summary__{stat}"))
                .filter(value__isnull=False).order_by("-create_time", "-id")
                .values_list("args", "arg_numbers", "value")[:MAX_UNITS])
    if len(rows) < MIN_UNITS:
        raise FailedPrecondition(
            f"parameter importance needs at least {MIN_UNITS} completed work units with metric {metric!r}; "
            f"experiments/{xid} has {len(rows)}", field="metric")
    if len({value for _, _, value in rows}) < 2:
        raise FailedPrecondition(f"{metric} ({stat}) is the same for every completed work unit: nothing to explain",
                                 field="metric")
    trials = _trials(rows)
    op = _optuna()
    study = op.create_study(direction=goal.lower())
    study.add_trials(trials)
    evaluator = op.importance.FanovaImportanceEvaluator(n_trees=TREES, max_depth=MAX_DEPTH, seed=SEED)
    found = op.importance.get_param_importances(study, evaluator=evaluator, normalize=True)
    return Importance(metric=metric, stat=stat, goal=goal, units=len(rows),
                      importances={name: max(0.0, float(value)) for name, value in found.items()})


class ImportanceView(SweepView):
    """``GET /v1/experiments/{xid}:importance``: `importance` as JSON."""

    def get(self, request: Request, xid: int) -> Response:
        params = request.query_params
        return Response(importance(request.user.identity, int(xid), metric=str(params.get("metric", "")).strip(),
                                   stat=str(params.get("stat", "last")), goal=str(params.get("goal", "MINIMIZE")))
                        .to_json())


names.register_converters()  # <id:...>: ids spelled once (core.names.IdConverter)
urlpatterns: list[URLPattern] = [
    path("v1/experiments/<id:xid>:importance", ImportanceView.as_view(), name="rest-importance"),
]


def openapi_paths() -> dict[str, Any]:
    """This endpoint in the OpenAPI document (merged by `xmc.api.openapi.build_document`)."""
    error = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}

    def query(name: str, description: str) -> dict[str, Any]:
        return {"name": name, "in": "query", "required": name == "metric", "schema": {"type": "string"},
                "description": description}

    return {"/v1/experiments/{xid}:importance": {"get": {
        "operationId": "GetParameterImportance",
        "x-path-template": "/v1/experiments/{xid}:importance",
        "x-not-an-rpc": True,
        "tags": ["experiments"],
        "summary": "How much each varying argument explains a metric over the completed work units (fANOVA)",
        "parameters": [
            {"name": "xid", "in": "path", "required": True, "schema": {"type": "string"}, "description": "experiment id"},
            query("metric", "the metric, e.g. loss"), query("stat", "last (default), min or max"),
            query("goal", "MINIMIZE (default) or MAXIMIZE"),
        ],
        "responses": {"200": {"description": "importances summing to 1", "content": {"application/json": {"schema": {
            "type": "object", "properties": {"importances": {"type": "object"}, "workUnits": {"type": "integer"}}}}}},
            "400": error, "401": error, "403": error, "404": error, "429": error},
    }}}
