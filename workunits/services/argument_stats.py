"""Each experiment's argument statistics (`workunits.models.ArgumentStat`), kept by the create path.

`record` adds a batch of new work units' arguments in the create's own transaction (the experiment
row is locked there, so creates of one experiment update its rows one after another); `refresh`
recomputes an experiment's rows from its work units (for rows written in SQL, as the benchmarks do).
The sweep read (``xmc.api.sweep_columns.arg_stats``) reads them. See docs/architecture/sweeps.md.
"""
from __future__ import annotations

from collections.abc import Iterable

from core.db import kept_cursor
from workunits.models import ArgumentStat, WorkUnit
from workunits.services.executions import _dumps

_STAT = ArgumentStat._meta.db_table
_WU = WorkUnit._meta.db_table
_MERGE = ("ON CONFLICT (experiment_id, name) DO UPDATE SET units = s.units + EXCLUDED.units, "
          "low = LEAST(s.low, EXCLUDED.low), high = GREATEST(s.high, EXCLUDED.high), "
          "numeric = s.numeric AND EXCLUDED.numeric")

_RECORD_SQL = f"""
INSERT INTO {_STAT} AS s (experiment_id, name, units, low, high, numeric)
SELECT %s, a.name, count(*), min(a.value), max(a.value), bool_and(a.numeric)
FROM jsonb_to_recordset(%s::jsonb) AS a(name text, value text, numeric boolean)
GROUP BY a.name
{_MERGE}
"""

_REFRESH_SQL = f"""
INSERT INTO {_STAT} (experiment_id, name, units, low, high, numeric)
SELECT %(xid)s, a.key, count(*), min(a.value), max(a.value), bool_and(w.arg_numbers ? a.key)
FROM {_WU} w CROSS JOIN LATERAL jsonb_each_text(w.args) a
WHERE w.experiment_id = %(xid)s
GROUP BY a.key
"""


def record(xid: int, units: Iterable[WorkUnit]) -> None:
    """Add the arguments of ``units`` (new work units of experiment ``xid``); the caller holds the
    transaction that inserts them."""
    rows = [{"name": name, "value": value, "numeric": name in (unit.arg_numbers or {})}
            for unit in units for name, value in (unit.args or {}).items()]
    if rows:
        kept_cursor().execute(_RECORD_SQL, [xid, _dumps(rows)])


def refresh(xid: int) -> None:
    """Recompute experiment ``xid``'s rows from its work units."""
    ArgumentStat.objects.filter(experiment_id=xid).delete()
    kept_cursor().execute(_REFRESH_SQL, {"xid": xid})
