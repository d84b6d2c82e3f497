"""Celery tasks of the study controller: thin adapters around `studies.controller`.

* ``xmc.studies.step(study_id)``: one step of one study, an outbox row
  (`studies.doorbell`): claimed, heartbeated, retried on database errors, finished once;
* ``xmc.studies.tick``: the beat's periodic pass, ringing every running study.
"""
from __future__ import annotations

from typing import Any

from delivery import declare
from studies import controller, doorbell


@declare.task(name=doorbell.STEP_TASK, bind=True, queue=doorbell.QUEUE, time_limit=120)
def step(self: Any, study_id: int, delivery_id: int | None = None) -> None:
    doorbell.answer(self, delivery_id, lambda: controller.step(int(study_id)))


@declare.task(name="xmc.studies.tick", queue=doorbell.QUEUE, time_limit=60)
def tick() -> int:
    return controller.tick()
