"""Operators' admin for work units, executions, operations and the state record.

Thin: every change goes through ``workunits.services`` (admin actions stop
and restart call the same functions as the API). Audit fields and the state
record are read-only; nothing here saves a stateful model itself.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from google.protobuf import json_format

from workunits import scheduling, services, timeline
from workunits.choices import ExecutionState, WorkUnitState
from workunits.models import (
    DeadLetter,
    Operation,
    OutboxMessage,
    PausedTask,
    SchedulingSwitch,
    SchedulingSwitchChange,
    StatusHistory,
    StatusMessage,
    WorkUnit,
    WorkUnitExecution,
)
from core import pb  # noqa: F401 - registers cloud.xmanager.v1 types for the Any of a stored Task
from core.admin import ReadOnlyAdminMixin
from core.errors import ServiceError
from core.task_wire import InvalidTask, decode


def requester(request: HttpRequest) -> services.Requester:
    user = request.user
    return services.Requester(email=getattr(user, "email", "") or f"admin:{user.get_username()}")


def _current_state() -> Subquery:
    return Subquery(
        WorkUnitExecution.objects.filter(work_unit=OuterRef("pk"), execution_state=ExecutionState.ACTIVE)
        .values("state")[:1]
    )


class CurrentStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Iterable[tuple[str, str]]:
        return WorkUnitState.choices

    def queryset(self, request: HttpRequest, queryset: QuerySet[WorkUnit]) -> QuerySet[WorkUnit]:
        if self.value():
            return queryset.filter(executions__execution_state=ExecutionState.ACTIVE,
                                   executions__state=self.value())
        return queryset


class ExecutionInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = WorkUnitExecution
    extra = 0
    fields = ("eid", "execution_state", "state", "create_time", "update_time", "complete_time",
              "system_message", "user_message")
    readonly_fields = fields
    ordering = ("-eid",)
    show_change_link = True


def _run_per_work_unit(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[WorkUnit],
                       verb: str, fn: Any) -> None:
    done, failed = 0, []
    for wu in queryset.order_by("experiment_id", "wid"):
        try:
            fn(wu.experiment_id, [wu.wid], batch=False, requester=requester(request))
            done += 1
        except ServiceError as exc:
            failed.append(f"{wu.name}: {exc.message}")
    if done:
        modeladmin.message_user(request, f"{verb} {done} work unit(s).", messages.SUCCESS)
    for line in failed:
        modeladmin.message_user(request, line, messages.ERROR)


# ``permissions=["change"]``: Django offers and runs an action only for users
# whose ``has_change_permission`` holds (the ``workunits.change_workunit``
# model permission); a staff user who may only view work units cannot stop them.
@admin.action(description="Stop selected work units", permissions=["change"])
def stop_work_units(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[WorkUnit]) -> None:
    _run_per_work_unit(modeladmin, request, queryset, "Stopping", services.stop_work_units)


@admin.action(description="Restart selected work units", permissions=["change"])
def restart_work_units(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[WorkUnit]) -> None:
    _run_per_work_unit(modeladmin, request, queryset, "Restarted", services.restart_work_units)


def execution_timeline(ex: WorkUnitExecution) -> SafeString:
    """The execution's states over time as a server-drawn SVG (workunits.timeline)."""
    rows = [(h.time, h.to_state) for h in ex.history.all()]
    end = ex.complete_time or timezone.now()
    picture = timeline.svg(timeline.segments(rows, end), title=f"execution {ex.eid}: states over time")
    return mark_safe(picture)  # noqa: S308 - every text in it is escaped by timeline.svg


class MessageInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = StatusMessage
    extra = 0
    fields = ("create_time", "execution_id", "severity", "source", "kind", "content")
    readonly_fields = fields
    ordering = ("-id",)
    verbose_name_plural = "status messages"


@admin.register(WorkUnit)
class WorkUnitAdmin(admin.ModelAdmin):
    list_display = ("__str__", "current_state", "work_unit_type", "priority", "current_eid", "create_time")
    list_filter = (CurrentStateFilter, "work_unit_type", "priority")
    search_fields = ("experiment__id", "experiment__title", "tags")
    readonly_fields = ("experiment", "wid", "work_unit_type", "priority", "create_time", "update_time", "urls",
                       "executable", "tags", "notes", "current_eid", "timelines",
                       # the current execution's copies, written by the write path only
                       "current_state", "current_start", "current_end")
    inlines = [ExecutionInline, MessageInline]
    actions = [stop_work_units, restart_work_units]
    list_select_related = ("experiment",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkUnit]:
        return super().get_queryset(request).annotate(_current_state=_current_state())

    @admin.display(description="state", ordering="_current_state")
    def current_state(self, obj: WorkUnit) -> str:
        return getattr(obj, "_current_state", "") or ""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: WorkUnit, form: Any, change: bool) -> None:
        # Never ``obj.save()``: it would write every column as the form loaded
        # it, and a save racing a restart would rewind ``current_eid`` while
        # the newer execution stays ACTIVE (the EID fence inverted). Every
        # field is read-only here; state changes go through the actions
        # (``workunits.services``), which lock the row.
        editable = [f for f in form.changed_data if f not in self.get_readonly_fields(request, obj)]
        if editable:  # pragma: no cover - nothing is editable today; kept narrow if a field ever is
            obj.save(update_fields=editable)

    @admin.display(description="timeline")
    def timelines(self, obj: WorkUnit) -> SafeString:
        executions = obj.executions.prefetch_related("history").order_by("-eid")
        return format_html_join(
            "", '<div class="xmc-execution-timeline" data-eid="{}"><p><a href="{}">execution {}</a> ({}, {})</p>{}</div>',
            ((ex.eid, f"../../workunitexecution/{ex.pk}/change/", ex.eid, ex.state, ex.execution_state,
              execution_timeline(ex)) for ex in executions),
        )


class HistoryInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = StatusHistory
    extra = 0
    fields = ("time", "from_state", "to_state", "writer", "operation", "request_id", "extra")
    readonly_fields = fields


@admin.register(WorkUnitExecution)
class WorkUnitExecutionAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("__str__", "execution_state", "state", "update_time", "complete_time")
    list_filter = ("state", "execution_state")
    search_fields = ("work_unit__experiment__id",)
    inlines = [HistoryInline]
    list_select_related = ("work_unit",)
    readonly_fields = ("timeline",)

    @admin.display(description="timeline")
    def timeline(self, obj: WorkUnitExecution) -> SafeString:
        return format_html('<div class="xmc-execution-timeline" data-eid="{}">{}</div>', obj.eid,
                           execution_timeline(obj))


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "target", "action_type", "task_type", "done", "create_time", "end_time",
                    "dispatched_time", "original_requester")
    list_filter = ("action_type", "task_type", "done")
    search_fields = ("target", "original_requester")


@admin.register(StatusHistory)
class StatusHistoryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("execution", "time", "from_state", "to_state", "writer")
    list_filter = ("to_state", "writer")


@admin.register(StatusMessage)
class StatusMessageAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("__str__", "experiment", "work_unit", "execution_id", "severity", "source", "create_time")
    list_filter = ("severity", "source", "kind")


@admin.register(PausedTask)
class PausedTaskAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("__str__", "task_type", "created_time", "resolution_status", "skip_reason", "processed_time",
                    "resumption_run_id")
    list_filter = ("task_type", "resolution_status", "skip_reason")


def _requeue(dead: DeadLetter, request: HttpRequest) -> None:
    """Send a dead letter's work again (through the service, whatever it was about); ServiceError says why not."""
    services.send_dead_letter_again(dead.id, requester=requester(request))


@admin.action(description="Send again what the selected dead letters were about")
def requeue_dead_letters(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> None:
    done, failed = 0, []
    for dead in queryset.order_by("id"):
        try:
            _requeue(dead, request)
            done += 1
        except ServiceError as exc:
            failed.append(f"dead letter {dead.id}: {exc.message}")
    if done:
        modeladmin.message_user(request, f"Sent {done} dead letter(s) again.", messages.SUCCESS)
    for line in failed:
        modeladmin.message_user(request, line, messages.ERROR)


def decoded_task(payload: bytes) -> str:
    """The stored Task as JSON (the packed WorkUnit unpacked), or why it does not parse."""
    try:
        task = decode(bytes(payload))
        return json_format.MessageToJson(task, indent=2, sort_keys=True)
    except (InvalidTask, json_format.Error, TypeError) as exc:
        return f"(undecodable: {exc}) {bytes(payload)[:200]!r}"


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("task_name", "task_type", "error_code", "about", "attempts", "created_time", "requeued_time")
    list_filter = ("task_name", "task_type", "error_code", "source")
    readonly_fields = ("task_name", "task_type", "operation", "message", "source", "source_id", "error_code",
                       "error_message", "attempts", "created_time", "requeued_time", "task")
    exclude = ("payload",)
    actions = [requeue_dead_letters]
    #: The record's own page has a Re-queue button too (templates/admin/workunits/deadletter/change_form.html).
    change_form_template = "admin/workunits/deadletter/change_form.html"

    def get_urls(self) -> list[URLPattern]:
        mine = [path("<path:object_id>/requeue/", self.admin_site.admin_view(self.requeue_view),
                     name="workunits_deadletter_requeue")]
        return mine + super().get_urls()

    def requeue_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST from the Re-queue button: the same service call as the list's action, back to the page."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        dead = self.get_object(request, object_id)
        if dead is None or not self.has_view_permission(request, dead):
            raise Http404("no such dead letter")
        try:
            _requeue(dead, request)
            self.message_user(request, f"Re-queued dead letter {dead.id}.", messages.SUCCESS)
        except ServiceError as exc:
            self.message_user(request, f"dead letter {dead.id}: {exc.message}", messages.ERROR)
        return HttpResponseRedirect(reverse("admin:workunits_deadletter_change", args=[dead.id]))

    @admin.display(description="about")
    def about(self, obj: DeadLetter) -> str:
        """What ran out of tries: an operation, an outbox message or a row of an app above."""
        if obj.operation_id is not None:
            return f"operation {obj.operation_id}"
        if obj.message_id is not None:
            return f"message {obj.message_id}"
        return f"{obj.source} {obj.source_id}" if obj.source else "-"

    @admin.display(description="task (decoded)")
    def task(self, obj: DeadLetter) -> str:
        if obj.message_id is not None or obj.source:  # the message's JSON arguments
            return format_html("<pre>{}</pre>", bytes(obj.payload).decode("utf-8", "replace"))
        return format_html("<pre>{}</pre>", decoded_task(obj.payload))


@admin.register(OutboxMessage)
class OutboxMessageAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The outbox of every queue but the actuator's (workunits.delivery): what is still to be done."""

    list_display = ("id", "task_name", "queue", "done", "attempts", "dispatch_attempts", "create_time",
                    "dispatched_time", "claimed_until", "end_time")
    list_filter = ("done", "queue", "task_name")
    readonly_fields = ("queue", "task_name", "args", "create_time", "dispatched_time", "dispatch_attempts",
                       "claimed_until", "claimed_by", "done", "end_time", "attempts", "error")


@admin.action(description="Pause scheduling (asks for a reason)")
def pause_scheduling(modeladmin: admin.ModelAdmin, request: HttpRequest,
                     queryset: QuerySet[SchedulingSwitch]) -> HttpResponse | None:
    reason = request.POST.get("reason", "")
    error = ""
    if "apply" in request.POST:
        try:
            scheduling.pause(reason=reason, by=requester(request).email)
        except ServiceError as exc:
            error = exc.message
        else:
            modeladmin.message_user(request, "Scheduling paused.", messages.SUCCESS)
            return None
    return TemplateResponse(request, "admin/workunits/pause_scheduling.html", {
        **modeladmin.admin_site.each_context(request),
        "title": "Pause scheduling", "queryset": queryset, "reason": reason, "error": error,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME, "opts": modeladmin.model._meta,
    })


@admin.action(description="Resume scheduling (re-sends held tasks on the resumption queue)")
def resume_scheduling(modeladmin: admin.ModelAdmin, request: HttpRequest,
                      queryset: QuerySet[SchedulingSwitch]) -> None:
    try:
        result = scheduling.resume(by=requester(request).email)
    except ServiceError as exc:
        modeladmin.message_user(request, exc.message, messages.ERROR)
        return
    verb = "Scheduling resumed" if result.was_paused else "Scheduling was not paused"
    modeladmin.message_user(
        request, f"{verb}; resumption run {result.run_id} started for "
        f"{result.status.pending_paused_tasks} pending paused task(s).", messages.SUCCESS)


@admin.register(SchedulingSwitch)
class SchedulingSwitchAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("__str__", "reason", "changed_by", "changed_time", "pending_paused_tasks")
    actions = [pause_scheduling, resume_scheduling]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        scheduling.ensure_switch()  # one row to select the actions on
        return super().changelist_view(request, extra_context)

    @admin.display(description="pending paused tasks")
    def pending_paused_tasks(self, obj: SchedulingSwitch) -> int:
        return scheduling.pending_paused_tasks()


@admin.register(SchedulingSwitchChange)
class SchedulingSwitchChangeAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("time", "paused", "changed_by", "reason", "resumption_run_id")
    list_filter = ("paused",)
