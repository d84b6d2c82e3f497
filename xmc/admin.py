"""Admin for the login flow's one-time codes and token generations (read-only records),
and the admin site's throttled sign-in form (`xmc.auth.throttle`)."""
from __future__ import annotations

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.forms import UserChangeForm

from core.admin import ReadOnlyAdminMixin
from xmc.auth.identity import validated_email
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


class NormalizedEmailUserChangeForm(UserChangeForm):
    """The user form says what is wrong with an email instead of failing on save (`xmc.auth.signals`)."""

    def clean_email(self) -> str:
        email = self.cleaned_data.get("email") or ""
        if not email:
            return ""
        try:
            email = validated_email(email)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
        others = get_user_model().objects.filter(email=email).exclude(pk=self.instance.pk)
        if others.exists():
            raise forms.ValidationError(f"another user already has the email {email}")
        return email


class XmcUserAdmin(UserAdmin):
    form = NormalizedEmailUserChangeForm


admin.site.unregister(get_user_model())
admin.site.register(get_user_model(), XmcUserAdmin)
