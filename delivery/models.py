"""The lease columns of every row that crosses the broker (an abstract model: no table of its own).

``dispatched_time``: when the broker last took the row's message (null: never);
``dispatch_attempts``: how many publishes were tried; ``claimed_until`` /
``claimed_by``: the live claim of the worker running it (its Celery task id,
kept across the task's own retries); ``done``: finished, never sent again.
"""
from __future__ import annotations

from django.db import models


class Leased(models.Model):
    #: When the broker last took the row's message (the first send, or a re-send of the sweep).
    dispatched_time = models.DateTimeField(null=True, blank=True)
    dispatch_attempts = models.IntegerField(default=0)
    # Lease (delivery.leases): the worker running the task holds it until
    # ``claimed_until`` and extends it while it works; ``claimed_by`` is its
    # Celery task id (kept across the task's own retries).
    claimed_until = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(max_length=64, blank=True, default="")
    done = models.BooleanField(default=False)

    class Meta:
        abstract = True
