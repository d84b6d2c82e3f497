"""Experiment launch and active states (``ExperimentStatus`` enums, by name)."""
from __future__ import annotations

from django.db import models


class LaunchState(models.TextChoices):
    LAUNCHING = "LAUNCHING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


class ActiveState(models.TextChoices):
    ACTIVE = "ACTIVE"
    INACTIVE = "INACTIVE"
