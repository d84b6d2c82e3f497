"""Operators' admin for dashboards and charts (clients write them; an operator may share a dashboard).

``Dashboard`` has no ACL field on the wire, so sharing a dashboard with the
experiments' role model is done here: only ``acls`` is editable, and the save
goes through `metrics.services.set_dashboard_acls`.
"""
from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from core.admin import ReadOnlyAdminMixin
from metrics import services
from metrics.models import Chart, Dashboard


@admin.register(Dashboard)
class DashboardAdmin(admin.ModelAdmin):
    list_display = ("dashboard_id", "title", "owner", "create_time")
    search_fields = ("dashboard_id", "title", "owner")
    readonly_fields = ("dashboard_id", "title", "description", "owner", "chart_layout", "create_time", "update_time")
    fields = (*readonly_fields, "acls")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Dashboard, form: Any, change: bool) -> None:
        services.set_dashboard_acls(obj, obj.acls)


@admin.register(Chart)
class ChartAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("chart_id", "title", "experiment", "work_unit", "creator", "create_time")
    search_fields = ("chart_id", "title", "creator")
