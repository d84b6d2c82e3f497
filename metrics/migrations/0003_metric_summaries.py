"""Metric summaries (`metrics.models.MetricSummary`), kept by the write path from now on, and computed
here once from the points already stored (docs/architecture/sweeps.md)."""

import django.db.models.deletion
from django.db import migrations, models


BACKFILL = """
INSERT INTO metrics_metricsummary (work_unit_id, eid, metric, experiment_id, last, last_step, min, max, count,
                                   first_time, last_time)
SELECT e.work_unit_id, e.eid, p.metric, w.experiment_id,
       (array_agg(p.value ORDER BY p.step DESC))[1], max(p.step), min(p.value), max(p.value), count(*),
       min(p.time), max(p.time)
FROM metrics_metricpoint p
JOIN workunits_workunitexecution e ON e.id = p.execution_id
JOIN workunits_workunit w ON w.id = e.work_unit_id
GROUP BY e.work_unit_id, e.eid, p.metric, w.experiment_id
"""


class Migration(migrations.Migration):

    dependencies = [
        ('experiments', '0002_acl_indexes'),
        ('metrics', '0002_partitioned_points'),
        ('workunits', '0006_internal_update_operations'),
    ]

    operations = [
        migrations.CreateModel(
            name='MetricSummary',
            fields=[
                ('pk', models.CompositePrimaryKey('work_unit', 'eid', 'metric', blank=True, editable=False, primary_key=True, serialize=False)),
                ('eid', models.BigIntegerField()),
                ('metric', models.CharField(max_length=256)),
                ('last', models.FloatField()),
                ('last_step', models.BigIntegerField()),
                ('min', models.FloatField()),
                ('max', models.FloatField()),
                ('count', models.BigIntegerField()),
                ('first_time', models.DateTimeField()),
                ('last_time', models.DateTimeField()),
                ('experiment', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='metric_summaries', to='experiments.experiment')),
                ('work_unit', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='metric_summaries', to='workunits.workunit')),
            ],
            options={
                'indexes': [models.Index(fields=['experiment', 'metric'], include=['work_unit', 'eid', 'last', 'min', 'max'], name='metric_summary_xid_metric_idx')],
            },
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
    ]
