"""API enums shared by several apps, stored by their ``cloud.xmanager.v1`` names.

``WorkUnitState`` and its named groups are here too: the guards in
``workunits.state`` and the experiment roll-up (``experiments.rollup``) both use
them. Names and numbers are those of ``cloud.xmanager.v1.WorkUnitStatus.WorkUnitState``.

Enum columns hold the proto value *name* (``"NORMAL"``), never the number, so
rows read well in SQL and the admin and filters compare names. The
conversion modules (``core.convert`` and each app's ``wire.py``) map names to numbers and back.
"""
from __future__ import annotations

from django.db import models


class Priority(models.TextChoices):
    LOW = "LOW"
    NORMAL = "NORMAL"
    HIGH = "HIGH"


class Severity(models.TextChoices):
    UNSPECIFIED = "SEVERITY_UNSPECIFIED"
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    FATAL = "FATAL"


# Numeric order of severities, as in StructuredMessage.Severity.
SEVERITY_RANK = {"SEVERITY_UNSPECIFIED": 0, "DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "FATAL": 50}


class MessageSource(models.TextChoices):
    UNSPECIFIED = "SOURCE_UNSPECIFIED"
    XMANAGER_CLIENT = "XMANAGER_CLIENT"
    XMANAGER_BACKEND = "XMANAGER_BACKEND"
    ADAPTER = "ADAPTER"
    KUBERNETES = "KUBERNETES"
    SCHEDULER = "SCHEDULER"
    APPLICATION = "APPLICATION"
    USER_DEFINED = "USER_DEFINED"


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
