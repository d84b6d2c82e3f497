"""The ``xmc.google.com/notify-when`` annotation: the one owner of its format.

The value is the set of work unit states a JobSet's lifecycle rules want to
hear about, as state names joined by dots in the enum's order
(``STARTING.RUNNING.STOPPED.COMPLETED.FAILED``). The state server computes
it (``lifecycle.stamping.notify_when_for``: the union of what the rules want
for the work unit's artifacts) and the actuator stamps it on the JobSet; the
reconciler reads it back from the JobSet and asks :func:`matches` before it
publishes a lifecycle event. Nobody else splits or joins the string. The key
itself is the JobSet contract's (``jobsets.contract.ANNOTATION_NOTIFY_WHEN``),
the Update task's mask path the task wire's (``core.task_wire.NOTIFY_WHEN_PATH``).
"""
from __future__ import annotations

from collections.abc import Iterable

from jobsets import contract
from workunits.choices import WorkUnitState

ANNOTATION = contract.ANNOTATION_NOTIFY_WHEN
SEPARATOR = "."
_ORDER = {name: i for i, name in enumerate(WorkUnitState.values)}


def encode(states: Iterable[str]) -> str:
    """The annotation value for ``states`` ("" for none); unknown names raise ValueError."""
    wanted = set(states)
    unknown = sorted(wanted - set(_ORDER))
    if unknown:
        raise ValueError(f"not work unit states: {', '.join(unknown)}")
    return SEPARATOR.join(sorted(wanted, key=_ORDER.__getitem__))


def decode(value: str) -> frozenset[str]:
    """The states named by an annotation value; names this version does not know are ignored."""
    return frozenset(part for part in (p.strip() for p in (value or "").split(SEPARATOR)) if part in _ORDER)


def matches(value: str, state: str) -> bool:
    """Whether a JobSet annotated with ``value`` wants to hear about ``state``."""
    return state in decode(value)
