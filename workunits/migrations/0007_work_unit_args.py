"""``WorkUnit.args``: the executable's arguments flattened, for the sweep read's ``args.<name>`` filters
and orders (docs/architecture/sweeps.md); filled here for the work units created before."""
from typing import Any

from django.db import migrations, models

from workunits.arguments import flat_args, numbers

BATCH = 2000


def fill_args(apps: Any, schema_editor: Any) -> None:
    WorkUnit = apps.get_model("workunits", "WorkUnit")
    last = 0
    while True:
        rows = list(WorkUnit.objects.filter(id__gt=last).order_by("id").only("id", "executable")[:BATCH])
        if not rows:
            return
        for row in rows:
            row.args = flat_args(row.executable)
            row.arg_numbers = numbers(row.args)
        WorkUnit.objects.bulk_update(rows, ["args", "arg_numbers"])
        last = rows[-1].id


class Migration(migrations.Migration):

    dependencies = [
        ('workunits', '0006_internal_update_operations'),
    ]

    operations = [
        migrations.AddField(
            model_name='workunit',
            name='args',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name='workunit',
            name='arg_numbers',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.RunPython(fill_args, migrations.RunPython.noop),
    ]
