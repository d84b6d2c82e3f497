"""Admin: subscriptions (secrets never shown), the delivery log with "send again", the breakers."""
from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from notifications import services
from notifications.models import Delivery, DeliveryAttempt, EndpointHealth, Event, Subscription
from xmc.auth.identity import identity_for_email


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "scope", "experiment_id", "channel", "url", "enabled", "create_time")
    list_filter = ("channel", "scope", "enabled")
    search_fields = ("owner", "url", "email")
    exclude = ("secret_encrypted", "previous_secret_encrypted", "url_encrypted")
    readonly_fields = ("create_time", "update_time", "previous_secret_expires")
    actions = ["send_test_event"]

    @admin.action(description="Send a test event")
    def send_test_event(self, request: HttpRequest, queryset: QuerySet[Subscription]) -> None:
        for sub in queryset:
            services.send_test(identity_for_email(sub.owner), sub.id)
        messages.success(request, f"{queryset.count()} test event(s) queued")


class AttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    extra = 0
    can_delete = False
    readonly_fields = ("number", "time", "status_code", "ok", "latency_ms", "error")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ("message_id", "subscription", "type", "xid", "status", "attempts", "last_status_code",
                    "create_time", "delivered_time")
    list_filter = ("status", "type")
    search_fields = ("message_id",)
    readonly_fields = [f.name for f in Delivery._meta.fields]
    inlines = [AttemptInline]
    actions = ["send_again"]

    @admin.action(description="Send again (same webhook-id)")
    def send_again(self, request: HttpRequest, queryset: QuerySet[Delivery]) -> None:
        for d in queryset:
            services.send_again(d.id)
        messages.success(request, f"{queryset.count()} delivery(ies) queued again")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ("key", "type", "xid", "wid", "eid", "create_time", "done")
    list_filter = ("type", "done")
    readonly_fields = [f.name for f in Event._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Events come from committed transitions (notifications.sources); a form of read-only
        # fields could only save an empty row, which the database refuses (a 500 the fuzz found).
        return False


@admin.register(EndpointHealth)
class EndpointHealthAdmin(admin.ModelAdmin):
    list_display = ("endpoint", "consecutive_failures", "open_until", "update_time")
