"""The ORM write path that ``update_work_unit_executions`` replaced, kept as an oracle.

``workunits.services.update_work_unit_executions`` is set-based (a handful of
SQL statements per batch). This is the row-by-row version it replaced, built
from model objects, kept *only* so that
``tests/workunits/test_update_equivalence.py`` can check both give identical
results on random histories, and so ``bench/update_executions.py`` can
measure the difference. Nothing in the product calls it.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from django.db import connection, transaction
from django.db.models import Field
from django.utils import timezone

from core import convert

from experiments import services as experiment_services
from experiments.models import Experiment
from workunits import state
from workunits.choices import ExecutionState
from workunits.models import StatusHistory, StatusMessage, WorkUnitExecution
from workunits.services import Transition
from workunits.services.executions import _lock_work_units, _stamp
from workunits.state import ExecutionRecord, ExecutionUpdate, Merge
from workunits.wire import execution_record


def update_work_unit_executions(updates: Sequence[ExecutionUpdate], *, now: datetime | None = None) -> list[Transition]:
    """The old entry point: validate everything first, then one durable transaction."""
    state.validate_updates(updates)
    if not updates:
        return []
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        return apply_updates(updates, now)


def _record_fields(record: ExecutionRecord, ex: WorkUnitExecution, now: datetime) -> None:
    ex.state = record.state
    ex.state_update_time_ns = record.state_update_time_ns
    ex.system_message = dict(record.system_message) if record.system_message else None
    ex.user_message = dict(record.user_message) if record.user_message else None
    ex.scheduling_information = dict(record.scheduling_information) if record.scheduling_information else None
    ex.detailed_status = dict(record.detailed_status) if record.detailed_status else None
    metadata = dict(ex.metadata or {})
    if record.mlrun_url:
        metadata["mlrunUrl"] = record.mlrun_url
    else:
        metadata.pop("mlrunUrl", None)
    ex.metadata = metadata
    ex.complete_time = convert.datetime_from_ns(record.complete_time_ns) if record.complete_time_ns else None
    ex.update_time = now


_FIELDS = [
    "state", "state_update_time_ns", "system_message", "user_message", "scheduling_information",
    "detailed_status", "metadata", "complete_time", "update_time",
]


def _save_executions(rows: Sequence[WorkUnitExecution]) -> None:
    meta = WorkUnitExecution._meta
    fields = [cast("Field[Any, Any]", meta.get_field(name)) for name in _FIELDS]
    quote = connection.ops.quote_name
    sql = "UPDATE {} SET {} WHERE {} = %s".format(
        quote(meta.db_table), ", ".join(f"{quote(f.column)} = %s" for f in fields), quote("id"),
    )
    params = [[f.get_db_prep_save(getattr(row, f.attname), connection) for f in fields] + [row.pk] for row in rows]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


def apply_updates(updates: Sequence[ExecutionUpdate], now: datetime) -> list[Transition]:
    now_ns = convert.ns_from_datetime(now)
    work_units = _lock_work_units(u.key for u in updates)
    executions = {
        ex.work_unit_id: ex
        for ex in WorkUnitExecution.objects.filter(
            work_unit_id__in=[wu.id for wu in work_units.values()], execution_state=ExecutionState.ACTIVE
        )
    }
    first: dict[int, ExecutionRecord] = {}
    records: dict[int, ExecutionRecord] = {}
    history: list[StatusHistory] = []
    messages: list[StatusMessage] = []
    transitions: list[Transition] = []

    for update in updates:
        wu = work_units.get(update.key)
        if wu is None:
            continue
        if state.is_fenced(update.eid, wu.current_eid):
            continue
        ex = executions[wu.id]
        current = records.get(wu.id) or execution_record(ex)
        first.setdefault(wu.id, current)
        merge: Merge = state.merge_execution(current, update, now_ns)
        if not merge.changed:
            continue
        record = merge.record
        stamped = []
        for kind, message in merge.new_messages:
            content = _stamp(message, now)
            stamped.append((kind, content))
            if kind == "system" and record.system_message == message:
                record = record._replace(system_message=content)
            elif kind == "user" and record.user_message == message:
                record = record._replace(user_message=content)
        records[wu.id] = record
        history.append(StatusHistory(
            execution=ex, time=now, from_state=merge.old_state, to_state=merge.new_state, writer=update.writer,
            operation_id=update.operation_id, request_id=update.request_id,
            extra={"mask": list(update.mask), **dict(update.extra)},
        ))
        for kind, content in stamped:
            messages.append(StatusMessage(
                experiment_id=wu.experiment_id, work_unit=wu, execution_id=ex.eid, content=content,
                severity=content.get("severity", "SEVERITY_UNSPECIFIED"),
                source=content.get("source", "SOURCE_UNSPECIFIED"), kind=kind, create_time=now,
            ))
        if merge.state_changed:
            transitions.append(Transition(wu.experiment_id, wu.wid, ex.eid, merge.old_state, merge.new_state))

    if not records:
        return []
    changed = []
    for wu_id, record in records.items():
        ex = executions[wu_id]
        _record_fields(record, ex, now)
        changed.append(ex)
    _save_executions(changed)
    StatusHistory.objects.bulk_create(history)
    StatusMessage.objects.bulk_create(messages)

    state_moves: dict[int, list[tuple[str | None, str | None]]] = defaultdict(list)
    severity_moves: dict[int, list[tuple[str | None, str | None]]] = defaultdict(list)
    xid_of = {wu.id: wu.experiment_id for wu in work_units.values()}
    for wu_id, record in records.items():
        before = first[wu_id]
        xid = xid_of[wu_id]
        state_moves[xid].append((before.state, record.state))
        severity_moves[xid].append((state.best_severity(before), state.best_severity(record)))
    # Experiments locked after their work units, in xid order (the ORM query the batch write replaced).
    for exp in Experiment.objects.select_for_update(no_key=True).filter(id__in=sorted(state_moves)).order_by("id"):
        experiment_services.apply_rollup(exp, state_moves=state_moves[exp.id], severity_moves=severity_moves[exp.id],
                                         now=now)
    return transitions
