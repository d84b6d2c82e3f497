"""Extension point of the metrics app: who hears of new points, without ``metrics`` knowing them.

Apps above register into :data:`written_hooks` in their ``AppConfig.ready()``
(the researcher's pages: ``ui.apps.UiConfig.ready`` registers
``ui.live.publish_metrics``, which tells open charts to read their data
again), so ``metrics`` never imports them.

`metrics.services.write_points` and `write_points_many` call
:func:`on_points_written` once after their transaction committed, with every
execution the write added points to (a replay adds none, and calls nobody).
The hooks run in the writer's thread, so they must be cheap, and cheap per
write rather than per execution: the system metrics' collector writes for a
thousand executions at once, so a listener answers the whole batch in one
query or one round trip, never one per execution. A failing hook is logged and
never fails the write.
"""
from __future__ import annotations

from collections.abc import Mapping

from core.hooks import Hooks

#: Listeners ``(written)``: the executions whose new points one write committed (pk -> how many, none 0).
written_hooks: Hooks[[Mapping[int, int]]] = Hooks("metrics.written_hook_failed")


def on_points_written(written: Mapping[int, int]) -> None:
    """Tell the listeners of one committed write (nothing when it added no point)."""
    if written:
        written_hooks(written)
