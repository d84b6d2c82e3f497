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

from core.hooks import Hooks

#: Listeners ``(execution_pk, written)``: the execution whose new points committed, and how many.
written_hooks: Hooks[[int, int]] = Hooks("metrics.written_hook_failed")


def on_points_written(execution: int, written: int) -> None:
    written_hooks(execution, written)
