"""Work unit and execution state choices, with the named groups the guards use.

Guards in ``workunits.state`` use these groups, never hand-written lists.
``WorkUnitState`` and its groups live in ``core.choices`` (experiments use them
too) and are re-exported here.
"""
from __future__ import annotations

from django.db import models


# The states and their groups are shared with experiments (the roll-up):
# defined on the ground floor, re-exported here for the work units app.
from core.choices import CLUSTER_OBSERVED as CLUSTER_OBSERVED  # noqa: E402
from core.choices import INSERT_ONLY as INSERT_ONLY  # noqa: E402
from core.choices import PAUSE_ENTRY as PAUSE_ENTRY  # noqa: E402
from core.choices import RETAINING as RETAINING  # noqa: E402
from core.choices import STOPPABLE as STOPPABLE  # noqa: E402
from core.choices import TERMINAL as TERMINAL  # noqa: E402
from core.choices import TIME_IGNORED as TIME_IGNORED  # noqa: E402
from core.choices import WorkUnitState as WorkUnitState  # noqa: E402


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
    #: Internal, not an API operation: the notify-when patch of a running JobSet after an
    #: artifact is attached (``workunits.services.record_notify_when_update``). Never listed
    #: or served by the Operations API (``OperationMetadata.ActionType`` has no such value).
    UPDATE = "UPDATE"


#: The action types the Operations API shows.
API_ACTION_TYPES = (ActionType.CREATE, ActionType.STOP, ActionType.RESTART)


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
    #: The system metrics' collector (metrics.system): GPUs idle, memory near its limit.
    SYSTEM_METRICS = "system_metrics"


class ResolutionStatus(models.TextChoices):
    RESUMED = "RESUMED"
    SKIPPED = "SKIPPED"
