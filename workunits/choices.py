"""Work unit and execution state choices, with the named groups the guards use.

Guards in ``workunits.state`` use these groups, never hand-written lists.
Names and numbers are those of ``cloud.xmanager.v1.WorkUnitStatus.WorkUnitState``.
"""
from __future__ import annotations

from django.db import models


class WorkUnitState(models.TextChoices):
    INITIALIZING = "INITIALIZING"
    SCHEDULING = "SCHEDULING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    PARTIALLY_FAILED = "PARTIALLY_FAILED"
    STOPPING = "STOPPING"
    RESTARTING = "RESTARTING"
    STOPPED = "STOPPED"
    DESCHEDULING = "DESCHEDULING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    SCHEDULING_PAUSED = "SCHEDULING_PAUSED"


S = WorkUnitState

#: An execution never leaves these (the work unit may still be restarted).
TERMINAL: frozenset[str] = frozenset({S.STOPPED, S.COMPLETED, S.FAILED})
#: A move into these keeps the messages that preceded it.
RETAINING: frozenset[str] = frozenset({S.STOPPED, S.FAILED})
#: Written only by inserting a new execution, never by an update.
INSERT_ONLY: frozenset[str] = frozenset({S.INITIALIZING, S.RESTARTING})
#: May be entered only from these.
PAUSE_ENTRY: frozenset[str] = frozenset({S.INITIALIZING, S.RESTARTING})
#: A state change to these ignores the clock (a user's stop wins).
TIME_IGNORED: frozenset[str] = frozenset({S.STOPPING})
#: Observed on the cluster; any move among them is allowed.
CLUSTER_OBSERVED: frozenset[str] = frozenset(
    {S.SCHEDULING, S.STARTING, S.RUNNING, S.PARTIALLY_FAILED, S.DESCHEDULING}
)
#: Work units in these can be stopped (they are neither terminal nor stopping).
STOPPABLE: frozenset[str] = frozenset(set(S.values) - TERMINAL - {S.STOPPING})


class ExecutionState(models.TextChoices):
    ACTIVE = "ACTIVE"
    INACTIVE = "INACTIVE"


class WorkUnitType(models.TextChoices):
    STANDARD = "STANDARD"
    AUXILIARY = "AUXILIARY"


class ActionType(models.TextChoices):
    CREATE = "CREATE"
    STOP = "STOP"
    RESTART = "RESTART"


class TaskType(models.TextChoices):
    """Actuator task types (``xmc.internal.v1.Task.Type``)."""

    CREATE = "CREATE"
    DELETE = "DELETE"
    RESTART = "RESTART"
    UPDATE = "UPDATE"


class Writer(models.TextChoices):
    """Who wrote a status change: recorded on every history row."""

    STATE_SERVER = "state_server"
    ACTUATOR = "actuator"
    PAUSE_HANDLER = "pause_handler"
    RECONCILER = "reconciler"
    FINALIZER = "finalizer"
    SWEEP = "sweep"
    LIFECYCLE = "lifecycle"
    ADMIN = "admin"


class ResolutionStatus(models.TextChoices):
    RESUMED = "RESUMED"
    SKIPPED = "SKIPPED"
