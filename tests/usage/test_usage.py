"""Usage: GPU- and CPU-hours from the state history, clipped to a period, across preemptions and restarts."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from metrics import services as metric_services
from metrics.system_names import GPU_UTILIZATION
from tests import factories
from tests.fixtures.people import new_user
from tests.usage.worlds import T0, cpu_unit, gpu_unit, hours, move, run
from usage import services
from usage.models import RunningInterval
from workunits import services as wu_services
from workunits.models import WorkUnitExecution
from xmc.auth.tokens import issue_token

pytestmark = pytest.mark.django_db(transaction=True)

ALICE, BOB, OLIVIA = factories.ALICE, factories.BOB, "olivia@example.com"


def get(email: str, **params: str) -> Any:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {issue_token(email)}")
    return client.get("/v1/usage", params)


def period(start: float, end: float) -> dict[str, str]:
    return {"startTime": hours(start).isoformat().replace("+00:00", "Z"),
            "endTime": hours(end).isoformat().replace("+00:00", "Z")}


def rows_by_key(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["key"]: row for row in body["rows"]}


def utilisation(unit: Any, value: float, start: float, end: float, eid: int = 1) -> None:
    """``system/gpu_utilization`` every 15 s from ``start`` to ``end`` hours (the collector's points)."""
    pk = WorkUnitExecution.objects.get(work_unit=unit, eid=eid).pk
    n = int((end - start) * 240)
    metric_services.write_points(pk, [
        metric_services.Point(GPU_UTILIZATION, i, value, hours(start) + timedelta(seconds=15 * i)) for i in range(n)])


def test_it_counts_only_the_running_time_of_a_preempted_job_and_clips_it_to_the_period() -> None:
    unit = gpu_unit(factories.experiment(ALICE), gpus=8)
    run(unit, hours(1))
    move(unit, "DESCHEDULING", hours(3))         # preempted: 2 h of running
    move(unit, "SCHEDULING", hours(3.1))
    move(unit, "RUNNING", hours(4))              # admitted again
    move(unit, "COMPLETED", hours(5))            # 1 h more

    whole = rows_by_key(get(ALICE, **period(0, 10)).json())[ALICE]
    assert whole["gpuHours"] == pytest.approx(8 * 3)
    assert whole["executions"] == 1
    clipped = rows_by_key(get(ALICE, **period(2, 4.5)).json())[ALICE]
    assert clipped["gpuHours"] == pytest.approx(8 * 1.5)
    assert get(ALICE, **period(3.2, 3.9)).json()["rows"] == []   # queued again, nothing ran


def test_it_ends_the_running_interval_of_the_old_execution_on_a_restart() -> None:
    exp = factories.experiment(ALICE)
    unit = gpu_unit(exp, gpus=2, replicas=2)
    run(unit, hours(0))
    wu_services.restart_work_units(exp.id, [unit.wid], batch=False, now=hours(2))
    run(unit, hours(3), hours(4))            # the new execution: 1 h

    body = get(ALICE, groupBy="experiment", **period(0, 24)).json()
    row = rows_by_key(body)[str(exp.id)]
    assert row["experiment"] == f"experiments/{exp.id}"
    assert row["gpuHours"] == pytest.approx(4 * 2 + 4 * 1)
    assert row["executions"] == 2


def test_it_weighs_gpu_hours_used_by_the_recorded_utilisation_before_and_after_settling() -> None:
    unit = gpu_unit(factories.experiment(ALICE), gpus=4, cpu_millicores=3000)
    run(unit, hours(1), hours(3))
    utilisation(unit, 0.25, 1, 3)

    live = rows_by_key(get(ALICE, **period(0, 4)).json())[ALICE]
    assert live["gpuHours"] == pytest.approx(8)
    assert live["gpuHoursUsed"] == pytest.approx(2)
    assert live["cpuHours"] == pytest.approx(6)

    assert services.settle(now=hours(3) + timedelta(minutes=5)) == 1
    interval = RunningInterval.objects.get()
    assert interval.settled and interval.gpu_utilization == pytest.approx(0.25)
    settled = rows_by_key(get(ALICE, **period(0, 4)).json())[ALICE]
    assert settled["gpuHoursUsed"] == pytest.approx(2)
    assert services.settle(now=hours(10)) == 0    # nothing left to settle


def test_it_counts_a_running_job_up_to_now() -> None:
    unit = cpu_unit(factories.experiment(ALICE))
    run(unit, T0)
    result = services.usage(services_identity(ALICE), "queue", services.Period(hours(0), hours(10)), now=hours(1.5))
    assert [(r.key, round(r.cpu_hours, 6), r.gpu_hours) for r in result.rows] == [("cpu-queue", 3.0, 0.0)]


def services_identity(email: str, staff: bool = False) -> Any:
    from core.identity import Identity
    return Identity(email=email, is_staff=staff)


def test_it_shows_researchers_their_own_usage_and_staff_everyones() -> None:
    new_user("olivia", OLIVIA, is_staff=True)
    run(gpu_unit(factories.experiment(ALICE), gpus=1), hours(0), hours(1))
    run(gpu_unit(factories.experiment(BOB), gpus=2, queue="demo-queue"), hours(0), hours(1))

    assert set(rows_by_key(get(ALICE, **period(0, 2)).json())) == {ALICE}
    assert set(rows_by_key(get(BOB, **period(0, 2)).json())) == {BOB}
    staff = get(OLIVIA, **period(0, 2)).json()
    assert [row["owner"] for row in staff["rows"]] == [BOB, ALICE]       # most GPU-hours first
    assert staff["total"]["gpuHours"] == pytest.approx(3)
    queues = rows_by_key(get(OLIVIA, groupBy="queue", **period(0, 2)).json())
    assert {k: v["gpuHours"] for k, v in queues.items()} == {"demo-queue": 2, "gpu-queue": 1}


def test_it_follows_the_next_page_token_through_pages_of_groups() -> None:
    new_user("olivia", OLIVIA, is_staff=True)
    for n in range(5):
        run(gpu_unit(factories.experiment(ALICE), gpus=n + 1), hours(0), hours(1))
    first = get(OLIVIA, groupBy="experiment", pageSize="2", **period(0, 2)).json()
    assert [r["gpuHours"] for r in first["rows"]] == [5, 4] and first["totalSize"] == 5
    second = get(OLIVIA, groupBy="experiment", pageSize="2", pageToken=first["nextPageToken"], **period(0, 2)).json()
    assert [r["gpuHours"] for r in second["rows"]] == [3, 2]
    last = get(OLIVIA, groupBy="experiment", pageSize="2", pageToken=second["nextPageToken"], **period(0, 2)).json()
    assert [r["gpuHours"] for r in last["rows"]] == [1] and last["nextPageToken"] == ""
    assert last["total"]["gpuHours"] == 15


@pytest.mark.parametrize(("params", "field"), [
    ({"groupBy": "user"}, "groupBy"),
    ({"startTime": "yesterday"}, "startTime"),
    ({"endTime": "2026-13-40T00:00:00Z"}, "endTime"),
    ({"startTime": "2026-11-02T10:00:00"}, "startTime"),               # no offset: not RFC 3339
    ({"startTime": "2026-11-03T00:00:00Z", "endTime": "2026-11-02T00:00:00Z"}, "startTime"),
    ({"pageSize": "0"}, "pageSize"),
    ({"pageSize": "x"}, "pageSize"),
    ({"pageToken": "-1"}, "pageToken"),
    ({"owner": ALICE}, "owner"),
])
def test_it_answers_bad_input_with_a_400_naming_the_field(params: dict[str, str], field: str) -> None:
    response = get(ALICE, **params)
    assert response.status_code == 400
    violations = response.json()["error"]["details"][0]["fieldViolations"]
    assert violations[0]["field"] == field


def test_it_shows_no_usage_without_a_token() -> None:
    assert Client().get("/v1/usage").status_code == 401


def test_it_back_fills_in_the_migration_the_intervals_the_history_records() -> None:
    import importlib
    migration = importlib.import_module("usage.migrations.0001_initial")
    exp = factories.experiment(ALICE)
    finished, running, restarted = gpu_unit(exp, gpus=1), gpu_unit(exp, gpus=2), gpu_unit(exp, gpus=4)
    run(finished, hours(0), hours(1))
    move(finished, "RUNNING", hours(1.5))       # refused (terminal): no second interval
    run(running, hours(0))
    run(restarted, hours(0))
    wu_services.restart_work_units(exp.id, [restarted.wid], batch=False, now=hours(2))
    fields = ("execution_id", "gpus", "start_time", "end_time", "queue", "owner")
    kept = sorted(RunningInterval.objects.values_list(*fields))
    assert len(kept) == 3
    RunningInterval.objects.all().delete()
    with connection.cursor() as cursor:
        cursor.execute(migration.BACKFILL)
    assert sorted(RunningInterval.objects.values_list(*fields)) == kept


def test_it_settles_ended_intervals_on_the_beat_every_minute(settings: Any) -> None:
    from usage import tasks

    entry = next(e for e in settings.CELERY_BEAT_SCHEDULE.values() if e["task"] == "xmc.usage.settle")
    assert entry["schedule"] <= 60
    unit = gpu_unit(factories.experiment(ALICE), gpus=2)
    run(unit, hours(0), hours(1))                 # ended long ago (T0 is in the past)
    assert tasks.settle() == 1
    assert RunningInterval.objects.get().settled
