"""The delivery floor's one periodic task: ``xmc.delivery.sweep`` (see ``delivery.sweep``)."""
from __future__ import annotations

from core.queues import Queue
from delivery import declare
from delivery import sweep as sweeps


@declare.task(name="xmc.delivery.sweep", queue=Queue.ACTUATOR, time_limit=120)
def sweep() -> dict[str, int]:
    """Re-send every table's rows never sent, or whose lease ran out."""
    return sweeps.sweep()
