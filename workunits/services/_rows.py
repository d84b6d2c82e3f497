"""What the work unit services share: the requester, the reads, and the rows every writer inserts.

``create`` and ``commands`` both insert executions (`_insert_execution`) and
open batch operations (`_batch_operation`, `_finish`, `_batch_response`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any



from core import convert, pb
from core.errors import NotFound
from experiments.models import Experiment
from workunits.choices import ExecutionState, Writer
from workunits.models import Operation, StatusHistory, WorkUnit, WorkUnitExecution


@dataclass(frozen=True)
class Requester:
    """Who asked: the verified identity and, for audit only, the asserted email."""

    email: str = ""
    asserted_email: str = ""


SYSTEM = Requester(email="system")


def _now_ns(now: datetime) -> int:
    return convert.ns_from_datetime(now)


def get_work_unit(xid: int, wid: int) -> WorkUnit:
    try:
        return WorkUnit.objects.select_related("experiment").get(experiment_id=xid, wid=wid)
    except WorkUnit.DoesNotExist:
        raise NotFound(f"experiments/{xid}/workUnits/{wid} not found", field="name") from None


def current_execution(wu: WorkUnit) -> WorkUnitExecution:
    return WorkUnitExecution.objects.get(work_unit=wu, eid=wu.current_eid)


def _execution_metadata(wu: WorkUnit) -> dict[str, Any]:
    return convert.to_json(
        pb.work_unit_execution.WorkUnitExecutionMetadata(
            type=pb.work_unit_execution.WorkUnitExecutionMetadata.WorkUnitExecutionType.JOB_SET,
            resource_name=f"xmc-{wu.experiment_id}-{wu.wid}",
        )
    )


def _insert_execution(wu: WorkUnit, eid: int, initial: str, now: datetime, op: Operation) -> WorkUnitExecution:
    ex = WorkUnitExecution.objects.create(
        work_unit=wu,
        eid=eid,
        execution_state=ExecutionState.ACTIVE,
        create_time=now,
        update_time=now,
        state=initial,
        state_update_time_ns=_now_ns(now),
        metadata=_execution_metadata(wu),
    )
    StatusHistory.objects.create(
        execution=ex, time=now, from_state="", to_state=initial, writer=Writer.STATE_SERVER, operation=op,
        extra={"insert": True},
    )
    return ex


def _batch_operation(exp: Experiment, action: str, requester: Requester, now: datetime) -> Operation:
    """The one operation a batch RPC returns; per-work-unit operations are its children."""
    return Operation.objects.create(
        experiment=exp, action_type=action, target=exp.name, create_time=now,
        original_requester=requester.email, asserted_email=requester.asserted_email,
    )


def _batch_response(exp: Experiment, work_units: Sequence[WorkUnit]) -> dict[str, Any]:
    """A batch operation's response: ListWorkUnitsResponse of the affected units."""
    response = pb.api.ListWorkUnitsResponse(work_units=[pb.work_unit.WorkUnit(name=wu.name) for wu in work_units])
    return convert.packed_json(response)


def _finish(op: Operation, now: datetime, *, response: dict[str, Any] | None = None,
            error: dict[str, Any] | None = None) -> None:
    op.done = True
    op.end_time = now
    op.response = response
    op.error = error
    op.save(update_fields=["done", "end_time", "response", "error"])
