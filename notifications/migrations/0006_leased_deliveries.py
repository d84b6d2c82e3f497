"""Events and deliveries carry the delivery floor's lease columns (delivery.models.Leased).

Every row is kept: ``Event.fanned_out`` becomes ``done`` (renamed, values kept),
``Delivery.lease_until`` becomes ``claimed_until`` (a DELIVERING row keeps its
lease), and a delivery already DELIVERED, DEAD or SUPPRESSED is ``done``.
"""
from __future__ import annotations

from typing import Any

from django.db import migrations, models

FINAL = ("DELIVERED", "DEAD", "SUPPRESSED")


def mark_done(apps: Any, schema_editor: Any) -> None:
    apps.get_model("notifications", "Delivery").objects.filter(status__in=FINAL).update(done=True)


class Migration(migrations.Migration):
    dependencies = [("notifications", "0005_work_unit_idle")]

    operations = [
        migrations.RemoveIndex(model_name="event", name="notif_event_pending"),
        migrations.RenameField(model_name="event", old_name="fanned_out", new_name="done"),
        migrations.AddIndex(model_name="event",
                            index=models.Index(fields=["done", "create_time"], name="notif_event_pending")),
        migrations.AddField(model_name="event", name="dispatched_time",
                            field=models.DateTimeField(blank=True, null=True)),
        migrations.AddField(model_name="event", name="dispatch_attempts", field=models.IntegerField(default=0)),
        migrations.AddField(model_name="event", name="claimed_until",
                            field=models.DateTimeField(blank=True, null=True)),
        migrations.AddField(model_name="event", name="claimed_by",
                            field=models.CharField(blank=True, default="", max_length=64)),
        migrations.RenameField(model_name="delivery", old_name="lease_until", new_name="claimed_until"),
        migrations.AddField(model_name="delivery", name="claimed_by",
                            field=models.CharField(blank=True, default="", max_length=64)),
        migrations.AddField(model_name="delivery", name="dispatched_time",
                            field=models.DateTimeField(blank=True, null=True)),
        migrations.AddField(model_name="delivery", name="dispatch_attempts", field=models.IntegerField(default=0)),
        migrations.AddField(model_name="delivery", name="done", field=models.BooleanField(default=False)),
        migrations.RunPython(mark_done, migrations.RunPython.noop),
    ]
