"""Slack incoming-webhook URLs are secrets (whoever holds one posts to the channel): they move
from the plain ``url`` column into ``url_encrypted`` (Fernet, as webhook secrets), and ``url``
keeps a redacted form for display. Existing Slack subscriptions keep working; going back
decrypts them into ``url`` again."""
from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.db import migrations, models

from notifications import crypto


def _redacted(url: str) -> str:  # notifications.services.redacted, frozen as of this migration
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/…{url[-4:]}"


def encrypt_slack_urls(apps: Any, schema_editor: Any) -> None:
    Subscription = apps.get_model("notifications", "Subscription")
    for sub in Subscription.objects.filter(channel="SLACK", url_encrypted="").exclude(url=""):
        sub.url_encrypted, sub.url = crypto.encrypt(sub.url), _redacted(sub.url)
        sub.save(update_fields=["url", "url_encrypted"])


def decrypt_slack_urls(apps: Any, schema_editor: Any) -> None:
    Subscription = apps.get_model("notifications", "Subscription")
    for sub in Subscription.objects.filter(channel="SLACK").exclude(url_encrypted=""):
        sub.url, sub.url_encrypted = crypto.decrypt(sub.url_encrypted), ""
        sub.save(update_fields=["url", "url_encrypted"])


class Migration(migrations.Migration):

    dependencies = [
        ("notifications", "0002_breakers_per_subscription"),
    ]

    operations = [
        migrations.AddField(
            model_name="subscription",
            name="url_encrypted",
            field=models.TextField(blank=True, default=""),
        ),
        migrations.AlterField(
            model_name="subscription",
            name="url",
            field=models.CharField(blank=True, default="", help_text="Webhook URL; for Slack only a redacted form (the URL is the secret).", max_length=2048),
        ),
        migrations.RunPython(encrypt_slack_urls, decrypt_slack_urls),
    ]
