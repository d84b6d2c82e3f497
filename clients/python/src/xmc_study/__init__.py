"""Start an XMC study from an XManager launch script: XMC runs the search, the script only asks for it.

The script launches one work unit as usual with ``xm_cloud``; that unit is the
study's template (its executable, resources, priority, annotations), and XMC
clones it per trial with the arguments the sampler picks, server-side: the
study survives the launch script and the laptop::

    from xmanager import xm, xm_cloud
    import xmc_study

    with xm_cloud.create_experiment(experiment_title="lr search") as experiment:
        experiment.add(xm.Job(executable=..., executor=..., args={"lr": "0.01", "epochs": "3"}),
                       settings=xm_cloud.WorkUnitSettings())   # xm_cloud's add requires its settings
    study = xmc_study.create(experiment, 1,   # the work unit just added (wids count from 1)
                             parameters={"lr": "log:1e-5:1e-1", "batch_size": "choice:32,64,128"},
                             objective="loss:last:min", max_trials=40, parallel_trials=4, pruner="median:5")
    print(study.url)

Who and where are those of the launch client (`xmc_cli.auth`, the rules of
xmanager 0.8.5.post1): ``XMC_AUTH_TOKEN`` or the login ``xmanager login``
saved, at ``XMC_API_URL`` / ``XMANAGER_UI_URL``. The space, objective and
pruner are written as on the command line (``xmc study create``,
`xmc_cli.study_spec`) or in the REST body's own form
(``{"logUniform": [1e-5, 0.1]}``); a space that cannot work raises
`xmc_cli.study_spec.SpecError` before anything is sent. The work unit may be
still on its way to the server when ``create`` is called (``experiment.add``
inside the ``with`` block returns before the launch ends): ``create`` waits
up to ``wait_s`` for it to exist, then sends the create request once.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from xmc_cli import auth
from xmc_cli.api import Api
from xmc_cli.errors import CliError, NotFound
from xmc_cli.study_spec import SpecError, study_body

__all__ = ["CliError", "SpecError", "Study", "create", "get", "stop"]

#: How long `create` waits, by default, for the template work unit to reach the server.
WAIT_S = 60.0


@dataclass(frozen=True)
class Study:
    """A study as the server answered it (``raw``: the whole JSON), with its ids and page."""

    xid: int
    sid: int
    state: str
    url: str
    raw: dict[str, Any] = field(repr=False)

    @property
    def best_trial(self) -> dict[str, Any] | None:
        best = self.raw.get("bestTrial")
        return dict(best) if isinstance(best, Mapping) and best else None

    @property
    def trials(self) -> list[dict[str, Any]]:
        return [dict(t) for t in self.raw.get("trials") or []]


def _id_of(thing: Any, *attributes: str) -> int:
    if isinstance(thing, bool):
        raise TypeError(f"expected an id or an XManager object, got {thing!r}")
    if isinstance(thing, int):
        return thing
    for attribute in attributes:
        try:
            value = getattr(thing, attribute, None)
        except NotImplementedError:  # xm_cloud's experiment leaves XManager's experiment_id to its base, which raises
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise TypeError(f"expected an id or an object with {' or '.join(attributes)}, got {type(thing).__name__}")


def _study(api: Api, xid: int, body: Mapping[str, Any]) -> Study:
    sid = int(str(body.get("name", "")).rstrip("/").rsplit("/", 1)[-1])
    url = f"{auth.ui_base(_env(), api.ident.origin)}/experiments/{xid}/studies/{sid}"
    return Study(xid, sid, str(body.get("state", "")), url, dict(body))


def _env() -> Mapping[str, str]:
    return os.environ


@contextmanager
def _api(api: Api | None) -> Iterator[Api]:
    """``api``, or one made from the launch client's environment and closed after use."""
    if api is not None:
        yield api
        return
    made = Api(auth.identity(_env()))
    try:
        yield made
    finally:
        made.close()


def create(experiment: Any, work_unit: Any, *, parameters: Mapping[str, Any], objective: str | Mapping[str, Any],
           max_trials: int = 20, parallel_trials: int = 1, sampler: str = "tpe",
           pruner: str | Mapping[str, Any] | None = None, wait_s: float = WAIT_S, api: Api | None = None) -> Study:
    """Create a study of ``experiment`` (an ``xm_cloud`` experiment or its id) that clones ``work_unit``
    (an XManager work unit, or its wid) per trial. Raises `SpecError` for a space that cannot work and
    `CliError` for what the server refused (its message names the field)."""
    xid = _id_of(experiment, "experiment_id", "id")
    wid = _id_of(work_unit, "work_unit_id", "wid", "id")
    body = study_body(wid, parameters, objective, max_trials=max_trials, parallel_trials=parallel_trials,
                      sampler_name=sampler, pruner_spec=pruner)
    with _api(api) as client:
        deadline = time.monotonic() + wait_s
        while True:  # the launch may still be sending the unit: wait for it, then create once
            try:
                client.work_unit(xid, wid)
                break
            except NotFound:
                if time.monotonic() >= deadline:
                    raise CliError(f"work unit {xid}/{wid} did not appear within {wait_s:g} s: "
                                   "is it the unit the script launched?") from None
                time.sleep(0.5)
        return _study(client, xid, client.create_study(xid, body))


def get(experiment: Any, sid: int, *, api: Api | None = None) -> Study:
    """The study ``sid`` of ``experiment`` as it is now (state, trials, best trial)."""
    xid = _id_of(experiment, "experiment_id", "id")
    with _api(api) as client:
        return _study(client, xid, client.study(xid, sid))


def stop(experiment: Any, sid: int, *, api: Api | None = None) -> Study:
    """Stop the study (its running trials are stopped by the server)."""
    xid = _id_of(experiment, "experiment_id", "id")
    with _api(api) as client:
        return _study(client, xid, client.stop_study(xid, sid))
