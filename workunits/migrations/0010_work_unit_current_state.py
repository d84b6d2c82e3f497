"""``WorkUnit.current_state``, ``current_start`` and ``current_end``: the current execution's state and
times on the work unit's own row, indexed (the sweep table sorts and filters 100,000 units by them;
docs/architecture/sweeps.md). Filled here from each work unit's ACTIVE execution."""
from django.db import migrations, models

#: An execution that ended before ``complete_time`` was always written ended at its last update.
BACKFILL = """
UPDATE workunits_workunit w SET current_state = e.state, current_start = e.create_time,
    current_end = COALESCE(e.complete_time, CASE WHEN e.state IN ('COMPLETED', 'FAILED', 'STOPPED')
                                                 THEN e.update_time END)
FROM workunits_workunitexecution e
WHERE e.work_unit_id = w.id AND e.execution_state = 'ACTIVE'
"""


class Migration(migrations.Migration):

    dependencies = [
        ('workunits', '0009_history_writer_system_metrics'),
    ]

    operations = [
        migrations.AddField(
            model_name='workunit',
            name='current_end',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='workunit',
            name='current_start',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='workunit',
            name='current_state',
            field=models.CharField(choices=[('INITIALIZING', 'Initializing'), ('SCHEDULING', 'Scheduling'), ('STARTING', 'Starting'), ('RUNNING', 'Running'), ('PARTIALLY_FAILED', 'Partially Failed'), ('STOPPING', 'Stopping'), ('RESTARTING', 'Restarting'), ('STOPPED', 'Stopped'), ('DESCHEDULING', 'Descheduling'), ('COMPLETED', 'Completed'), ('FAILED', 'Failed'), ('SCHEDULING_PAUSED', 'Scheduling Paused')], default='INITIALIZING', max_length=24),
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
        migrations.AddIndex(
            model_name='workunit',
            index=models.Index(fields=['experiment', 'current_state', 'wid'], name='workunit_xid_state_idx'),
        ),
        migrations.AddIndex(
            model_name='workunit',
            index=models.Index(fields=['experiment', 'current_start', 'current_end', 'wid'], name='workunit_xid_times_idx'),
        ),
    ]
