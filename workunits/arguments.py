"""A work unit's arguments and job name, read from its executable (proto3 JSON), for the sweep read.

`flat_args` is what `workunits.models.WorkUnit.args` stores (written once, by the create path:
executables never change) and what the pages show; `job_name` is the XManager job or group name.
Pure functions over plain data; called by ``workunits.services.create``, the migration that filled
``args`` for older work units, ``metrics``/``xmc.api.sweeps`` and ``ui.present``.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

#: An argument value that is a number (``0.01``, ``-3``, ``1e-4``, ``.5``); the filters' number literals
#: are the same (``xmc.listing.filters.NUMBER``).
NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)


def _scalar(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _jobs(executable: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    return list(((executable or {}).get("jobset") or {}).get("jobs") or [])


def flat_args(executable: Mapping[str, Any] | None) -> dict[str, str]:
    """``name -> value`` of every job's ``args`` and ``argsList`` (``argv[i]``); names are prefixed with
    the job's name (``trainer.lr``) when the work unit has several jobs."""
    jobs = _jobs(executable)
    out: dict[str, str] = {}
    for job in jobs:
        prefix = f"{job.get('name')}." if len(jobs) > 1 else ""
        spec = job.get("spec") or {}
        for key, value in sorted((spec.get("args") or {}).items()):
            out[f"{prefix}{key}"] = _scalar(value)
        for i, value in enumerate(spec.get("argsList") or []):
            out[f"{prefix}argv[{i}]"] = _scalar(value)
    return out


def numbers(args: Mapping[str, str]) -> dict[str, float]:
    """Those of ``args`` whose value is a finite number, as numbers (`workunits.models.WorkUnit.arg_numbers`)."""
    out: dict[str, float] = {}
    for name, value in args.items():
        if len(value) <= 100 and NUMBER.fullmatch(value):
            number = float(value)
            if math.isfinite(number):
                out[name] = number
    return out


def job_name(executable: Mapping[str, Any] | None) -> str:
    """The XManager job or group name: the jobs' ``groupName`` when they share one, else their names
    joined with ``+`` (one job: its name)."""
    jobs = _jobs(executable)
    groups = {str(job.get("groupName") or "") for job in jobs}
    if len(groups) == 1 and "" not in groups:
        return groups.pop()
    return "+".join(str(job.get("name") or "") for job in jobs)
