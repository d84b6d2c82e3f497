"""A study over real work units: trials' units driven through the services as the reconciler and the
metrics write path would."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from metrics import services as metric_services
from studies import services
from studies.models import Study, Trial
from tests import factories
from tests.notifications.helpers import set_state
from workunits.models import WorkUnit, WorkUnitExecution

ALICE = factories.ALICE


def template() -> tuple[Any, WorkUnit]:
    exp = factories.experiment(ALICE, title="search")
    message = factories.work_unit_message()
    message.executable.jobset.jobs[0].spec.args.update({"lr": "0.5", "epochs": "3"})
    from workunits import services as wu_services

    op = wu_services.create_work_unit(exp.id, message)
    return exp, WorkUnit.objects.get(id=op.work_unit_id)


def study(exp: Any, unit: WorkUnit, **overrides: Any) -> Study:
    body: dict[str, Any] = {
        "templateWorkUnit": unit.wid, "parameters": {"lr": {"logUniform": [1e-4, 1.0]}, "layers": {"int": [1, 4]}},
        "objective": {"metric": "loss", "stat": "last", "goal": "MINIMIZE"}, "maxTrials": 6, "parallelTrials": 2,
        "sampler": "random", "pruner": None, "seed": 7,
    }
    body.update(overrides)
    return services.create_study(exp.id, body, creator=ALICE)


def trials(study: Study) -> list[Trial]:
    return list(Trial.objects.filter(study_id=study.id).select_related("work_unit").order_by("number"))


def unit_of(trial: Trial) -> WorkUnit:
    trial.refresh_from_db()
    assert trial.work_unit is not None
    return WorkUnit.objects.get(id=trial.work_unit_id)


def state_of(trial: Trial) -> str:
    unit = unit_of(trial)
    return str(WorkUnitExecution.objects.get(work_unit=unit, eid=unit.current_eid).state)


def write(trial: Trial, values: list[float], first_step: int = 1, metric: str = "loss") -> None:
    unit = unit_of(trial)
    execution = WorkUnitExecution.objects.get(work_unit=unit, eid=unit.current_eid).pk
    start = timezone.now() - timedelta(minutes=5)
    metric_services.write_points(execution, [
        metric_services.Point(metric, first_step + i, value, start + timedelta(seconds=first_step + i))
        for i, value in enumerate(values)])


def end(trial: Trial, state: str = "COMPLETED") -> None:
    unit = unit_of(trial)
    set_state([unit], "RUNNING")
    set_state([WorkUnit.objects.get(id=unit.id)], state)
