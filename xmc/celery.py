"""The Celery application: broker, queues and the delivery guarantees.

``celery -A xmc worker -Q actuator,lifecycle,resumption,notifications`` runs the workers and
``celery -A xmc beat`` the periodic sweeps. Tasks live in ``<app>/tasks.py``
(found by ``autodiscover_tasks``), have explicit names (``xmc.actuator.create``)
and route by ``core.queues.Queue``, the one list of queues.

Delivery is at least once: a task is acknowledged only after it ran
(``acks_late``), a worker that dies mid-task gives its message back
(``task_reject_on_worker_lost``), and each worker process reserves one message
at a time (prefetch 1) so a crash strands nothing behind a busy task. Every
task must therefore be idempotent; the actuator's are by design (they re-read
the world first). Message bodies are JSON; protobuf payloads travel inside it
as base64 text, never pickle.
"""
from __future__ import annotations

import os

from celery import Celery, signals
from celery.signals import worker_init
from kombu import Queue as KombuQueue

from core.queues import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "xmc.settings")


app = Celery("xmc")
# The default app of every thread: publishers below the project package send
# through ``celery.current_app`` (see core.queues), from any thread.
app.set_default()
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_queues=[KombuQueue(q.value) for q in Queue],
    task_default_queue=Queue.ACTUATOR.value,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    # Defaults; the actuator's tasks declare their own (XMC_ACTUATOR_SOFT_TIME_LIMIT_S).
    task_soft_time_limit=60,
    task_time_limit=90,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
app.autodiscover_tasks()


@worker_init.connect
def _refuse_an_insecure_secret(**kwargs: object) -> None:
    """A worker verifies and signs tasks with the secret: never start it with the public default."""
    from xmc.checks import require_deploy_checks

    require_deploy_checks()


@signals.setup_logging.connect(weak=False)
def _django_logging(**_: object) -> None:
    """Workers and beat log through settings.LOGGING (plain or JSON), not Celery's own setup."""
    from logging.config import dictConfig

    from django.conf import settings

    dictConfig(settings.LOGGING)


@signals.worker_init.connect(weak=False)
def _worker_metrics(**_: object) -> None:
    """Serve the worker's metrics (all pool processes, through
    PROMETHEUS_MULTIPROC_DIR) on XMC_WORKER_METRICS_PORT when it is set."""
    from django.conf import settings

    if settings.XMC_WORKER_METRICS_PORT:
        from xmc.ops import serve_metrics

        serve_metrics(settings.XMC_WORKER_METRICS_PORT)


@signals.worker_process_init.connect(weak=False)
def freeze_startup_heap(**_: object) -> None:
    """A pool process starts with everything imported (Django, the apps, Optuna, NumPy, ...): move those
    objects out of the cyclic collector's reach (``gc.freeze``), so a full collection scans only what
    tasks allocated since. Without it each full collection walks the whole startup heap (100-150 ms in
    a worker), and a task that allocates much -- a study's decision rebuilds 1,000 trials -- sets one
    off every 10 to 20 runs (bench/studies.py, docs/architecture/studies.md)."""
    import gc

    gc.collect()
    gc.freeze()
