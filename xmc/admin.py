"""Admin for the login flow's one-time codes (read-only record)."""
from __future__ import annotations

from django.contrib import admin

from workunits.admin import ReadOnlyAdminMixin
from xmc.models import CliAuthorizationCode


@admin.register(CliAuthorizationCode)
class CliAuthorizationCodeAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("email", "created_at", "expires_at", "used_at")
    search_fields = ("email",)
