"""Every write of work units, executions, operations, history and messages.

Called by the API (gRPC and REST), the admin, Celery tasks and the
reconciler; none of them save these models themselves. Each public function
opens one durable transaction. Locks are always taken in one order so two
transactions can never deadlock:

1. ``WorkUnit`` rows, ordered by ``(xid, wid)`` (a work unit's row lock
   guards its executions: every writer of an execution holds it);
2. then ``Experiment`` rows, ordered by ``xid`` (the roll-up).

Locks are ``SELECT ... FOR NO KEY UPDATE`` (``select_for_update(no_key=True)``):
they exclude each other but not the ``FOR KEY SHARE`` locks Postgres takes
on a referenced row when a child row (operation, history, message) is
inserted, so those inserts can never turn two writers into a deadlock.

``create_work_unit`` locks only its experiment (to allocate the wid) and
inserts, so it takes no work unit lock and fits the same order.

Work for other processes is recorded on Operation rows and handed over by
``workunits.outbox.send_on_commit`` after commit.

A package with one module per topic; every public name is re-exported here,
so callers write ``from workunits import services`` and
``services.create_work_unit(...)``:

* ``_rows``: the requester, the reads, the rows create and commands share;
* ``create``: CreateWorkUnit (group commit, one-statement insert);
* ``executions``: the guarded masked updates (the reconciler's write path);
* ``operations``: Operation rows (dispatch marks, completion, cancellation,
  dead letters), the only part the outbox imports;
* ``failures``: what the actuator's retries and dead letters change on the
  execution (a WARNING while retrying; FAILED and an ERROR on a dead letter);
* ``commands``: stop, restart, update, re-queue;
* ``advisories``: the system metrics' WARNINGs on running executions (GPUs
  idle, memory near its limit), set and cleared.
"""
from __future__ import annotations

from workunits.hooks import Transition as Transition
from workunits.services._rows import Requester as Requester
from workunits.services._rows import SYSTEM as SYSTEM
from workunits.services._rows import get_work_unit as get_work_unit
from workunits.services._rows import current_execution as current_execution
from workunits.services.executions import InvalidUpdates as InvalidUpdates
from workunits.services.executions import update_work_unit_executions as update_work_unit_executions
from workunits.services.executions import update_work_unit_executions_in_transaction as update_work_unit_executions_in_transaction
from workunits.services.executions import record_execution_metadata as record_execution_metadata
from workunits.services.operations import record_enqueue_failure as record_enqueue_failure
from workunits.services.operations import CANCELLED_CODE as CANCELLED_CODE
from workunits.services.operations import mark_operations_dispatched as mark_operations_dispatched
from workunits.services.operations import record_dispatch_failure as record_dispatch_failure
from workunits.services.operations import complete_operation as complete_operation
from workunits.services.operations import cancel_pending_operation as cancel_pending_operation
from workunits.services.operations import purge_done_operations as purge_done_operations
from workunits.services.operations import record_dead_letter as record_dead_letter
from workunits.services.operations import mark_dead_letters_requeued as mark_dead_letters_requeued
from workunits.services.operations import request_operation_cancellation as request_operation_cancellation
from workunits.services.operations import delete_operation as delete_operation
from workunits.services.operations import complete_in_transaction as complete_in_transaction
from workunits.services.advisories import write_advisories as write_advisories
from workunits.services.failures import Refusal as Refusal
from workunits.services.failures import record_actuator_retry as record_actuator_retry
from workunits.services.failures import dead_letter_operation as dead_letter_operation
from workunits.services.create import CREATE_BATCH_MAX as CREATE_BATCH_MAX
from workunits.services.create import create_work_unit as create_work_unit
from workunits.services.commands import stop_work_units as stop_work_units
from workunits.services.commands import restart_work_units as restart_work_units
from workunits.services.commands import update_work_unit as update_work_unit
from workunits.services.commands import record_notify_when_update as record_notify_when_update
from workunits.services.commands import requeue_dead_letter as requeue_dead_letter
from workunits.services.commands import send_dead_letter_again as send_dead_letter_again
