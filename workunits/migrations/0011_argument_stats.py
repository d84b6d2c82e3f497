"""``ArgumentStat``: each experiment's argument names with their unit count, lowest and highest value and
whether all are numbers, kept by the create path (the sweep table's argument columns without an
aggregate over every unit; docs/architecture/sweeps.md). Filled here for the existing work units."""
import django.db.models.deletion
from django.db import migrations, models

BACKFILL = """
INSERT INTO workunits_argumentstat (experiment_id, name, units, low, high, numeric)
SELECT w.experiment_id, a.key, count(*), min(a.value), max(a.value), bool_and(w.arg_numbers ? a.key)
FROM workunits_workunit w CROSS JOIN LATERAL jsonb_each_text(w.args) a
GROUP BY w.experiment_id, a.key
"""


class Migration(migrations.Migration):

    dependencies = [
        ('experiments', '0002_acl_indexes'),
        ('workunits', '0010_work_unit_current_state'),
    ]

    operations = [
        migrations.CreateModel(
            name='ArgumentStat',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.TextField()),
                ('units', models.BigIntegerField()),
                ('low', models.TextField()),
                ('high', models.TextField()),
                ('numeric', models.BooleanField()),
                ('experiment', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='experiments.experiment')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('experiment', 'name'), name='argumentstat_unique_xid_name')],
            },
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
    ]
