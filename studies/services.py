"""Studies: create, read, list, stop (plain functions behind REST, the pages and the CLI).

A study request is validated whole before anything is written: a search space,
objective or template that cannot work is INVALID_ARGUMENT naming the field
(``parameters.lr.logUniform``, ``objective.goal``, ``templateWorkUnit``), and nothing
is created. Creating and stopping ring the controller (`studies.doorbell`), which
does the rest (`studies.controller`). See docs/architecture/studies.md.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Count, QuerySet
from django.utils import timezone

from core.errors import InvalidArgument, NotFound
from experiments.models import Experiment
from metrics.models import METRIC_NAME
from studies import doorbell, hooks, search
from studies.models import Goal, Study, StudyState, Trial, TrialState
from workunits.models import WorkUnit

#: Most trials one study may run, and most at once.
MAX_TRIALS = 10_000
MAX_PARALLEL = 100
MAX_PARAMETERS = 50
MAX_CHOICES = 1000
#: An argument name a trial may set (``--name=value`` in the container's args).
PARAMETER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,99}", re.ASCII)
STATS = ("last", "min", "max")
FIELDS = ("templateWorkUnit", "parameters", "objective", "maxTrials", "parallelTrials", "sampler", "pruner",
          "seed")
PRUNER_OPTIONS = {"median": ("warmupSteps", "startupTrials"),
                  "successiveHalving": ("minResource", "reductionFactor", "minEarlyStoppingRate")}


@dataclass(frozen=True)
class StudySpec:
    """A validated study request."""

    template_wid: int
    parameters: dict[str, dict[str, Any]]
    metric: str
    stat: str
    goal: str
    max_trials: int
    parallel_trials: int
    sampler: str
    pruner: dict[str, dict[str, int]] | None
    seed: int


def _bad(field: str, message: str) -> InvalidArgument:
    return InvalidArgument(f"{field}: {message}", field=field)


def _integer(value: Any, field: str, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not value.is_integer()):
        raise _bad(field, f"must be an integer, got {value!r}")
    if not low <= int(value) <= high:
        raise _bad(field, f"must be between {low} and {high}, got {int(value)}")
    return int(value)


def _number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise _bad(field, f"must be a finite number, got {value!r}")
    return float(value)


def _range(value: Any, field: str, kind: str) -> list[Any]:
    if not isinstance(value, list) or len(value) != 2:
        raise _bad(field, "must be [low, high]")
    low: float
    high: float
    if kind == "int":
        low, high = (_integer(v, f"{field}[{i}]", low=-(2**53), high=2**53) for i, v in enumerate(value))
    else:
        low, high = (_number(v, f"{field}[{i}]") for i, v in enumerate(value))
    if not low < high:
        raise _bad(field, f"the range is empty: low {low} must be below high {high}")
    if kind == "logUniform" and low <= 0:
        raise _bad(field, f"a log-uniform range must be above 0, got low {low}")
    return [low, high]


def _choices(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise _bad(field, "must be a non-empty list of values")
    if len(value) > MAX_CHOICES:
        raise _bad(field, f"at most {MAX_CHOICES} values")
    for i, v in enumerate(value):
        if not isinstance(v, (str, int, float)) or isinstance(v, bool) or (
                isinstance(v, float) and not math.isfinite(v)):
            raise _bad(f"{field}[{i}]", f"must be a string or a finite number, got {v!r}")
        if isinstance(v, str) and len(v) > 1000:
            raise _bad(f"{field}[{i}]", "at most 1000 characters")
    if len({(type(v).__name__, v) for v in value}) != len(value):
        raise _bad(field, "the values must be distinct")
    return list(value)


def _parameters(value: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(value, dict) or not value:
        raise _bad("parameters", "must be an object naming at least one parameter")
    if len(value) > MAX_PARAMETERS:
        raise _bad("parameters", f"at most {MAX_PARAMETERS} parameters")
    out: dict[str, dict[str, Any]] = {}
    for name, spec in value.items():
        field = f"parameters.{name}"
        if not PARAMETER_NAME.fullmatch(name):
            raise _bad(field, "a parameter name is letters, digits, '_', '.', '-' (starting with a letter or '_')")
        if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in search.KINDS:
            raise _bad(field, f"must be one of {{{', '.join(repr(k) + ': ...' for k in search.KINDS)}}}")
        ((kind, raw),) = spec.items()
        out[name] = {kind: _choices(raw, f"{field}.{kind}") if kind == "choice"
                     else _range(raw, f"{field}.{kind}", kind)}
    return out


def _objective(value: Any) -> tuple[str, str, str]:
    if not isinstance(value, dict):
        raise _bad("objective", 'must be {"metric": ..., "stat": "last|min|max", "goal": "MINIMIZE|MAXIMIZE"}')
    unknown = sorted(set(value) - {"metric", "stat", "goal"})
    if unknown:
        raise _bad(f"objective.{unknown[0]}", "unknown field")
    metric = value.get("metric")
    if not isinstance(metric, str) or not metric.strip() or len(metric) > METRIC_NAME:
        raise _bad("objective.metric", f"must be a metric name (1 to {METRIC_NAME} characters)")
    stat = value.get("stat", "last")
    if stat not in STATS:
        raise _bad("objective.stat", f"must be one of {', '.join(STATS)}, got {stat!r}")
    goal = value.get("goal")
    if goal not in Goal.values:
        raise _bad("objective.goal", f"must be MINIMIZE or MAXIMIZE, got {goal!r}")
    return metric, stat, goal


def _pruner(value: Any) -> dict[str, dict[str, int]] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in PRUNER_OPTIONS:
        raise _bad("pruner", 'must be null, {"median": {...}} or {"successiveHalving": {...}}')
    ((kind, options),) = value.items()
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise _bad(f"pruner.{kind}", "must be an object")
    out: dict[str, int] = {}
    for key, option in options.items():
        if key not in PRUNER_OPTIONS[kind]:
            raise _bad(f"pruner.{kind}.{key}", f"unknown option (known: {', '.join(PRUNER_OPTIONS[kind])})")
        low = {"reductionFactor": 2, "minResource": 1}.get(key, 0)
        out[key] = _integer(option, f"pruner.{kind}.{key}", low=low, high=1_000_000)
    return {kind: out}


def validate(body: Mapping[str, Any]) -> StudySpec:
    """The request's fields, checked; INVALID_ARGUMENT naming the first field that cannot work."""
    if not isinstance(body, Mapping):
        raise InvalidArgument("the body must be a JSON object", field="body")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise _bad(unknown[0], f"unknown field (known: {', '.join(FIELDS)})")
    if "templateWorkUnit" not in body:
        raise _bad("templateWorkUnit", "required: the wid of the work unit each trial clones")
    template = _integer(body["templateWorkUnit"], "templateWorkUnit", low=1, high=2**62)
    parameters = _parameters(body.get("parameters"))
    metric, stat, goal = _objective(body.get("objective"))
    max_trials = _integer(body.get("maxTrials"), "maxTrials", low=1, high=MAX_TRIALS)
    parallel = _integer(body.get("parallelTrials", 1), "parallelTrials", low=1, high=min(MAX_PARALLEL, max_trials))
    sampler = body.get("sampler", "tpe")
    if sampler not in search.SAMPLERS:
        raise _bad("sampler", f"must be one of {', '.join(search.SAMPLERS)}, got {sampler!r}")
    if sampler == "grid":
        continuous = sorted(n for n, s in parameters.items() if next(iter(s)) in ("uniform", "logUniform"))
        if continuous:
            raise _bad(f"parameters.{continuous[0]}", "the grid sampler needs int or choice parameters")
        if search.grid_size(parameters) > 1_000_000:
            raise _bad("parameters", "the grid has more than 1,000,000 points")
    pruner = _pruner(body.get("pruner"))
    seed = _integer(body.get("seed", 0), "seed", low=0, high=2**31 - 1)
    return StudySpec(template, parameters, metric, stat, goal, max_trials, parallel, sampler, pruner, seed)


def template_of(unit: WorkUnit) -> dict[str, Any]:
    """What each trial copies of the template unit (create-request fields, proto3 JSON)."""
    return {"executable": unit.executable, "priority": unit.priority, "workUnitType": unit.work_unit_type,
            "tags": list(unit.tags or []), "notes": unit.notes}


def create_study(xid: int, body: Mapping[str, Any], *, creator: str = "") -> Study:
    """A RUNNING study of experiment ``xid`` (validated whole first); the controller starts its trials."""
    spec = validate(body)
    if not Experiment.objects.filter(id=xid).exists():
        raise NotFound(f"experiments/{xid} not found", field="parent")
    unit = WorkUnit.objects.filter(experiment_id=xid, wid=spec.template_wid).first()
    if unit is None:
        raise _bad("templateWorkUnit", f"experiments/{xid}/workUnits/{spec.template_wid} does not exist")
    now = timezone.now()
    with transaction.atomic():
        study = Study.objects.create(
            experiment_id=xid, template_wid=spec.template_wid, template=template_of(unit),
            parameters=spec.parameters, metric=spec.metric, stat=spec.stat, goal=spec.goal,
            max_trials=spec.max_trials, parallel_trials=spec.parallel_trials, sampler=spec.sampler,
            pruner=spec.pruner, seed=spec.seed, creator=creator, create_time=now, update_time=now)
        doorbell.ring(study.id)
    return study


def get_study(xid: int, study_id: int) -> Study:
    study = Study.objects.filter(experiment_id=xid, id=study_id).first()
    if study is None:
        raise NotFound(f"experiments/{xid}/studies/{study_id} not found", field="name")
    return study


def list_studies(xid: int) -> QuerySet[Study]:
    """Experiment ``xid``'s studies, newest first (paginate it: ``(experiment, -id)`` is indexed)."""
    return Study.objects.filter(experiment_id=xid).order_by("-id")


def stop_study(xid: int, study_id: int) -> Study:
    """``:stop``: the controller stops the running trials' units and ends the study STOPPED.
    Idempotent; a study that has ended is answered as it is."""
    with transaction.atomic():
        study = Study.objects.select_for_update().filter(experiment_id=xid, id=study_id).first()
        if study is None:
            raise NotFound(f"experiments/{xid}/studies/{study_id} not found", field="name")
        if study.state == StudyState.RUNNING and not study.stop_requested:
            study.stop_requested = True
            study.update_time = timezone.now()
            study.save(update_fields=["stop_requested", "update_time"])
            doorbell.ring(study.id)
            hooks.on_changed(xid, study.id)
    return study


def trials_of(study_id: int) -> QuerySet[Trial]:
    """The study's trials by number (paginate it: ``(study, number)`` is unique, so indexed)."""
    return Trial.objects.filter(study_id=study_id).order_by("number")


def trials_page(study_id: int, *, after: int = -1, limit: int = 100) -> list[Trial]:
    """One page of the study's trials: numbers above ``after``, at most ``limit`` (keyset, in SQL)."""
    return list(trials_of(study_id).filter(number__gt=after)[:max(1, min(limit, 1000))])


def best_trial(study: Study) -> Trial | None:
    """The completed trial with the best value (lowest for MINIMIZE), ties to the earliest."""
    order = "value" if study.goal == Goal.MINIMIZE else "-value"
    return (Trial.objects.filter(study_id=study.id, state=TrialState.COMPLETED, value__isnull=False)
            .order_by(order, "number").first())


def counts(study_id: int) -> dict[str, int]:
    """How many trials are in each state."""
    out = {s: 0 for s in TrialState.values}
    for state, n in _count_rows(study_id):
        out[state] = n
    return out


def _count_rows(study_id: int) -> Sequence[tuple[str, int]]:
    return list(Trial.objects.filter(study_id=study_id).values("state").annotate(n=Count("id"))
                .values_list("state", "n"))


# --- JSON (lowerCamelCase, as REST answers) ------------------------------------------------------


def trial_json(trial: Trial) -> dict[str, Any]:
    return {"number": trial.number, "workUnit": trial.wid, "state": trial.state, "parameters": trial.parameters,
            "value": trial.value, "prunedAtStep": trial.pruned_at_step, "message": trial.message,
            "intermediateSteps": len(trial.intermediate or {}),
            "createTime": trial.create_time.isoformat(),
            "endTime": trial.end_time.isoformat() if trial.end_time else None}


def study_json(study: Study, *, trials: Sequence[Trial] | None = None, best: Trial | None = None,
               trial_counts: Mapping[str, int] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": study.name, "id": study.id, "experiment": study.experiment_id, "state": study.state,
        "templateWorkUnit": study.template_wid, "parameters": study.parameters,
        "objective": {"metric": study.metric, "stat": study.stat, "goal": study.goal},
        "maxTrials": study.max_trials, "parallelTrials": study.parallel_trials, "sampler": study.sampler,
        "pruner": study.pruner, "seed": study.seed, "stopRequested": study.stop_requested,
        "creator": study.creator, "createTime": study.create_time.isoformat(),
        "updateTime": study.update_time.isoformat(),
        "endTime": study.end_time.isoformat() if study.end_time else None,
    }
    if trial_counts is not None:
        out["trialCounts"] = dict(trial_counts)
    if trials is not None:
        out["trials"] = [trial_json(t) for t in trials]
    out["bestTrial"] = trial_json(best) if best is not None else None
    return out
