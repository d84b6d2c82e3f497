"""Celery task of the metrics app: points older than ``XMC_METRICS_RETENTION_DAYS`` are deleted.

Runs hourly from the beat schedule (``CELERY_BEAT_SCHEDULE`` in
``xmc/settings.py``) on the actuator queue, beside the other clean-ups; a thin
adapter over `metrics.services.purge_points`, idempotent (a second run finds
nothing old enough).
"""
from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from core.queues import Queue
from metrics import services


@shared_task(name="xmc.metrics.purge_points", queue=Queue.ACTUATOR.value, ignore_result=True,
             soft_time_limit=600, time_limit=660)
def purge_points() -> int:
    """Delete points whose time is more than ``XMC_METRICS_RETENTION_DAYS`` ago (0 keeps them for ever)."""
    if settings.XMC_METRICS_RETENTION_DAYS <= 0:
        return 0
    return services.purge_points(older_than=timezone.now() - timedelta(days=settings.XMC_METRICS_RETENTION_DAYS))
