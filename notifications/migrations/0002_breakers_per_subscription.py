"""Circuit breakers are kept per subscription (``subscriptions/{id}``) instead of per
``scheme://host:port`` / ``email``: the rows under the old keys are never read again, so they go."""
from __future__ import annotations

from typing import Any

from django.db import migrations


def forget_host_breakers(apps: Any, schema_editor: Any) -> None:
    apps.get_model("notifications", "EndpointHealth").objects.exclude(endpoint__startswith="subscriptions/").delete()


class Migration(migrations.Migration):
    dependencies = [("notifications", "0001_initial")]
    operations = [migrations.RunPython(forget_host_breakers, migrations.RunPython.noop)]
