"""Keep Django users' emails canonical and revoke tokens when a user goes away.

Connected by `xmc.apps.XmcConfig.ready`. Every save of a ``User`` (admin,
``createsuperuser``, scripts) stores the email normalized
(`xmc.auth.identity.normalize_email`) and refuses one that is not a valid
address; the database keeps it unique (migration ``xmc.0003``). Deleting a
user, deactivating one, or changing its email raises the old email's token
generation (`xmc.auth.services.do_revoke_tokens`), so tokens issued before
stop working at once.
"""
from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models.signals import post_delete, post_save, pre_save

from xmc.auth.identity import validated_email
from xmc.auth.services import do_revoke_tokens

_BEFORE = "_xmc_before_save"


def normalize_user_email(sender: Any, instance: Any, raw: bool = False, **kwargs: Any) -> None:
    if raw:
        return  # fixtures load rows as they are
    if instance.email:
        try:
            instance.email = validated_email(instance.email)
        except ValueError as exc:
            raise ValidationError({"email": str(exc)}) from None
    before = None
    if instance.pk is not None:
        before = sender.objects.filter(pk=instance.pk).values("email", "is_active").first()
    setattr(instance, _BEFORE, before)


def revoke_on_change(sender: Any, instance: Any, created: bool, raw: bool = False, **kwargs: Any) -> None:
    before = getattr(instance, _BEFORE, None)
    if raw or created or not before or not before["email"]:
        return
    if before["email"] != instance.email:
        do_revoke_tokens(before["email"], reason="email changed")
    elif before["is_active"] and not instance.is_active:
        do_revoke_tokens(instance.email, reason="user deactivated")


def revoke_on_delete(sender: Any, instance: Any, **kwargs: Any) -> None:
    if instance.email:
        do_revoke_tokens(instance.email, reason="user deleted")


def connect() -> None:
    user_model = get_user_model()
    pre_save.connect(normalize_user_email, sender=user_model, dispatch_uid="xmc.auth.normalize_user_email")
    post_save.connect(revoke_on_change, sender=user_model, dispatch_uid="xmc.auth.revoke_on_change")
    post_delete.connect(revoke_on_delete, sender=user_model, dispatch_uid="xmc.auth.revoke_on_delete")
