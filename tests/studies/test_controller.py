"""The study controller, one step at a time: it keeps parallelTrials units running and never more,
completes, fails and prunes trials from what their units do, ends the study, and a step run again,
half done, or twice at once creates no trial or unit twice."""
from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone
from google.protobuf import json_format

from metrics import services as metric_services
from studies import controller, doorbell, hooks, services, tasks
from studies.models import Study, Trial
from tests import factories
from tests.notifications.helpers import set_state
from tests.studies.helpers import end, state_of, study, template, trials, unit_of, write
from workunits import services as wu_services
from workunits.models import Operation, OutboxMessage, StatusMessage, WorkUnit, WorkUnitExecution


def open_units(s: Study) -> int:
    return sum(1 for t in trials(s) if t.work_unit_id is not None and state_of(t) not in ("COMPLETED", "FAILED", "STOPPED"))


@pytest.mark.django_db
def test_it_starts_parallel_trials_in_a_step_as_clones_of_the_template_with_their_arguments() -> None:
    exp, unit = template()
    s = study(exp, unit)
    controller.step(s.id)
    first = trials(s)
    assert [t.number for t in first] == [0, 1] and all(t.state == "RUNNING" for t in first)
    for t in first:
        clone = unit_of(t)
        assert clone.wid == t.wid and clone.wid != unit.wid
        assert {f"study:{s.id}", f"trial:{t.number}"} <= set(clone.tags)
        args = clone.executable["jobset"]["jobs"][0]["spec"]["args"]
        assert args["epochs"] == "3"  # the template's own, kept
        assert float(args["lr"]) == pytest.approx(t.parameters["lr"]) and int(args["layers"]) == t.parameters["layers"]
        assert 1e-4 <= t.parameters["lr"] <= 1.0 and 1 <= t.parameters["layers"] <= 4
        assert clone.executable["jobset"]["jobs"][0]["spec"]["dockerImage"] == "gcr.io/proj/trainer:v1"
    controller.step(s.id)  # nothing ended: nothing more
    assert len(trials(s)) == 2 and open_units(s) == 2


@pytest.mark.django_db
def test_it_completes_the_trial_of_an_ended_unit_with_the_objective_and_frees_its_slot() -> None:
    exp, unit = template()
    s = study(exp, unit, objective={"metric": "loss", "stat": "min", "goal": "MINIMIZE"})
    controller.step(s.id)
    t0, t1 = trials(s)
    write(t0, [0.9, 0.4, 0.6])
    end(t0, "COMPLETED")
    end(t1, "FAILED")
    controller.step(s.id)
    t0.refresh_from_db(); t1.refresh_from_db()
    assert (t0.state, t0.value, t0.intermediate) == ("COMPLETED", 0.4, {"1": 0.9, "2": 0.4, "3": 0.6})
    assert t1.state == "FAILED" and "FAILED" in t1.message and t1.value is None
    assert [t.number for t in trials(s)] == [0, 1, 2, 3] and open_units(s) == 2
    status = services.study_json(s, best=services.best_trial(s))
    assert status["bestTrial"]["number"] == 0 and status["bestTrial"]["value"] == 0.4


@pytest.mark.django_db
def test_it_fails_the_trial_of_a_completed_unit_without_the_metric() -> None:
    exp, unit = template()
    s = study(exp, unit, maxTrials=1, parallelTrials=1)
    controller.step(s.id)
    (t,) = trials(s)
    write(t, [1.0], metric="accuracy")
    end(t, "COMPLETED")
    controller.step(s.id)
    t.refresh_from_db()
    assert t.state == "FAILED" and t.message == "the unit completed without a value of loss"
    s.refresh_from_db()
    assert s.state == "COMPLETED" and s.end_time is not None


@pytest.mark.django_db
def test_it_completes_the_study_at_max_trials_with_the_best_trial() -> None:
    exp, unit = template()
    s = study(exp, unit, maxTrials=5, parallelTrials=2)
    values = iter([3.0, 1.5, 2.0, 0.7, 1.1])
    for _ in range(10):
        controller.step(s.id)
        s.refresh_from_db()
        if s.state != "RUNNING":
            break
        assert open_units(s) <= 2
        for t in trials(s):
            if t.state == "RUNNING":
                write(t, [next(values)])
                end(t)
    assert s.state == "COMPLETED" and len(trials(s)) == 5
    assert services.best_trial(s).value == 0.7  # type: ignore[union-attr]


@pytest.mark.django_db
def test_it_prunes_a_trial_worse_than_the_median_stops_its_unit_with_why_and_holds_its_slot_until_stopped() -> None:
    exp, unit = template()
    s = study(exp, unit, maxTrials=4, parallelTrials=2, pruner={"median": {"warmupSteps": 3, "startupTrials": 1}})
    controller.step(s.id)
    t0, t1 = trials(s)
    write(t0, [1.0, 0.6, 0.5, 0.4])
    end(t0)
    controller.step(s.id)  # t0 completes; trial 2 starts
    t2 = trials(s)[2]
    write(t1, [1.2, 0.9])  # steps 1..2: before the warm-up ends (step 3), never pruned
    controller.step(s.id)
    t1.refresh_from_db()
    assert t1.state == "RUNNING"
    write(t1, [0.91], first_step=3)  # step 3: 0.91 > the median 0.5
    controller.step(s.id)
    t1.refresh_from_db()
    assert t1.state == "PRUNED" and t1.pruned_at_step == 3
    assert t1.message == f"pruned by study {s.id} at step 3: loss 0.9 above the median 0.5"
    assert state_of(t1) == "STOPPING"
    stopped = unit_of(t1)
    assert t1.message in str(list(StatusMessage.objects.filter(work_unit=stopped).values_list("content", flat=True)))
    controller.step(s.id)
    assert len(trials(s)) == 3  # the pruned unit still stops: its slot is taken
    set_state([WorkUnit.objects.get(id=stopped.id)], "STOPPED")
    controller.step(s.id)
    t1.refresh_from_db()
    assert t1.state == "PRUNED" and t1.unit_done and len(trials(s)) == 4
    assert t2.number == 2


@pytest.mark.django_db
def test_it_stops_the_running_trials_on_stop_and_ends_the_study_stopped() -> None:
    exp, unit = template()
    s = study(exp, unit)
    controller.step(s.id)
    services.stop_study(exp.id, s.id)
    controller.step(s.id)
    assert all(t.state == "FAILED" and t.message == "stopped with the study" for t in trials(s))
    assert all(state_of(t) == "STOPPING" for t in trials(s))
    s.refresh_from_db()
    assert s.state == "RUNNING"  # until its units have stopped
    for t in trials(s):
        end(t, "STOPPED")
    controller.step(s.id)
    s.refresh_from_db()
    assert s.state == "STOPPED" and len(trials(s)) == 2


@pytest.mark.django_db(transaction=True)
def test_it_makes_each_committed_trial_change_heard_after_its_commit_and_a_step_that_changes_nothing_silent() -> None:
    """The pages' live updates hang on this (``ui.live.publish_study``): a listener hears of a trial started,
    completed, pruned or stopped once its row is committed (it reads the row as it is), and not of a
    change that rolled back."""
    heard: list[tuple[int, int, bool, list[tuple[int, str]]]] = []

    def listener(xid: int, study_id: int) -> None:
        rows = list(Trial.objects.filter(study_id=study_id).order_by("number").values_list("number", "state"))
        heard.append((xid, study_id, connection.in_atomic_block, rows))

    hooks.changed_hooks.register(listener)
    try:
        exp, unit = template()
        s = study(exp, unit, maxTrials=4, pruner={"median": {"warmupSteps": 1, "startupTrials": 1}})
        controller.step(s.id)
        assert [h[3] for h in heard] == [[(0, "RUNNING")], [(0, "RUNNING"), (1, "RUNNING")]]  # each start, committed
        assert all(h[:3] == (exp.id, s.id, False) for h in heard)
        heard.clear()
        controller.step(s.id)  # nothing changed: nothing to tell
        assert heard == []
        t0, t1 = trials(s)
        write(t0, [0.5])
        end(t0)
        controller.step(s.id)  # trial 0's result, then trial 2 in its free slot
        assert [h[3][:2] for h in heard] == [[(0, "COMPLETED"), (1, "RUNNING")]] * 2 and len(heard[1][3]) == 3
        heard.clear()
        write(t1, [0.9])  # worse than the median 0.5 at step 1: pruned
        controller.step(s.id)
        assert heard[0][3][1] == (1, "PRUNED")
        heard.clear()
        with pytest.raises(RuntimeError), transaction.atomic():
            services.stop_study(exp.id, s.id)
            raise RuntimeError("rolled back")
        assert heard == []
        services.stop_study(exp.id, s.id)
        assert len(heard) == 1 and not heard[0][2]
    finally:
        hooks.changed_hooks.unregister(listener)


@pytest.mark.django_db
def test_it_finishes_a_step_that_died_before_creating_the_unit_in_the_next_with_the_reserved_wid() -> None:
    exp, unit = template()
    s = study(exp, unit)
    started = controller.start_trials(s)  # the step died here: rows written, no unit created
    assert [t.work_unit_id for t in started] == [None, None]
    units_before = WorkUnit.objects.filter(experiment=exp).count()
    controller.step(s.id)
    assert [unit_of(t).wid for t in trials(s)] == [t.wid for t in started]
    assert WorkUnit.objects.filter(experiment=exp).count() == units_before + 2


@pytest.mark.django_db
def test_it_creates_no_second_unit_after_a_step_that_died_after_creating_the_unit() -> None:
    exp, unit = template()
    s = study(exp, unit)
    started = controller.start_trials(s)
    for t in started:  # the unit was created, the step died before recording it
        wu_services.create_work_unit(exp.id, controller.trial_request(s, t), work_unit_id=t.wid)
    controller.step(s.id)
    controller.step(s.id)
    tagged = WorkUnit.objects.filter(experiment=exp, tags__contains=[f"study:{s.id}"])
    assert sorted(tagged.values_list("wid", flat=True)) == [t.wid for t in started]
    assert len(trials(s)) == 2


@pytest.mark.django_db(transaction=True)
def test_it_starts_parallel_trials_once_in_two_steps_at_once() -> None:
    exp, unit = template()
    s = study(exp, unit, parallelTrials=3, maxTrials=10)
    barrier, errors = threading.Barrier(3), []

    def run() -> None:
        try:
            barrier.wait()
            controller.step(s.id)
        except Exception as exc:  # asserted empty below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    rows = trials(s)
    assert [t.number for t in rows] == [0, 1, 2]
    tagged = WorkUnit.objects.filter(experiment=exp, tags__contains=[f"study:{s.id}"])
    assert tagged.count() == 3 and sorted(tagged.values_list("wid", flat=True)) == sorted(t.wid for t in rows)
    assert all(t.work_unit_id is not None for t in rows)


@pytest.mark.django_db
def test_it_rings_the_study_once_for_a_trial_units_points_and_its_end() -> None:
    exp, unit = template()
    s = study(exp, unit)
    OutboxMessage.objects.filter(task_name=doorbell.STEP_TASK).update(done=True)  # the creation's ring, answered
    controller.step(s.id)
    t0, t1 = trials(s)
    waiting = OutboxMessage.objects.filter(task_name=doorbell.STEP_TASK, done=False, args=[s.id])
    write(t0, [1.0])  # the metrics write path's hook
    assert waiting.count() == 1
    write(t1, [1.0])  # a step is already waiting: no second ring
    assert waiting.count() == 1
    waiting.update(done=True)
    end(t0)  # the committed transition's hook
    assert waiting.count() == 1
    waiting.update(done=True)
    set_state([WorkUnit.objects.get(id=unit.id)], "COMPLETED")  # the template is no trial: it rings nothing
    assert waiting.count() == 0
    assert controller.tick() == 1 and waiting.count() == 1  # the beat's pass rings every running study
    assert controller.tick() == 0  # ... once


@pytest.mark.django_db
def test_it_rings_once_the_study_of_the_trial_units_among_the_many_executions_of_one_write() -> None:
    exp, unit = template()
    s = study(exp, unit)
    OutboxMessage.objects.filter(task_name=doorbell.STEP_TASK).update(done=True)  # the creation's ring, answered
    controller.step(s.id)
    waiting = OutboxMessage.objects.filter(task_name=doorbell.STEP_TASK, done=False, args=[s.id])
    executions = [WorkUnitExecution.objects.get(work_unit=u, eid=u.current_eid).pk
                  for u in [WorkUnit.objects.get(id=unit.id), *(unit_of(t) for t in trials(s))]]
    now = timezone.now()
    batch = [(e, [metric_services.Point("system/cpu_usage_cores", 1, 1.0, now)]) for e in executions]
    assert metric_services.write_points_many(batch[:1]) == 1  # the template is no trial: it rings nothing
    assert waiting.count() == 0
    assert metric_services.write_points_many(batch[1:]) == 2  # the collector's write of both trials' units
    assert waiting.count() == 1


@pytest.mark.django_db
def test_it_runs_a_delivered_step_once_and_drops_a_second_copy() -> None:
    exp, unit = template()
    s = study(exp, unit)
    message = OutboxMessage.objects.get(task_name=doorbell.STEP_TASK, args=[s.id])

    class Copy:
        name = doorbell.STEP_TASK

        def __init__(self, task_id: str) -> None:
            self.request = type("Request", (), {"id": task_id, "retries": 0})()

    tasks.step.run.__func__(Copy("first"), s.id, delivery_id=message.id)  # type: ignore[attr-defined]
    tasks.step.run.__func__(Copy("redelivered"), s.id, delivery_id=message.id)  # type: ignore[attr-defined]
    message.refresh_from_db()
    assert message.done and message.attempts == 1
    assert len(trials(s)) == 2


@pytest.mark.django_db
def test_it_keeps_the_rungs_of_successive_halving_on_our_rows_between_decisions() -> None:
    exp, unit = template()
    s = study(exp, unit, maxTrials=6, parallelTrials=3,
              pruner={"successiveHalving": {"minResource": 1, "reductionFactor": 2}})
    controller.step(s.id)
    t0, t1, t2 = trials(s)
    write(t0, [0.1, 0.1, 0.1, 0.1])
    write(t1, [0.2, 0.2, 0.2, 0.2])
    controller.step(s.id)
    t0.refresh_from_db()
    assert any(key.startswith("completed_rung_") for key in t0.system_attrs), t0.system_attrs
    write(t2, [5.0, 5.0, 5.0, 5.0])
    controller.step(s.id)
    t2.refresh_from_db()
    assert t2.state == "PRUNED" and t2.message.startswith(f"pruned by study {s.id} at step ")


@pytest.mark.django_db
@pytest.mark.parametrize("sampler", ["tpe", "cmaes", "grid", "random"])
def test_it_has_every_sampler_choose_within_the_space(sampler: str) -> None:
    exp, unit = template()
    space = ({"layers": {"int": [1, 2]}, "act": {"choice": ["relu", "gelu"]}} if sampler == "grid"
             else {"lr": {"logUniform": [1e-4, 1.0]}, "layers": {"int": [1, 4]}, "act": {"choice": ["relu", "gelu"]}})
    s = study(exp, unit, sampler=sampler, parameters=space, maxTrials=8, parallelTrials=8)
    controller.step(s.id)
    chosen = [t.parameters for t in trials(s)]
    if sampler == "grid":  # the grid has 4 points: each once, and the study ends with them
        assert sorted((p["layers"], p["act"]) for p in chosen) == [(1, "gelu"), (1, "relu"), (2, "gelu"), (2, "relu")]
    else:
        assert len(chosen) == 8
        assert all(1e-4 <= p["lr"] <= 1.0 and p["layers"] in (1, 2, 3, 4) and p["act"] in ("relu", "gelu")
                   for p in chosen)
    for t in trials(s):
        write(t, [1.0])
        end(t)
    controller.step(s.id)
    s.refresh_from_db()
    assert s.state == "COMPLETED"  # every trial (the grid's 4, or maxTrials) ran


@pytest.mark.django_db
def test_it_sets_only_that_jobs_argument_for_a_parameter_named_job_dot_arg() -> None:
    exp, _ = template()
    message = factories.work_unit_message()
    second = message.executable.jobset.jobs.add()
    second.CopyFrom(message.executable.jobset.jobs[0])
    second.name = "evaluator"
    op = wu_services.create_work_unit(exp.id, message)
    two = WorkUnit.objects.get(id=op.work_unit_id)
    s = study(exp, two, parameters={"trainer.lr": {"uniform": [0.1, 0.2]}, "seed": {"int": [1, 3]}})
    trial = controller.start_trials(s)[0]
    jobs = json_format.MessageToDict(controller.trial_request(s, trial))["executable"]["jobset"]["jobs"]
    trainer, evaluator = jobs
    assert "lr" in trainer["spec"]["args"] and "lr" not in evaluator["spec"].get("args", {})
    assert trainer["spec"]["args"]["seed"] == evaluator["spec"]["args"]["seed"] == str(trial.parameters["seed"])


@pytest.mark.django_db
def test_it_fails_a_trial_whose_unit_is_refused_with_the_reason_and_frees_its_slot() -> None:
    exp, unit = template()
    s = study(exp, unit, maxTrials=3, parallelTrials=1)
    Study.objects.filter(id=s.id).update(template={**s.template, "tags": ["x" * 300]})  # over the tag limit
    controller.step(s.id)
    controller.step(s.id)
    rows = trials(s)
    assert rows and all(t.state == "FAILED" and t.unit_done and t.work_unit_id is None for t in rows)
    assert "could not be created" in rows[0].message and "tags" in rows[0].message


@pytest.mark.django_db
def test_it_creates_a_trials_unit_for_the_studys_creator() -> None:
    exp, unit = template()
    s = study(exp, unit)
    controller.step(s.id)
    ops = Operation.objects.filter(work_unit__in=[t.work_unit_id for t in trials(s)], action_type="CREATE")
    assert ops.count() == 2 and set(ops.values_list("original_requester", flat=True)) == {s.creator}


@pytest.mark.django_db
def test_it_creates_no_unit_for_a_study_stopped_before_its_trials_had_units_and_stops_what_a_dead_step_made() -> None:
    exp, unit = template()
    s = study(exp, unit)
    first, second = controller.start_trials(s)  # the step died here: rows, no units ...
    wu_services.create_work_unit(exp.id, controller.trial_request(s, first), work_unit_id=first.wid)  # ... but one
    services.stop_study(exp.id, s.id)
    controller.step(s.id)
    tagged = WorkUnit.objects.filter(experiment=exp, tags__contains=[f"study:{s.id}"])
    assert list(tagged.values_list("wid", flat=True)) == [first.wid]  # no unit for the second trial
    assert state_of(first) == "STOPPING"
    second.refresh_from_db()
    assert second.state == "FAILED" and second.unit_done and second.work_unit_id is None
    end(first, "STOPPED")
    controller.step(s.id)
    s.refresh_from_db()
    assert s.state == "STOPPED"
