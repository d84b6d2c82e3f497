"""Admin for the login flow's one-time codes and token generations (read-only records),
and the admin site's throttled sign-in form (`xmc.auth.throttle`)."""
from __future__ import annotations

from django.contrib import admin

from workunits.admin import ReadOnlyAdminMixin
from xmc.auth.throttle import ThrottledAdminAuthenticationForm
from xmc.models import CliAuthorizationCode, TokenGeneration

admin.site.login_form = ThrottledAdminAuthenticationForm


@admin.register(CliAuthorizationCode)
class CliAuthorizationCodeAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("email", "created_at", "expires_at", "used_at")
    search_fields = ("email",)


@admin.register(TokenGeneration)
class TokenGenerationAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("email", "generation", "changed_at", "reason")
    search_fields = ("email",)
