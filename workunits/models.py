"""Work units, their numbered executions, operations and the state record.

Every stateful row here is written by ``workunits.services`` (or, for paused
tasks and the scheduling switch, by the services of later issues); the admin,
API views, tasks and the reconciler call those services and never ``save()``
these models themselves. The database enforces identity with named unique
constraints: one work unit per ``(xid, wid)``, one execution per
``(xid, wid, eid)`` and exactly one ACTIVE execution per work unit.
"""
from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models

from workunits.choices import (
    ActionType,
    ExecutionState,
    ResolutionStatus,
    TaskType,
    WorkUnitState,
    WorkUnitType,
    Writer,
)
from core import limits
from core.choices import MessageSource, Priority, Severity
from delivery.models import Leased


class WorkUnit(models.Model):
    experiment = models.ForeignKey("experiments.Experiment", on_delete=models.CASCADE, related_name="work_units")
    wid = models.BigIntegerField(help_text="Work unit id, 1, 2, 3 ... within the experiment.")
    work_unit_type = models.CharField(max_length=16, choices=WorkUnitType.choices, default=WorkUnitType.STANDARD)
    priority = models.CharField(max_length=16, choices=Priority.choices, default=Priority.NORMAL)
    create_time = models.DateTimeField()
    update_time = models.DateTimeField()
    urls = models.JSONField(default=list, blank=True)
    #: The full cloud.xmanager.v1.Executable as proto3 JSON.
    executable = models.JSONField(default=dict, blank=True)
    tags = ArrayField(models.CharField(max_length=limits.TAG), default=list, blank=True)
    notes = models.TextField(blank=True, default="")
    #: eid of the current (ACTIVE) execution.
    current_eid = models.BigIntegerField(default=1)
    #: The executable's arguments flattened, ``name -> value`` (`workunits.arguments.flat_args`): written by
    #: the create path (executables never change), filtered and ordered by the sweep read (``args.<name>``).
    args = models.JSONField(default=dict, blank=True)
    #: Those arguments that are numbers, as JSON numbers (`workunits.arguments.numbers`): ``args.lr < 0.1``
    #: compares them without parsing text per row.
    arg_numbers = models.JSONField(default=dict, blank=True)
    #: The current execution's state, when it started and when it ended (None while it runs): copies of
    #: its columns, written in the same statement or transaction as every change of them (the create,
    #: ``workunits.services.executions`` and the restart), so a table of 100,000 units sorts and filters
    #: by state or duration on this row alone (docs/architecture/sweeps.md).
    current_state = models.CharField(max_length=24, choices=WorkUnitState.choices, default=WorkUnitState.INITIALIZING)
    current_start = models.DateTimeField(null=True, blank=True)
    current_end = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["experiment_id", "wid"]
        constraints = [
            models.UniqueConstraint(fields=["experiment", "wid"], name="workunit_unique_xid_wid"),
            models.CheckConstraint(condition=models.Q(wid__gt=0), name="workunit_wid_positive"),
            models.CheckConstraint(condition=models.Q(current_eid__gt=0), name="workunit_eid_positive"),
        ]
        indexes = [
            models.Index(fields=["experiment", "-create_time"], name="workunit_xid_create_idx"),
            models.Index(fields=["experiment", "work_unit_type"], name="workunit_xid_type_idx"),
            GinIndex(fields=["tags"], name="workunit_tags_gin"),
            models.Index(fields=["experiment", "current_state", "wid"], name="workunit_xid_state_idx"),
            # Covers a sort by duration (an index-only scan: the duration is computed from the two times).
            models.Index(fields=["experiment", "current_start", "current_end", "wid"], name="workunit_xid_times_idx"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def xid(self) -> int:
        return self.experiment_id

    @property
    def name(self) -> str:
        return f"experiments/{self.experiment_id}/workUnits/{self.wid}"


class ArgumentStat(models.Model):
    """One argument name across an experiment's work units: how many have it, its lowest and highest
    value (as text: equal when every unit has the same one) and whether every value is a number.

    Written by the create path in the same transaction as the work units (``workunits.services.create``:
    arguments never change and work units are only added), so the sweep table reads an experiment's
    argument columns from a few rows instead of aggregating every unit's ``args``.
    """

    experiment = models.ForeignKey("experiments.Experiment", on_delete=models.CASCADE, related_name="+")
    name = models.TextField()
    units = models.BigIntegerField()
    low = models.TextField()
    high = models.TextField()
    numeric = models.BooleanField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["experiment", "name"], name="argumentstat_unique_xid_name")]

    def __str__(self) -> str:
        return f"experiments/{self.experiment_id} {self.name}"


class WorkUnitExecution(models.Model):
    work_unit = models.ForeignKey(WorkUnit, on_delete=models.CASCADE, related_name="executions")
    eid = models.BigIntegerField(help_text="Execution id, 1, 2, 3 ...; each restart adds one.")
    execution_state = models.CharField(max_length=16, choices=ExecutionState.choices, default=ExecutionState.ACTIVE)
    create_time = models.DateTimeField()
    update_time = models.DateTimeField()
    complete_time = models.DateTimeField(null=True, blank=True)

    # WorkUnitStatus. The state and its time are columns (guards and filters
    # read them); the nested messages are proto3 JSON dicts.
    state = models.CharField(max_length=24, choices=WorkUnitState.choices)
    #: status.state_update_time in unix nanoseconds: kept exact, because the
    #: timestamp guard compares it with writers' clocks.
    state_update_time_ns = models.BigIntegerField()
    system_message = models.JSONField(null=True, blank=True)
    user_message = models.JSONField(null=True, blank=True)
    scheduling_information = models.JSONField(null=True, blank=True)
    detailed_status = models.JSONField(null=True, blank=True)

    #: WorkUnitExecutionMetadata as proto3 JSON (includes mlrunUrl).
    metadata = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["work_unit_id", "eid"]
        constraints = [
            # work_unit identifies (xid, wid), so this is the (xid, wid, eid) identity.
            models.UniqueConstraint(fields=["work_unit", "eid"], name="execution_unique_xid_wid_eid"),
            models.UniqueConstraint(
                fields=["work_unit"],
                condition=models.Q(execution_state=ExecutionState.ACTIVE),
                name="execution_one_active_per_work_unit",
            ),
            models.CheckConstraint(condition=models.Q(eid__gt=0), name="execution_eid_positive"),
        ]
        # No index covers a status column (state, times, messages): every
        # guarded write can then be a HOT update (with the table's fillfactor,
        # set in migration 0002), touching no index. State filters go through
        # the work unit's ACTIVE execution (execution_one_active_per_work_unit).

    def __str__(self) -> str:
        return f"experiments/{self.work_unit.experiment_id}/workUnits/{self.work_unit.wid}/executions/{self.eid}"


class Operation(Leased):
    """A long-running operation, and the outbox of what must be sent to workers.

    A work-unit operation (``work_unit`` set) names
    ``experiments/{xid}/workUnits/{wid}/operations/{id}``; a batch operation
    ``experiments/{xid}/operations/{id}`` and its per-work-unit children point
    at it through ``parent``. ``task_type`` / ``eid`` / ``target_eid`` say
    which actuator task the operation stands for; ``dispatched_time`` is set
    once the broker accepted it, so a sweep can re-send what never left.
    """

    experiment = models.ForeignKey("experiments.Experiment", on_delete=models.CASCADE, related_name="operations")
    work_unit = models.ForeignKey(WorkUnit, on_delete=models.CASCADE, null=True, blank=True, related_name="operations")
    parent = models.ForeignKey("self", on_delete=models.CASCADE, null=True, blank=True, related_name="children")
    action_type = models.CharField(max_length=16, choices=ActionType.choices)
    target = models.CharField(max_length=256, help_text="Resource name the operation acts on.")
    create_time = models.DateTimeField()
    end_time = models.DateTimeField(null=True, blank=True)
    #: google.rpc.Status as {"code": int, "message": str} when it failed.
    error = models.JSONField(null=True, blank=True)
    #: The response message as proto3 JSON with its "@type" when it succeeded.
    response = models.JSONField(null=True, blank=True)
    original_requester = models.CharField(max_length=limits.EMAIL, blank=True, default="",
                                          help_text="Verified identity of the caller.")
    asserted_email = models.CharField(max_length=limits.EMAIL, blank=True, default="",
                                      help_text="x-goog-user-email as sent by the client (audit only).")
    requested_cancellation = models.BooleanField(default=False)
    cancellation_requester = models.CharField(max_length=limits.EMAIL, blank=True, default="")

    # Outbox: the actuator task this operation stands for.
    task_type = models.CharField(max_length=16, choices=TaskType.choices, blank=True, default="")
    eid = models.BigIntegerField(null=True, blank=True, help_text="Execution the task is for.")
    target_eid = models.BigIntegerField(null=True, blank=True, help_text="Restart: the execution it supersedes.")
    # The lease columns (dispatched_time, dispatch_attempts, claimed_until, claimed_by, done)
    # are delivery.models.Leased's.

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["create_time"], name="operation_undispatched_idx",
                         condition=models.Q(done=False, dispatched_time__isnull=True)),
            models.Index(fields=["dispatched_time"], name="operation_leased_idx",
                         condition=models.Q(done=False, dispatched_time__isnull=False)),
            models.Index(fields=["end_time"], name="operation_done_end_idx", condition=models.Q(done=True)),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def name(self) -> str:
        if self.work_unit is not None:
            return f"experiments/{self.experiment_id}/workUnits/{self.work_unit.wid}/operations/{self.id}"
        return f"experiments/{self.experiment_id}/operations/{self.id}"


class StatusHistory(models.Model):
    """One accepted change of an execution's status, written in the same transaction."""

    #: No database FOREIGN KEY constraint (the index stays): the per-row
    #: check at commit doubled the cost of a history insert. The code keeps
    #: the integrity instead (docs/architecture/state_machine.md, "Schema
    #: choices"): rows are inserted only for executions read under their work
    #: unit's lock, and deletes go through Django's collector, which cascades.
    execution = models.ForeignKey(WorkUnitExecution, on_delete=models.CASCADE, related_name="history",
                                  db_constraint=False)
    time = models.DateTimeField()
    from_state = models.CharField(max_length=24, choices=WorkUnitState.choices, blank=True, default="")
    to_state = models.CharField(max_length=24, choices=WorkUnitState.choices)
    writer = models.CharField(max_length=24, choices=Writer.choices)
    operation = models.ForeignKey(Operation, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    request_id = models.CharField(max_length=128, blank=True, default="")
    #: The update mask and any extra detail (e.g. observed JobSet rule).
    extra = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["execution_id", "id"]
        verbose_name_plural = "status history"
        indexes = [
            # The pages' estimated start (ui.reads.recent_admissions): a queue's recent
            # admissions, newest first. Partial: one row per admission, not per change.
            models.Index(fields=["time"], name="history_admission_time_idx",
                         condition=models.Q(from_state="SCHEDULING")),
        ]

    def __str__(self) -> str:
        return f"{self.from_state or '-'} -> {self.to_state}"


class StatusMessage(models.Model):
    """A system or user message, recorded whenever a new one is written."""

    experiment = models.ForeignKey("experiments.Experiment", on_delete=models.CASCADE, related_name="status_messages")
    work_unit = models.ForeignKey(WorkUnit, on_delete=models.CASCADE, null=True, blank=True,
                                  related_name="status_messages")
    execution_id = models.BigIntegerField(default=0, help_text="eid the message is about (0: experiment).")
    #: cloud.xmanager.v1.StructuredMessage as proto3 JSON.
    content = models.JSONField()
    severity = models.CharField(max_length=24, choices=Severity.choices)
    source = models.CharField(max_length=24, choices=MessageSource.choices, default=MessageSource.UNSPECIFIED)
    kind = models.CharField(max_length=16, default="system", help_text="system or user message.")
    create_time = models.DateTimeField()

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["experiment", "work_unit", "-id"], name="statusmessage_parent_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.severity}: {self.content.get('userFacingText', '')[:60]}"

    @property
    def name(self) -> str:
        if self.work_unit is not None:
            return f"experiments/{self.experiment_id}/workUnits/{self.work_unit.wid}/statusMessages/{self.id}"
        return f"experiments/{self.experiment_id}/statusMessages/{self.id}"


class SchedulingSwitch(models.Model):
    """The single global pause switch (row id 1).

    Written only by ``workunits.scheduling.pause`` / ``resume``; every change
    appends a :class:`SchedulingSwitchChange` in the same transaction.
    ``changed_time`` is "paused since" while ``paused``.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    paused = models.BooleanField(default=False)
    reason = models.TextField(blank=True, default="")
    changed_by = models.CharField(max_length=320, blank=True, default="")
    changed_time = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=models.Q(id=1), name="scheduling_switch_singleton")]
        verbose_name_plural = "scheduling switches"  # not Django's "switchs"

    def __str__(self) -> str:
        return "paused" if self.paused else "running"


class SchedulingSwitchChange(models.Model):
    """One change of the scheduling switch: the audit trail operators read."""

    time = models.DateTimeField()
    paused = models.BooleanField(help_text="The switch after the change.")
    changed_by = models.CharField(max_length=320)
    reason = models.TextField(blank=True, default="")
    #: Resume: the resumption run it started.
    resumption_run_id = models.UUIDField(null=True, blank=True)

    class Meta:
        ordering = ["-time", "-id"]

    def __str__(self) -> str:
        return f"{'pause' if self.paused else 'resume'} by {self.changed_by} at {self.time:%Y-%m-%d %H:%M:%S}"


class PausedTask(models.Model):
    """An actuator task held back while scheduling is paused.

    No foreign keys on purpose: resumption joins with work units, and a task
    whose work unit is gone simply drops out.
    """

    task_type = models.CharField(max_length=16, choices=TaskType.choices)
    payload = models.BinaryField(help_text="Serialized xmc.internal.v1.Task.")
    xid = models.BigIntegerField()
    wid = models.BigIntegerField()
    eid = models.BigIntegerField()
    created_time = models.DateTimeField()
    resolution_status = models.CharField(max_length=16, choices=ResolutionStatus.choices, blank=True, default="")
    processed_time = models.DateTimeField(null=True, blank=True)
    resumption_run_id = models.UUIDField(null=True, blank=True)
    #: Why resumption skipped the task (one of ``workunits.resumption.SkipReason``).
    skip_reason = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        ordering = ["created_time", "id"]
        indexes = [
            # "Is there a newer Update for this work unit?" (a resumption skip rule).
            models.Index(fields=["xid", "wid", "task_type", "created_time"], name="pausedtask_wu_type_idx"),
            models.Index(fields=["created_time", "id"], name="pausedtask_pending_idx",
                         condition=models.Q(processed_time__isnull=True)),
            models.Index(fields=["processed_time"], name="pausedtask_processed_idx",
                         condition=models.Q(processed_time__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.task_type} experiments/{self.xid}/workUnits/{self.wid} eid={self.eid}"


class OutboxMessage(Leased):
    """A message for a worker queue that is not an Operation (lifecycle events, resumption runs, ...).

    The outbox row of ``workunits.delivery`` (lease columns: ``delivery.models.Leased``): written in (or right after) the
    transaction whose outcome it carries, sent to ``queue`` as Celery task
    ``task_name`` with ``args`` and the keyword ``delivery_id`` (this row's
    id), re-sent by the sweep while it is not done and its lease has run
    out, claimed by the worker that runs it, and done exactly once.
    """

    queue = models.CharField(max_length=32)
    task_name = models.CharField(max_length=128)
    #: The task's positional arguments (JSON: text and numbers only).
    args = models.JSONField(default=list)
    create_time = models.DateTimeField()
    end_time = models.DateTimeField(null=True, blank=True)
    #: How many times a worker ran it (the last run's error when it was dead-lettered).
    attempts = models.IntegerField(default=0)
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["create_time"], name="outboxmessage_pending_idx", condition=models.Q(done=False)),
            models.Index(fields=["end_time"], name="outboxmessage_done_end_idx", condition=models.Q(done=True)),
        ]

    def __str__(self) -> str:
        return f"{self.task_name}#{self.id}"


class DeadLetter(models.Model):
    """A task that failed permanently or ran out of retries."""

    task_name = models.CharField(max_length=128)
    task_type = models.CharField(max_length=16, choices=TaskType.choices, blank=True, default="")
    payload = models.BinaryField()
    operation = models.ForeignKey(Operation, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    #: The outbox message (lifecycle event, resumption run) that ran out of tries, when not an operation.
    message = models.ForeignKey(OutboxMessage, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    #: A row of an app above this one that ran out of tries (``app_label.model``, e.g.
    #: ``notifications.delivery``) and its id: "send again" is that app's handler
    #: (``workunits.hooks.dead_letter_requeuers``).
    source = models.CharField(max_length=64, blank=True, default="")
    source_id = models.BigIntegerField(null=True, blank=True)
    error_code = models.CharField(max_length=32)
    error_message = models.TextField()
    attempts = models.IntegerField(default=1)
    created_time = models.DateTimeField()
    requeued_time = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_time"]
        indexes = [models.Index(fields=["source", "source_id"], name="deadletter_source")]

    def __str__(self) -> str:
        return f"{self.task_name} {self.error_code}"
