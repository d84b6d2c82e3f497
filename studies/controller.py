"""The study controller: one idempotent step of a study, run for each outbox message.

`step` re-reads the world and moves the study forward; running it twice, or two
copies at once, does what one run does:

1. **Ended units.** A trial whose unit ended frees its slot (``unit_done``); a
   RUNNING trial becomes COMPLETED with the objective (the metric's stat of the
   unit's execution) or FAILED (the unit failed or was stopped, or wrote no value).
2. **Pruning.** The objective's new points of each running trial are copied into
   the trial (``intermediate``), and the study's pruner (`studies.search.should_prune`)
   decides; a pruned trial is PRUNED (conditional update) and its unit is stopped.
3. **New trials.** Under the study row's lock, while fewer than ``parallel_trials``
   units are open and fewer than ``max_trials`` trials exist, the sampler chooses
   the next parameters and a trial row is written with its number (unique per study)
   and a wid reserved in the experiment in the same transaction.
4. **Units.** Each trial without its unit gets it from
   ``workunits.services.create_work_unit`` with the reserved wid: idempotent on
   ``(xid, wid)``, so a step that died after the create is repeated harmlessly.
5. **Stops.** Any unit of a trial that is no longer RUNNING (pruned, or the study
   stopped) and has not ended is stopped through ``workunits.services.stop_work_units``.
6. **The end.** With ``max_trials`` trials (or ``:stop``) and every unit ended, the
   study is COMPLETED (or STOPPED).

Steps are asked for by `studies.doorbell.ring`: on create and stop, when a trial's
unit changes state or writes points (`on_transitions_committed`, `on_points_written`),
and by the beat's `tick` for every running study. See docs/architecture/studies.md.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from google.protobuf import json_format

from core import pb
from core.errors import FailedPrecondition, InvalidArgument, NotFound
from experiments.models import Experiment
from metrics.models import MetricPoint, MetricSummary
from studies import doorbell, hooks, search
from studies.models import Study, StudyState, Trial, TrialState
from workunits import services as workunit_services
from workunits.choices import TERMINAL, WorkUnitState
from workunits.models import WorkUnit, WorkUnitExecution

log = logging.getLogger(__name__)

#: Tags every trial's unit carries (besides the template's): the study and the trial number.
STUDY_TAG = "study:{study}"
TRIAL_TAG = "trial:{number}"


def step(study_id: int) -> None:
    """Move study ``study_id`` forward once (idempotent; safe to run concurrently)."""
    study = Study.objects.filter(id=study_id).first()
    if study is None or study.state != StudyState.RUNNING:
        return
    finish_ended_units(study)
    if study.stop_requested:
        fail_running(study, "stopped with the study")
    else:
        prune(study)
    create_units(study)
    if not study.stop_requested:
        start_trials(study)
        create_units(study)
    stop_abandoned_units(study)
    end_if_done(study)


def requester_of(study: Study) -> workunit_services.Requester:
    """Whom a study's creates and stops are recorded for (the operations' requester): its creator."""
    return workunit_services.Requester(email=study.creator or "system")


# --- 1. Ended units ------------------------------------------------------------------------------


def _open_trials(study: Study) -> list[Trial]:
    return list(Trial.objects.filter(study_id=study.id, unit_done=False).select_related("work_unit")
                .order_by("number"))


def _current_executions(trials: Sequence[Trial]) -> dict[int, WorkUnitExecution]:
    """trial id -> its unit's current execution (trials whose unit exists)."""
    units = {t.work_unit_id: t for t in trials if t.work_unit_id is not None}
    rows = WorkUnitExecution.objects.filter(work_unit_id__in=list(units), eid=F("work_unit__current_eid"))
    return {units[ex.work_unit_id].id: ex for ex in rows}


def objective_of(study: Study, trial: Trial, execution: WorkUnitExecution) -> float | None:
    row = MetricSummary.objects.filter(work_unit_id=trial.work_unit_id, eid=execution.eid,
                                       metric=study.metric).values(study.stat).first()
    return None if row is None else float(row[study.stat])


def finish_ended_units(study: Study) -> None:
    trials = _open_trials(study)
    executions = _current_executions(trials)
    now = timezone.now()
    for trial in trials:
        ex = executions.get(trial.id)
        if ex is None or ex.state not in TERMINAL:
            continue
        if trial.state == TrialState.RUNNING:
            read_points(study, trial, ex)
            value = objective_of(study, trial, ex) if ex.state == WorkUnitState.COMPLETED else None
            if value is not None:
                fields: dict[str, Any] = {"state": TrialState.COMPLETED, "value": value}
            elif ex.state == WorkUnitState.COMPLETED:
                fields = {"state": TrialState.FAILED, "message": f"the unit completed without a value of {study.metric}"}
            else:
                fields = {"state": TrialState.FAILED, "message": f"the unit ended {ex.state}"}
            if Trial.objects.filter(id=trial.id, state=TrialState.RUNNING).update(end_time=now, **fields):
                hooks.on_changed(study.experiment_id, study.id)
            log.info("study.trial_ended", extra={"study": study.id, "trial": trial.number, "state": fields["state"],
                                                 "value": fields.get("value"), "why": fields.get("message", "")})
        Trial.objects.filter(id=trial.id).update(unit_done=True)


def fail_running(study: Study, message: str) -> None:
    if Trial.objects.filter(study_id=study.id, state=TrialState.RUNNING).update(
            state=TrialState.FAILED, message=message, end_time=timezone.now()):
        hooks.on_changed(study.experiment_id, study.id)


# --- 2. Pruning ----------------------------------------------------------------------------------


def read_points(study: Study, trial: Trial, execution: WorkUnitExecution) -> bool:
    """Copy the objective's points the trial has not seen into ``intermediate``; True when any was new."""
    seen = trial.intermediate or {}
    last = max((int(k) for k in seen), default=-(2**62))
    rows = list(MetricPoint.objects.filter(execution_id=execution.id, metric=study.metric, step__gt=last)
                .order_by("step", "time").values_list("step", "value"))
    if not rows:
        return False
    merged = dict(seen)
    for number, value in rows:
        merged[str(number)] = value
    Trial.objects.filter(id=trial.id, state=TrialState.RUNNING).update(intermediate=merged)
    trial.intermediate = merged
    return True


def past_trials(study: Study, *, with_steps: bool) -> list[search.PastTrial]:
    fields = ["number", "state", "parameters", "value", "system_attrs"] + (["intermediate"] if with_steps else [])
    return [search.PastTrial(number=row["number"], state=row["state"], parameters=row["parameters"],
                             value=row["value"], intermediate=row.get("intermediate") or {},
                             system_attrs=row["system_attrs"] or {})
            for row in Trial.objects.filter(study_id=study.id).order_by("number").values(*fields)]


def prune_message(study: Study, verdict: search.Verdict) -> str:
    kind = next(iter(study.pruner or {"": {}}))
    if kind == "median" and verdict.reference is not None:
        side = "above" if study.goal == "MINIMIZE" else "below"
        return (f"pruned by study {study.id} at step {verdict.step}: {study.metric} {verdict.value:.4g} "
                f"{side} the median {verdict.reference:.4g}")
    return f"pruned by study {study.id} at step {verdict.step}: {study.metric} {verdict.value:.4g} ({kind})"


def prune(study: Study) -> None:
    trials = [t for t in _open_trials(study) if t.state == TrialState.RUNNING]
    if not trials:
        return
    executions = _current_executions(trials)
    fresh = [t for t in trials if t.id in executions and read_points(study, t, executions[t.id])]
    if not fresh or not study.pruner:
        return
    past = past_trials(study, with_steps=True)
    for trial in fresh:
        mine = next(p for p in past if p.number == trial.number)
        verdict = search.should_prune(study.parameters, study.goal, study.pruner, past, mine)
        if verdict is None:
            continue
        if not verdict.prune:
            if verdict.system_attrs != (trial.system_attrs or {}):
                Trial.objects.filter(id=trial.id, state=TrialState.RUNNING).update(system_attrs=verdict.system_attrs)
            continue
        message = prune_message(study, verdict)
        if Trial.objects.filter(id=trial.id, state=TrialState.RUNNING).update(
                state=TrialState.PRUNED, pruned_at_step=verdict.step, message=message,
                system_attrs=verdict.system_attrs, end_time=timezone.now()):
            hooks.on_changed(study.experiment_id, study.id)
            log.info("study.trial_pruned", extra={"study": study.id, "trial": trial.number, "why": message})


# --- 5. Stops ------------------------------------------------------------------------------------


def stop_abandoned_units(study: Study) -> None:
    """Stop the unit of every open trial that is no longer RUNNING (pruned, failed by a stop)."""
    trials = [t for t in _open_trials(study) if t.state != TrialState.RUNNING and t.work_unit_id is not None]
    executions = _current_executions(trials)
    for trial in trials:
        ex = executions.get(trial.id)
        if ex is None or ex.state in TERMINAL or ex.state == WorkUnitState.STOPPING:
            continue
        _stop(study, trial)


def _stop(study: Study, trial: Trial) -> None:
    try:
        workunit_services.stop_work_units(study.experiment_id, [trial.wid], batch=False,
                                          message=trial.message, requester=requester_of(study))
    except (FailedPrecondition, NotFound):  # ended meanwhile, or deleted: nothing to stop
        pass


# --- 3. New trials -------------------------------------------------------------------------------


def _reserve_wid(xid: int) -> int:
    """The next wid of experiment ``xid``, taken (``last_wid`` bumped) in the caller's transaction."""
    exp = Experiment.objects.select_for_update().only("id", "last_wid").get(id=xid)
    exp.last_wid += 1
    exp.save(update_fields=["last_wid"])
    return exp.last_wid


def start_trials(study: Study) -> list[Trial]:
    """Write the trials that fit (free slots, numbers left); each in its own short transaction."""
    started: list[Trial] = []
    while True:
        with transaction.atomic():
            locked = Study.objects.select_for_update().get(id=study.id)
            if locked.state != StudyState.RUNNING or locked.stop_requested:
                return started
            total = Trial.objects.filter(study_id=study.id).count()
            open_units = Trial.objects.filter(study_id=study.id, unit_done=False).count()
            if total >= locked.max_trials or open_units >= locked.parallel_trials:
                return started
            if locked.sampler == "grid" and total >= search.grid_size(locked.parameters):
                return started
            choice = search.next_trial(locked.parameters, locked.goal, locked.sampler, locked.seed,
                                       past_trials(locked, with_steps=False))
            trial = Trial.objects.create(study=locked, number=total, wid=_reserve_wid(locked.experiment_id),
                                         parameters=choice.parameters, system_attrs=choice.system_attrs,
                                         create_time=timezone.now())
            hooks.on_changed(study.experiment_id, study.id)  # sent when this transaction commits
            log.info("study.trial_started", extra={"study": study.id, "trial": trial.number, "wid": trial.wid})
            started.append(trial)


# --- 4. Units ------------------------------------------------------------------------------------


def argument_text(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def trial_request(study: Study, trial: Trial) -> pb.work_unit.WorkUnit:
    """The template's create request with the trial's arguments merged into every job's args (a name
    ``job.arg`` sets only that job's), tagged with the study and the trial number."""
    template = study.template
    executable = json_format.ParseDict(template.get("executable") or {}, pb.work_unit.Executable())
    jobs = list(executable.jobset.jobs)
    for name, value in trial.parameters.items():
        targets = [j for j in jobs if name.startswith(f"{j.name}.")] if len(jobs) > 1 else []
        for job in targets or jobs:
            key = name[len(job.name) + 1:] if targets else name
            job.spec.args[key] = argument_text(value)
    message = pb.work_unit.WorkUnit(executable=executable, notes=template.get("notes") or "",
                                    tags=[*(template.get("tags") or []), STUDY_TAG.format(study=study.id),
                                          TRIAL_TAG.format(number=trial.number)])
    if template.get("priority"):
        message.priority = pb.priority.Priority.Value(template["priority"])
    if template.get("workUnitType"):
        message.work_unit_type = pb.work_unit.WorkUnit.WorkUnitType.Value(template["workUnitType"])
    return message


def create_units(study: Study) -> None:
    """Create the unit of every RUNNING trial that has none yet (idempotent on the reserved wid). A trial
    that ended before its unit was made (the study stopped) gets none; one a dead step did make is linked,
    and stopped by `stop_abandoned_units`."""
    for trial in Trial.objects.filter(study_id=study.id, work_unit__isnull=True, unit_done=False).order_by("number"):
        if trial.state != TrialState.RUNNING:
            made = WorkUnit.objects.filter(experiment_id=study.experiment_id, wid=trial.wid).values_list("id", flat=True)
            if made:
                Trial.objects.filter(id=trial.id, work_unit__isnull=True).update(work_unit_id=made[0])
            else:
                Trial.objects.filter(id=trial.id, work_unit__isnull=True).update(unit_done=True)
            continue
        try:
            op = workunit_services.create_work_unit(study.experiment_id, trial_request(study, trial),
                                                    work_unit_id=trial.wid, requester=requester_of(study))
        except (InvalidArgument, FailedPrecondition, NotFound) as exc:
            # Refused for good (the template's request no longer passes validation, the experiment went):
            # the trial fails with the reason, its slot is free; retrying would only dead-letter the step.
            if Trial.objects.filter(id=trial.id, work_unit__isnull=True).update(
                    state=TrialState.FAILED, unit_done=True, end_time=timezone.now(),
                    message=f"its work unit could not be created: {exc}"[:10_000]):
                hooks.on_changed(study.experiment_id, study.id)
            continue
        unit_id = op.work_unit_id or WorkUnit.objects.get(experiment_id=study.experiment_id, wid=trial.wid).id
        Trial.objects.filter(id=trial.id, work_unit__isnull=True).update(work_unit_id=unit_id)
        trial.refresh_from_db()
        if trial.state != TrialState.RUNNING and trial.unit_done:
            # A concurrent step ended the trial while this one created its unit (and, seeing none, freed
            # the slot): the unit must not run on unseen.
            _stop(study, trial)


# --- 6. The end ----------------------------------------------------------------------------------


def end_if_done(study: Study) -> None:
    with transaction.atomic():
        locked = Study.objects.select_for_update().get(id=study.id)
        if locked.state != StudyState.RUNNING:
            return
        trials = Trial.objects.filter(study_id=study.id)
        if trials.filter(unit_done=False).exists():
            return
        if locked.stop_requested:
            final = StudyState.STOPPED
        elif trials.count() >= locked.max_trials or (
                locked.sampler == "grid" and trials.count() >= search.grid_size(locked.parameters)):
            final = StudyState.COMPLETED
        else:
            return
        now = timezone.now()
        Study.objects.filter(id=study.id).update(state=final, end_time=now, update_time=now)
        hooks.on_changed(study.experiment_id, study.id)  # sent when this transaction commits
        log.info("study.ended", extra={"study": study.id, "state": final})


# --- Who rings ------------------------------------------------------------------------------------


def tick() -> int:
    """Ring every running study that has no step waiting (the beat's periodic pass); how many."""
    running = list(Study.objects.filter(state=StudyState.RUNNING).values_list("id", flat=True))
    waiting = doorbell.pending(running)
    for study_id in running:
        if study_id not in waiting:
            doorbell.ring(study_id, committed=True)
    return len(running) - len(waiting)


def _ring_studies_of(which: Q) -> None:
    ids = set(Trial.objects.filter(which, unit_done=False, study__state=StudyState.RUNNING)
              .values_list("study_id", flat=True))
    if not ids:
        return
    for study_id in ids - doorbell.pending(list(ids)):
        doorbell.ring(study_id, committed=True)


def on_points_written(written: Mapping[int, int]) -> None:
    """Trials' units wrote points: their studies step (the pruner hears of them). One query for the
    whole write, however many executions it wrote to, when they are no trial's
    (``workunits.hooks``/``metrics.hooks`` listeners must be cheap)."""
    _ring_studies_of(Q(work_unit__executions__id__in=list(written)))


def on_transitions_committed(transitions: Sequence[Any]) -> None:
    """A trial's unit ended: its study steps (the slot is free, the trial completes)."""
    ended = [(t.xid, t.wid) for t in transitions if t.new_state in TERMINAL]
    if not ended:
        return
    condition = Q()
    for xid, wid in ended:
        condition |= Q(study__experiment_id=xid, wid=wid)
    _ring_studies_of(condition)
