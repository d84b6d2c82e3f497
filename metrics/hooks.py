"""Extension point of the metrics app: who hears of new points, without ``metrics`` knowing them.

Apps above register into :data:`written_hooks` in their ``AppConfig.ready()``
(the researcher's pages: ``ui.apps.UiConfig.ready`` registers
``ui.live.publish_metrics``, which tells open charts to read their data
again), so ``metrics`` never imports them.

`metrics.services.write_points` calls :func:`on_points_written` after its
transaction committed, and only when the batch added points (a replay adds
none). The hooks run in the writer's thread, so they must be cheap; a failing
hook is logged and never fails the write.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

#: Callables ``(execution_pk, written)``: the execution whose new points committed, and how many.
written_hooks: list[Callable[[int, int], None]] = []


def on_points_written(execution: int, written: int) -> None:
    for hook in list(written_hooks):
        try:
            hook(execution, written)
        except Exception:  # a listener must never fail the writer
            log.exception("metrics.written_hook_failed", extra={"execution": execution})
