"""Celery tasks of the study controller: thin adapters around `studies.controller`.

* ``xmc.studies.step(study_id)``: one step of one study, an outbox row
  (`studies.doorbell`): claimed, heartbeated, retried on database errors, finished once;
* ``xmc.studies.tick``: the beat's periodic pass, ringing every running study.
"""
from __future__ import annotations

from typing import Any

from celery import shared_task

from studies import controller, doorbell


@shared_task(name=doorbell.STEP_TASK, bind=True, acks_late=True, ignore_result=True, queue=doorbell.QUEUE,
             soft_time_limit=120, time_limit=150)
def step(self: Any, study_id: int, delivery_id: int | None = None) -> None:
    doorbell.answer(self, delivery_id, lambda: controller.step(int(study_id)))


@shared_task(name="xmc.studies.tick", ignore_result=True, queue=doorbell.QUEUE)
def tick() -> int:
    return controller.tick()
