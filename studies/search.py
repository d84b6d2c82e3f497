"""Optuna's view of a study, rebuilt from our rows for each decision (no Optuna storage of its own).

`next_parameters` answers "what should trial n try?" and `should_prune` "does this
running trial stop at its last step?". Each builds a fresh in-memory Optuna study
(``optuna.create_study`` + ``add_trials`` of ``optuna.trial.create_trial(...)``
made from `studies.models.Trial` rows) with the study's sampler or pruner, asks,
and throws it away. Nothing Optuna computes survives except what we write back
(the parameters of a new trial, and the system attributes a pruner set, e.g.
successive halving's rungs). Why rebuild rather than an Optuna storage on our
tables: see docs/architecture/studies.md.

Optuna: https://optuna.readthedocs.io/en/stable/reference/generated/optuna.trial.create_trial.html
"""
from __future__ import annotations

import copy
import json
import math
import statistics
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

#: The samplers a study may name.
SAMPLERS = ("tpe", "random", "grid", "cmaes")
#: The parameter kinds of a search space.
KINDS = ("logUniform", "uniform", "int", "choice")


@dataclass(frozen=True)
class PastTrial:
    """What a decision needs of one trial row."""

    number: int
    state: str  # studies.models.TrialState
    parameters: Mapping[str, Any]
    value: float | None = None
    intermediate: Mapping[int, float] = field(default_factory=dict)
    system_attrs: Mapping[str, Any] = field(default_factory=dict)


def distributions(space: Mapping[str, Mapping[str, Any]]) -> dict[str, BaseDistribution]:
    """Optuna distributions of a validated search space (``studies.services.validate``)."""
    out: dict[str, BaseDistribution] = {}
    for name, spec in space.items():
        ((kind, value),) = spec.items()
        if kind == "logUniform":
            out[name] = FloatDistribution(float(value[0]), float(value[1]), log=True)
        elif kind == "uniform":
            out[name] = FloatDistribution(float(value[0]), float(value[1]))
        elif kind == "int":
            out[name] = IntDistribution(int(value[0]), int(value[1]))
        else:
            out[name] = CategoricalDistribution(list(value))
    return out


def grid_of(space: Mapping[str, Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The grid sampler's values per parameter (only ``int`` and ``choice`` parameters have one)."""
    grid: dict[str, list[Any]] = {}
    for name, spec in space.items():
        ((kind, value),) = spec.items()
        grid[name] = list(range(int(value[0]), int(value[1]) + 1)) if kind == "int" else list(value)
    return grid


def grid_size(space: Mapping[str, Mapping[str, Any]]) -> int:
    return math.prod(len(v) for v in grid_of(space).values())


class _RowsTPESampler(optuna.samplers.TPESampler):
    """Optuna's TPE, with the search space of our rows worked out by name.

    Multivariate TPE asks each decision for the intersection of the completed trials' search spaces
    (``optuna.search_space.IntersectionSearchSpace``: each trial's distributions compared with the
    others' by ``==``, about a third of a decision at 1,000 trials). Every trial `_rebuild` makes
    carries, for each parameter it has, the one distribution object `distributions` made for the
    decision (``dists``), so that intersection is the parameters every completed trial has, each with
    that object: the same answer from a set intersection. Anything else (a distribution that is not
    ours, the grouped or independent TPE) is left to Optuna's own calculation.
    """

    def __init__(self, dists: Mapping[str, BaseDistribution], *, seed: int) -> None:
        super().__init__(seed=seed)
        self._dists = dict(dists)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if self._group or not self._is_multivariate(study):
            return super().infer_relative_search_space(study, trial)
        names: set[str] | None = None
        for done in study.get_trials(deepcopy=False, states=(OptunaState.COMPLETE,)):
            if any(self._dists.get(name) is not dist for name, dist in done.distributions.items()):
                return super().infer_relative_search_space(study, trial)
            names = set(done.distributions) if names is None else names & done.distributions.keys()
        return {name: copy.deepcopy(self._dists[name]) for name in sorted(names or ())
                if not self._dists[name].single()}


def make_sampler(kind: str, space: Mapping[str, Mapping[str, Any]], seed: int,
                 dists: Mapping[str, BaseDistribution] | None = None) -> optuna.samplers.BaseSampler:
    if kind == "tpe":
        return _RowsTPESampler(distributions(space) if dists is None else dists, seed=seed)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "grid":
        return optuna.samplers.GridSampler(grid_of(space), seed=seed)
    if kind == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    raise ValueError(kind)


def make_pruner(spec: Mapping[str, Any] | None) -> optuna.pruners.BasePruner:
    if not spec:
        return optuna.pruners.NopPruner()
    ((kind, options),) = spec.items()
    if kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=int(options.get("startupTrials", 5)),
                                           n_warmup_steps=int(options.get("warmupSteps", 0)))
    if kind == "successiveHalving":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=options.get("minResource", "auto"),
            reduction_factor=int(options.get("reductionFactor", 4)),
            min_early_stopping_rate=int(options.get("minEarlyStoppingRate", 0)))
    raise ValueError(kind)


_STATES = {"RUNNING": OptunaState.RUNNING, "COMPLETED": OptunaState.COMPLETE, "PRUNED": OptunaState.PRUNED,
           "FAILED": OptunaState.FAIL}


_EPOCH = datetime(2000, 1, 1)


def _frozen(trial: PastTrial, dists: Mapping[str, BaseDistribution]) -> FrozenTrial:
    """The row as Optuna's trial (what ``optuna.trial.create_trial`` builds, without re-validating rows
    that `studies.services.validate` and the controller wrote: a third of a rebuild's time at 1,000 trials)."""
    state = _STATES[trial.state]
    params = {k: v for k, v in trial.parameters.items() if k in dists}
    inter = {int(k): float(v) for k, v in trial.intermediate.items()}
    value = trial.value if state == OptunaState.COMPLETE else None
    if state == OptunaState.COMPLETE and value is None:  # a completed trial always has a value (checked on write)
        state, value = OptunaState.FAIL, None
    return FrozenTrial(number=trial.number, state=state, value=value, values=None, datetime_start=_EPOCH,
                       datetime_complete=None if state == OptunaState.RUNNING else _EPOCH, params=params,
                       distributions={k: dists[k] for k in params}, user_attrs={},
                       system_attrs=dict(trial.system_attrs), intermediate_values=inter, trial_id=-1)


class _RowsStorage(optuna.storages.InMemoryStorage):
    """Optuna's in-memory storage that takes the trials we build as they are: they are fresh objects
    nobody else holds (`_frozen` makes each for this rebuild only), so neither the deep copy
    ``create_new_trial`` makes of a template (two thirds of a rebuild's time at 1,000 trials) nor a
    shallow one is needed."""

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        if template_trial is None:
            return super().create_new_trial(study_id)
        with self._lock:
            self._check_study_id(study_id)
            trial = template_trial
            trial_id = self._max_trial_id + 1
            self._max_trial_id += 1
            trial.number = len(self._studies[study_id].trials)
            trial._trial_id = trial_id
            self._trial_id_to_study_id_and_number[trial_id] = (study_id, trial.number)
            self._studies[study_id].trials.append(trial)
            self._update_cache(trial_id, study_id)
            return trial_id


def _rebuild(trials: Sequence[PastTrial], dists: Mapping[str, BaseDistribution], goal: str, *,
             sampler: optuna.samplers.BaseSampler | None = None,
             pruner: optuna.pruners.BasePruner | None = None) -> optuna.Study:
    study = optuna.create_study(storage=_RowsStorage(), direction="minimize" if goal == "MINIMIZE" else "maximize",
                                sampler=sampler, pruner=pruner)
    for trial in trials:
        study._storage.create_new_trial(study._study_id, template_trial=_frozen(trial, dists))
    return study


@dataclass(frozen=True)
class Choice:
    """A new trial: its parameters, and what the sampler wrote on it (the grid sampler's grid point),
    which the next decisions must see again."""

    parameters: dict[str, Any]
    system_attrs: dict[str, Any]


def next_trial(space: Mapping[str, Mapping[str, Any]], goal: str, sampler: str, seed: int,
               trials: Sequence[PastTrial]) -> Choice:
    """Trial ``len(trials)``: the study's sampler asked over every trial so far.

    The sampler is seeded with ``seed + len(trials)`` (the grid sampler with ``seed``): the same rows give
    the same answer (a retried decision after a crash picks what the first try would have).
    """
    dists = distributions(space)
    # The grid sampler shuffles the grid with its seed and takes point n for trial n: one seed for the
    # whole study, so every trial gets a point of the same permutation (each point once).
    decision_seed = seed if sampler == "grid" else seed + len(trials)
    study = _rebuild(trials, dists, goal, sampler=make_sampler(sampler, space, decision_seed, dists))
    trial = study.ask(fixed_distributions=dists)
    attrs = study._storage.get_trial(trial._trial_id).system_attrs
    return Choice({name: _plain(trial.params[name]) for name in space}, _json_safe(attrs))


def next_parameters(space: Mapping[str, Mapping[str, Any]], goal: str, sampler: str, seed: int,
                    trials: Sequence[PastTrial]) -> dict[str, Any]:
    """The parameters of `next_trial`."""
    return next_trial(space, goal, sampler, seed, trials).parameters


def _json_safe(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes our JSON column can keep (Optuna's are JSON-serializable by contract; tuples become lists)."""
    return json.loads(json.dumps(dict(attrs), default=list))


def _plain(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value


@dataclass(frozen=True)
class Verdict:
    prune: bool
    step: int
    value: float
    #: What the running trial is compared with (the median of the others at that step, for the median
    #: pruner; None when Optuna's pruner keeps it to itself).
    reference: float | None
    system_attrs: dict[str, Any]


def should_prune(space: Mapping[str, Mapping[str, Any]], goal: str, pruner: Mapping[str, Any] | None,
                 trials: Sequence[PastTrial], running: PastTrial) -> Verdict | None:
    """Whether ``running`` (one of the study's running trials, with its intermediate values so far) is
    pruned at its last step, by the study's pruner over every other trial; None: no step reported yet."""
    if not running.intermediate or not pruner:
        return None
    others = [t for t in trials if t.number != running.number]
    study = _rebuild([*others, running], distributions(space), goal, pruner=make_pruner(pruner))
    frozen = next(t for t in study.get_trials(deepcopy=False) if t.number == len(others))
    prune = bool(study.pruner.prune(study, frozen))
    after = study._storage.get_trial(frozen._trial_id)
    step = max(int(k) for k in running.intermediate)
    return Verdict(prune=prune, step=step, value=best_so_far(running.intermediate, goal),
                   reference=_median_at(others, step),
                   system_attrs=_json_safe(after.system_attrs))


def _median_at(others: Sequence[PastTrial], step: int) -> float | None:
    """The median over completed trials of their value at ``step``: what Optuna's median pruner compares the
    running trial's best value so far with (``optuna.pruners.PercentilePruner``), for the message."""
    values = [float(v) for t in others if t.state == "COMPLETED"
              for k, v in t.intermediate.items() if int(k) == step and not math.isnan(float(v))]
    return statistics.median(values) if values else None


def best_so_far(intermediate: Mapping[Any, float], goal: str) -> float:
    values = [float(v) for v in intermediate.values() if not math.isnan(float(v))]
    if not values:
        return math.nan
    return min(values) if goal == "MINIMIZE" else max(values)
