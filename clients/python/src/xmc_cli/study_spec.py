"""A study's search space and objective as a researcher types them, turned into the REST body.

``POST /v1/experiments/{xid}/studies`` (docs/architecture/studies.md in the XMC checkout) takes::

    {"templateWorkUnit": 1,
     "parameters": {"lr": {"logUniform": [1e-5, 0.1]}, "batch_size": {"choice": [32, 64, 128]},
                    "dropout": {"uniform": [0, 0.5]}, "layers": {"int": [2, 8]}},
     "objective": {"metric": "loss", "stat": "last", "goal": "MINIMIZE"},
     "maxTrials": 40, "parallelTrials": 4, "sampler": "tpe", "pruner": {"median": {"warmupSteps": 5}}}

and ``xmc study create`` and `xmc_study` write it as ``lr=log:1e-5:1e-1``,
``batch_size=choice:32,64,128``, ``dropout=uniform:0:0.5``, ``layers=int:2:8``,
``loss:last:min`` and ``median:5``. Both share this module, so a space is
checked the same way before anything is sent: a `SpecError` names what is
wrong (the server checks again and answers a 400 naming the field).
Standard library only.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

#: ``kind`` as typed -> the wire key.
DISTRIBUTIONS = {"log": "logUniform", "loguniform": "logUniform", "uniform": "uniform", "int": "int",
                 "choice": "choice"}
SAMPLERS = ("tpe", "random", "grid", "cmaes")
STATS = ("last", "min", "max")
GOALS = {"min": "MINIMIZE", "minimize": "MINIMIZE", "max": "MAXIMIZE", "maximize": "MAXIMIZE"}
#: What a parameter is called: an argument name (the template's args are merged with it).
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,127}")


class SpecError(ValueError):
    """A search space, objective or pruner that cannot work; the message names the part."""


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SpecError(f"{what}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise SpecError(f"{what}: {text!r} is not a finite number")
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value


def _integer(text: str, what: str) -> int:
    value = text.strip()
    if not re.fullmatch(r"-?[0-9]{1,18}", value):
        raise SpecError(f"{what}: {text!r} is not an integer")
    return int(value)


def _choice_value(text: str) -> Any:
    try:
        return _number(text, "")
    except SpecError:
        return text


def distribution(name: str, text: str) -> dict[str, list[Any]]:
    """``log:1e-5:1e-1`` -> ``{"logUniform": [1e-05, 0.1]}`` (``name`` only names the parameter in errors)."""
    kind, _, rest = text.strip().partition(":")
    key = DISTRIBUTIONS.get(kind.lower())
    if key is None:
        raise SpecError(f"parameter {name!r}: unknown kind {kind!r}, expected log:LOW:HIGH, uniform:LOW:HIGH, "
                        "int:LOW:HIGH or choice:A,B,...")
    if key == "choice":
        values = [v.strip() for v in rest.split(",")]
        if not rest.strip() or any(not v for v in values):
            raise SpecError(f"parameter {name!r}: choice needs values, e.g. choice:32,64,128")
        if len(set(values)) != len(values):
            raise SpecError(f"parameter {name!r}: choice has a value twice")
        return {key: [_choice_value(v) for v in values]}
    bounds = rest.split(":")
    if len(bounds) != 2:
        raise SpecError(f"parameter {name!r}: {kind} needs two bounds, e.g. {kind}:LOW:HIGH")
    what = f"parameter {name!r}"
    low, high = (_integer(b, what) if key == "int" else _number(b, what) for b in bounds)
    return {key: check_range(name, key, low, high)}


def check_range(name: str, key: str, low: Any, high: Any) -> list[Any]:
    """``[low, high]`` when it is a range the kind can sample from, else a `SpecError`."""
    if key not in ("logUniform", "uniform", "int"):
        raise SpecError(f"parameter {name!r}: unknown kind {key!r}")
    for bound in (low, high):
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not math.isfinite(bound):
            raise SpecError(f"parameter {name!r}: bounds must be numbers, got {bound!r}")
        if key == "int" and not float(bound).is_integer():
            raise SpecError(f"parameter {name!r}: int bounds must be integers, got {bound!r}")
    if not low < high:
        raise SpecError(f"parameter {name!r}: empty range, {low} is not below {high}")
    if key == "logUniform" and low <= 0:
        raise SpecError(f"parameter {name!r}: a log range must be above 0, got {low}")
    return [int(low), int(high)] if key == "int" else [low, high]


def parameter(text: str) -> tuple[str, dict[str, list[Any]]]:
    """``lr=log:1e-5:1e-1`` -> ``("lr", {"logUniform": [1e-05, 0.1]})``."""
    name, equals, spec = text.partition("=")
    name = name.strip()
    if not equals or not spec.strip():
        raise SpecError(f"{text!r}: expected NAME=KIND:..., e.g. lr=log:1e-5:1e-1")
    if not _NAME.fullmatch(name):
        raise SpecError(f"{text!r}: {name!r} is not an argument name")
    return name, distribution(name, spec)


def parameters(space: Mapping[str, Any]) -> dict[str, dict[str, list[Any]]]:
    """A whole space, each value either typed (``"log:1e-5:1e-1"``) or already the wire form."""
    if not space:
        raise SpecError("parameters: a study needs at least one parameter to search")
    out: dict[str, dict[str, list[Any]]] = {}
    for name, spec in space.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise SpecError(f"parameters: {name!r} is not an argument name")
        if isinstance(spec, str):
            out[name] = distribution(name, spec)
        elif isinstance(spec, Mapping) and len(spec) == 1:
            ((key, value),) = spec.items()
            if key == "choice":
                if not isinstance(value, (list, tuple)) or not value:
                    raise SpecError(f"parameter {name!r}: choice needs a non-empty list")
                out[name] = {key: list(value)}
            elif not isinstance(value, (list, tuple)) or len(value) != 2:
                raise SpecError(f"parameter {name!r}: {key} needs [low, high]")
            else:
                out[name] = {key: check_range(name, key, *value)}
        else:
            raise SpecError(f"parameter {name!r}: expected 'log:LOW:HIGH' (or uniform, int, choice) or "
                            "{'logUniform': [low, high]}")
    return out


def objective(text: str) -> dict[str, str]:
    """``loss:last:min`` (or ``loss``, ``loss:min``) -> ``{"metric": "loss", "stat": "last", "goal": "MINIMIZE"}``.

    Without a goal: lower is better for a loss- or error-like name, higher otherwise.
    """
    raw = text.strip()
    metric, stat, goal = raw, "last", ""
    head, _, tail = raw.rpartition(":")
    if head and tail.lower() in GOALS:
        metric, goal = head, GOALS[tail.lower()]
    head, _, tail = metric.rpartition(":")
    if head and tail.lower() in STATS:
        metric, stat = head, tail.lower()
    elif head:
        raise SpecError(f"objective {text!r}: expected METRIC[:last|min|max][:min|max], e.g. loss:last:min")
    if not metric or len(metric) > 256 or not metric.isprintable():
        raise SpecError(f"objective {text!r}: the metric name must be 1 to 256 printable characters")
    if not goal:
        lower = metric.lower()
        goal = "MINIMIZE" if any(w in lower for w in ("loss", "error", "err", "perplexity")) else "MAXIMIZE"
    return {"metric": metric, "stat": stat, "goal": goal}


def pruner(text: str) -> dict[str, Any] | None:
    """``median:5`` -> ``{"median": {"warmupSteps": 5}}``; ``sha:MIN_RESOURCE[:REDUCTION]`` -> successive
    halving; ``none`` -> None."""
    kind, _, rest = text.strip().partition(":")
    kind = kind.lower().replace("_", "-")
    args = [a for a in rest.split(":")] if rest else []
    if kind in ("none", "off", ""):
        if args:
            raise SpecError(f"pruner {text!r}: none takes nothing")
        return None
    if kind == "median":
        if len(args) > 1:
            raise SpecError(f"pruner {text!r}: expected median[:WARMUP_STEPS], e.g. median:5")
        warmup = _integer(args[0], f"pruner {text!r}") if args else 0
        if warmup < 0:
            raise SpecError(f"pruner {text!r}: warm-up steps must be 0 or more")
        return {"median": {"warmupSteps": warmup}}
    if kind in ("sha", "successive-halving", "successivehalving"):
        if len(args) > 2:
            raise SpecError(f"pruner {text!r}: expected sha[:MIN_RESOURCE[:REDUCTION_FACTOR]], e.g. sha:1:3")
        numbers = [_integer(a, f"pruner {text!r}") for a in args]
        if any(n < 1 for n in numbers) or (len(numbers) == 2 and numbers[1] < 2):
            raise SpecError(f"pruner {text!r}: the minimum resource is at least 1 and the reduction factor at least 2")
        body = dict(zip(("minResource", "reductionFactor"), numbers))
        return {"successiveHalving": body}
    raise SpecError(f"pruner {text!r}: unknown pruner {kind!r}, expected median[:WARMUP], sha[:MIN[:FACTOR]] or none")


def sampler(text: str) -> str:
    value = text.strip().lower()
    if value not in SAMPLERS:
        raise SpecError(f"sampler {text!r}: expected one of {', '.join(SAMPLERS)}")
    return value


def study_body(template_wid: int, space: Mapping[str, Any], goal: str | Mapping[str, Any], *, max_trials: int,
               parallel_trials: int, sampler_name: str = "tpe",
               pruner_spec: str | Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The create body; every part checked here first."""
    if isinstance(template_wid, bool) or not isinstance(template_wid, int) or template_wid < 1:
        raise SpecError(f"templateWorkUnit: a work unit id (1 or more), got {template_wid!r}")
    for field, value in (("maxTrials", max_trials), ("parallelTrials", parallel_trials)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"{field}: must be at least 1, got {value!r}")
    if parallel_trials > max_trials:
        raise SpecError(f"parallelTrials: {parallel_trials} is more than maxTrials ({max_trials})")
    return {
        "templateWorkUnit": template_wid,
        "parameters": parameters(space),
        "objective": objective(goal) if isinstance(goal, str) else dict(goal),
        "maxTrials": max_trials,
        "parallelTrials": parallel_trials,
        "sampler": sampler(sampler_name),
        "pruner": pruner(pruner_spec) if isinstance(pruner_spec, str) else (
            dict(pruner_spec) if pruner_spec is not None else None),
    }
