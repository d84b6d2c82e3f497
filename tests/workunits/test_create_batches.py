"""CreateWorkUnit by group commit: a batch writes what the same creates one by one would have written."""
from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from django.db import connection, connections
from django.utils import timezone

from experiments.models import Experiment
from tests import factories
from tests.workunits.test_concurrency import run_threads
from core import convert
from workunits import services
from workunits.models import Operation, StatusHistory, WorkUnit, WorkUnitExecution

pytestmark = pytest.mark.django_db(transaction=True)

SKIP = {"id", "experiment", "work_unit", "execution", "operation", "target", "metadata", "create_time",
        "update_time", "current_start", "time", "state_update_time_ns", "response", "end_time", "dispatched_time"}


def request(work_unit_id: int = 0, notes: str = "") -> services.create._Create:
    message = factories.work_unit_message()
    message.notes = notes
    return services.create._Create(
        work_unit_id=work_unit_id, work_unit_type="STANDARD", priority=None, urls=[],
        executable=convert.to_json(message.executable), tags=["t"], notes=notes,
        requester=services.Requester("alice@example.com"), now=timezone.now(),
    )


def rows(exp: Experiment) -> dict[str, Any]:
    """Everything the creates wrote for ``exp``, without ids and clocks."""
    def fields(obj: Any) -> dict[str, Any]:
        return {f.name: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields if f.name not in SKIP}

    exp.refresh_from_db()
    return {
        "work_units": [fields(w) for w in WorkUnit.objects.filter(experiment=exp).order_by("wid")],
        "operations": [(o.work_unit.wid, fields(o))
                       for o in Operation.objects.filter(experiment=exp).order_by("work_unit__wid", "id")],
        "executions": [(x.work_unit.wid, fields(x))
                       for x in WorkUnitExecution.objects.filter(work_unit__experiment=exp).order_by("work_unit__wid")],
        "history": [(h.execution.work_unit.wid, fields(h))
                    for h in StatusHistory.objects.filter(execution__work_unit__experiment=exp).order_by("id")],
        "rollup": (exp.child_state_counts, exp.last_wid, exp.active_state),
    }


def test_it_writes_and_answers_a_batch_as_the_same_creates_one_by_one() -> None:
    batched, sequential = factories.experiment(), factories.experiment()
    # Already there: wid 2 (a client retry will ask again) and wid 4 (its CREATE operation deleted).
    for exp in (batched, sequential):
        for wid in (2, 4):
            services.create_work_unit(exp.id, factories.work_unit_message(), work_unit_id=wid)
        Operation.objects.filter(experiment=exp, work_unit__wid=4).delete()
    # Allocated ids, explicit ones (new, again in the batch, already there, deleted operation), in one order.
    plan = [0, 7, 0, 2, 7, 4, 0, 5, 0]
    answers_batched, _ = services.create._create_batch(batched.id, [request(i, f"n{k}") for k, i in enumerate(plan)])
    answers_sequential = [services.create._create_batch(sequential.id, [request(i, f"n{k}")])[0][0]
                          for k, i in enumerate(plan)]

    def answer(op: Operation) -> tuple[int, bool, str]:
        return op.work_unit.wid, op.done, op.work_unit.notes

    assert [answer(op) for op in answers_batched] == [answer(op) for op in answers_sequential]
    # 5 is allocated first, so the explicit 5 later is a retry of it, as one by one.
    assert [op.work_unit.wid for op in answers_batched] == [5, 7, 8, 2, 7, 4, 9, 5, 10]
    assert answers_batched[1].id == answers_batched[4].id  # the second 7 is answered with the first's operation
    assert answers_batched[0].id == answers_batched[7].id
    assert rows(batched) == rows(sequential)
    assert batched.child_state_counts == {"INITIALIZING": 7} and batched.last_wid == 10


def test_it_shares_one_transaction_among_creates_that_queue_behind_a_busy_experiment() -> None:
    exp = factories.experiment()
    db = connection.settings_dict
    with psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"],
                         password=db["PASSWORD"] or None) as other:
        # Another writer holds the experiment row: the first create waits for it, the rest queue behind.
        other.execute("SELECT 1 FROM experiments_experiment WHERE id = %s FOR UPDATE", [exp.id])
        threads = [threading.Thread(target=lambda: (services.create_work_unit(exp.id, factories.work_unit_message()),
                                                    connections.close_all()))
                   for _ in range(12)]
        for thread in threads:
            thread.start()
        deadline = threading.Event()
        while len(services.create._CREATES._queues.get(exp.id, ())) < 11 and not deadline.wait(0.01):  # noqa: SLF001
            pass
        other.commit()
    for thread in threads:
        thread.join(30)
    exp.refresh_from_db()
    assert exp.child_state_counts == {"INITIALIZING": 12} and exp.last_wid == 12
    assert sorted(WorkUnit.objects.filter(experiment=exp).values_list("wid", flat=True)) == list(range(1, 13))
    with connection.cursor() as cursor:  # xmin: the transaction that wrote the row
        cursor.execute("SELECT count(DISTINCT xmin::text) FROM workunits_workunit WHERE experiment_id = %s", [exp.id])
        assert cursor.fetchone()[0] == 2  # the first create alone, then the eleven that queued


def test_it_answers_and_does_not_write_twice_a_wid_committed_while_a_batch_waited_for_the_lock() -> None:
    exp = factories.experiment()
    db = connection.settings_dict
    answers: list[int] = []
    with psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"],
                         password=db["PASSWORD"] or None) as other:
        other.execute("SELECT 1 FROM experiments_experiment WHERE id = %s FOR UPDATE", [exp.id])

        def create(_: int) -> None:  # two transactions of their own (not combined): both read before either wrote
            [op], _ = services.create._create_batch(exp.id, [request(7)])
            answers.append(op.id)

        waiting = threading.Thread(target=lambda: run_threads(create, 2))
        waiting.start()
        with connection.cursor() as cursor:
            while True:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
                               [db["NAME"]])
                if cursor.fetchone()[0] >= 2:
                    break
        other.commit()
        waiting.join(60)
    assert len(answers) == 2 and answers[0] == answers[1]
    assert WorkUnit.objects.filter(experiment=exp).count() == 1
    assert Operation.objects.filter(experiment=exp).count() == 1
    exp.refresh_from_db()
    assert exp.child_state_counts == {"INITIALIZING": 1}


def test_it_refuses_a_create_inside_a_transaction_of_the_callers_own_and_writes_nothing() -> None:
    """Its commit is the caller's (durable): it never joins another thread's batch either."""
    exp = factories.experiment()
    from django.db import transaction

    with pytest.raises(RuntimeError, match="durable"):
        with transaction.atomic():
            services.create_work_unit(exp.id, factories.work_unit_message())
    assert not WorkUnit.objects.filter(experiment=exp).exists()


def test_it_keeps_the_create_statement_short_enough_for_psycopg_to_cache_its_conversion() -> None:
    """psycopg re-parses a longer statement's placeholders on every call (see `_create_sql`)."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    exp = factories.experiment()
    services.create_work_unit(exp.id, factories.work_unit_message())
    statements = [sql for key, sql in services.create._SQL.items() if isinstance(key, tuple)]  # one per roll-up field list
    assert statements
    assert all(len(sql.encode()) <= MAX_CACHED_STATEMENT_LENGTH for sql in statements)
