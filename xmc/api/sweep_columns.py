"""The filter and order fields of a sweep: a work unit's arguments and metric summaries.

``args.<name>`` (the work unit's flattened argument, `workunits.models.WorkUnit.args`: compared as
a number when both sides are numbers, else as text) and ``metrics.<name>.<last|min|max>`` (its
current execution's summary, `metrics.summaries.summary_value`) are fields of every experiment, but
which names exist depends on the experiment. `SweepColumns` resolves them on demand for the
listing machinery (`xmc.listing`): its `SweepColumns.fields` and `SweepColumns.orderable` are the
mappings ``compile_filter`` and ``parse_order_by`` read, and every name they resolve adds the
annotation it needs (`SweepColumns.apply`). An unknown argument or metric is a
`xmc.listing.ListingError` naming the field (INVALID_ARGUMENT), never a database error.

Used by ListWorkUnits (``xmc.api.handlers``) and by the sweep read (``xmc.api.sweeps``).
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from django.db.models import F, FloatField, QuerySet
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from metrics import summaries
from workunits.models import ArgumentStat
from xmc.listing import FilterError, FilterField, ListingError, OrderByError, compile_filter, parse_order_by

#: How the placeholders read in "allowed: ..." messages.
DYNAMIC = ("args.<name>", "metrics.<name>.<last|min|max>")
@dataclass(frozen=True)
class ArgStat:
    """One argument name across an experiment's work units."""

    units: int  # how many work units have it
    common: str | None  # its value if every unit that has it has the same one
    numeric: bool  # every value is a number (then it sorts as a number)


def arg_stats(xid: int) -> dict[str, ArgStat]:
    """Every argument name of experiment ``xid``, with its statistics: the rows the create path keeps
    (`workunits.models.ArgumentStat`), a few per experiment whatever its size."""
    return {row.name: ArgStat(row.units, row.low if row.low == row.high else None, row.numeric)
            for row in ArgumentStat.objects.filter(experiment_id=xid)}


def _alias(kind: str, name: str) -> str:
    """A stable annotation name for a dynamic field (page tokens' fingerprints name the lookups)."""
    return f"sweep_{kind}_{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


class SweepColumns:
    """The filter fields and orderable fields of one experiment's work units, static and dynamic."""

    def __init__(self, xid: int, fields: Mapping[str, FilterField], orderable: Mapping[str, str]) -> None:
        self.xid = xid
        self.annotations: dict[str, Any] = {}
        self._base_fields = fields
        self._base_order = orderable
        self._args: dict[str, ArgStat] | None = None
        self._metrics: dict[str, bool] = {}
        self.fields: Mapping[str, FilterField] = _Fields(self)
        self.orderable: Mapping[str, str] = _Order(self)

    # -- what exists ------------------------------------------------------------------------

    def args(self) -> dict[str, ArgStat]:
        if self._args is None:
            self._args = arg_stats(self.xid)
        return self._args

    def _has_metric(self, metric: str) -> bool:
        if metric not in self._metrics:
            self._metrics[metric] = summaries.has_metric(self.xid, metric)
        return self._metrics[metric]

    # -- resolving a dynamic name ---------------------------------------------------------------

    def arg(self, name: str, error: type[FilterError] | type[OrderByError]) -> tuple[str, str]:
        """(text lookup, number lookup) of ``args.<name>``, annotated on `apply`."""
        arg = name.removeprefix("args.")
        if not arg or arg not in self.args():
            raise error(f"unknown field {name!r}: no work unit of experiments/{self.xid} has an argument {arg!r}")
        text, number = _alias("arg_text", arg), _alias("arg_number", arg)
        self.annotations[text] = KeyTextTransform(arg, "args")
        # Numbers were parsed once, when the work unit was created (`WorkUnit.arg_numbers`): no text to
        # check per row here (that check cost more than the rest of the query).
        self.annotations[number] = Cast(KeyTextTransform(arg, "arg_numbers"), FloatField())
        return text, number

    def metric(self, name: str, error: type[FilterError] | type[OrderByError]) -> str:
        """The lookup of ``metrics.<name>.<last|min|max>``, annotated on `apply`."""
        metric, _, stat = name.removeprefix("metrics.").rpartition(".")
        if not metric or stat not in summaries.STATS:
            raise error(f"unknown field {name!r}: write metrics.<name>.<{'|'.join(summaries.STATS)}>")
        if not self._has_metric(metric):
            raise error(f"unknown field {name!r}: experiments/{self.xid} has no metric {metric!r}")
        relation, alias = _alias("metric", metric), _alias(f"metric_{stat}", metric)
        self.annotations[relation] = summaries.current_summary(metric)
        self.annotations[alias] = F(f"{relation}__{stat}")
        return alias

    def apply(self, queryset: QuerySet[Any, Any]) -> QuerySet[Any, Any]:
        """``queryset`` with the annotations of every dynamic field resolved so far."""
        return queryset.annotate(**self.annotations) if self.annotations else queryset


class _Fields(Mapping[str, FilterField]):
    """`SweepColumns.fields`: what ``compile_filter`` reads (``get``) and lists (iteration)."""

    def __init__(self, columns: SweepColumns) -> None:
        self.columns = columns

    def get(self, name: str, default: Any = None) -> Any:
        base = self.columns._base_fields.get(name)
        if base is not None:
            return base
        if name.startswith("args."):
            text, number = self.columns.arg(name, FilterError)
            return FilterField(text, "mixed", number_lookup=number)
        if name.startswith("metrics."):
            return FilterField(self.columns.metric(name, FilterError), "number")
        return default

    def __getitem__(self, name: str) -> FilterField:
        found = self.get(name)
        if found is None:
            raise KeyError(name)
        return found

    def __iter__(self) -> Iterator[str]:
        yield from self.columns._base_fields
        yield from DYNAMIC

    def __len__(self) -> int:
        return len(self.columns._base_fields) + len(DYNAMIC)


class _Order(Mapping[str, str]):
    """`SweepColumns.orderable`: an argument sorts as a number when every value of it is one."""

    def __init__(self, columns: SweepColumns) -> None:
        self.columns = columns

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self.columns._base_order or name.startswith(("args.", "metrics.")))

    def __getitem__(self, name: str) -> str:
        if name in self.columns._base_order:
            return self.columns._base_order[name]
        if name.startswith("args."):
            text, number = self.columns.arg(name, OrderByError)
            return number if self.columns.args()[name.removeprefix("args.")].numeric else text
        if name.startswith("metrics."):
            return self.columns.metric(name, OrderByError)
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        yield from self.columns._base_order
        yield from DYNAMIC

    def __len__(self) -> int:
        return len(self.columns._base_order) + len(DYNAMIC)


def prepare(columns: SweepColumns, filter_text: str, order_by: str) -> None:
    """Resolve the dynamic names of ``filter_text`` and ``order_by`` (so `SweepColumns.apply` annotates
    them) before the listing compiles them again on the annotated queryset. Errors are left for that
    second pass, which raises them where the caller expects them (after its permission check)."""
    try:
        compile_filter(filter_text, columns.fields)
    except ListingError:
        pass
    try:
        parse_order_by(order_by, columns.orderable)
    except ListingError:
        pass
