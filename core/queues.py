"""The Celery queues: the one list (``xmc.celery`` declares them, workers consume them).

Publishers below the project package send through ``celery.current_app`` (the
XMC app, made the default of every thread by ``xmc.celery``) with a queue named
here, so no app imports the project package for its Celery app.
"""
from __future__ import annotations

import enum


class Queue(str, enum.Enum):
    ACTUATOR = "actuator"
    LIFECYCLE = "lifecycle"
    RESUMPTION = "resumption"
    NOTIFICATIONS = "notifications"
