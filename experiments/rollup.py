"""Pure roll-up rules: how work unit states fold into the experiment's status.

Used by ``experiments.services.apply_rollup`` inside the transaction that
changed the work units; no ORM, no clock.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from core.choices import TERMINAL
from experiments.choices import ActiveState, LaunchState


def fold_counts(counts: Mapping[str, int], moves: Iterable[tuple[str | None, str | None]]) -> dict[str, int]:
    """Apply ``(old, new)`` moves to a name -> count map (``None`` = not counted).

    Zero entries are dropped so the stored map only lists what exists.
    """
    result = {k: int(v) for k, v in counts.items()}
    for old, new in moves:
        if old == new:
            continue
        if old is not None:
            result[old] = result.get(old, 0) - 1
        if new is not None:
            result[new] = result.get(new, 0) + 1
    return {k: v for k, v in result.items() if v}


def active_state(launch_state: str, child_state_counts: Mapping[str, int]) -> str:
    """ACTIVE while launching or any work unit is not terminal; INACTIVE once
    the launch failed or every work unit is terminal."""
    if launch_state == LaunchState.LAUNCHING:
        return ActiveState.ACTIVE
    if launch_state == LaunchState.FAILED:
        return ActiveState.INACTIVE
    if any(count > 0 and state not in TERMINAL for state, count in child_state_counts.items()):
        return ActiveState.ACTIVE
    return ActiveState.INACTIVE
