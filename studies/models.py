"""A study (an experiment's hyperparameter search) and its trials: the only truth of the search.

Optuna never keeps state of its own: every decision rebuilds an in-memory
Optuna study from these rows (`studies.search`), see docs/architecture/studies.md.
"""
from __future__ import annotations

from django.db import models


class StudyState(models.TextChoices):
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    STOPPED = "STOPPED"


class TrialState(models.TextChoices):
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    PRUNED = "PRUNED"
    FAILED = "FAILED"


class Goal(models.TextChoices):
    MINIMIZE = "MINIMIZE"
    MAXIMIZE = "MAXIMIZE"


class Study(models.Model):
    experiment = models.ForeignKey("experiments.Experiment", on_delete=models.CASCADE, related_name="studies")
    #: The wid the study was cloned from, and what of it each trial copies (proto3 JSON of a
    #: ``WorkUnit`` create request: executable, priority, type, tags, notes), taken at creation.
    template_wid = models.BigIntegerField()
    template = models.JSONField(default=dict)
    #: ``name -> {"logUniform"|"uniform"|"int"|"choice": [...]}`` as the request gave it (validated).
    parameters = models.JSONField(default=dict)
    metric = models.CharField(max_length=256)
    stat = models.CharField(max_length=16, default="last")
    goal = models.CharField(max_length=8, choices=Goal.choices)
    max_trials = models.IntegerField()
    parallel_trials = models.IntegerField()
    sampler = models.CharField(max_length=16, default="tpe")
    #: ``{"median": {...}}`` or ``{"successiveHalving": {...}}``, or null (no pruning).
    pruner = models.JSONField(null=True, blank=True)
    #: Seeds every sampler the study builds (the n-th decision uses seed + n): reproducible.
    seed = models.BigIntegerField(default=0)
    state = models.CharField(max_length=16, choices=StudyState.choices, default=StudyState.RUNNING)
    #: ``:stop`` was asked: the controller stops the running trials and ends the study STOPPED.
    stop_requested = models.BooleanField(default=False)
    creator = models.CharField(max_length=320, blank=True, default="")
    create_time = models.DateTimeField()
    update_time = models.DateTimeField()
    end_time = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["experiment", "-id"], name="study_experiment_id"),
            models.Index(fields=["state"], name="study_state", condition=models.Q(state="RUNNING")),
        ]

    @property
    def name(self) -> str:
        return f"experiments/{self.experiment_id}/studies/{self.id}"


class Trial(models.Model):
    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="trials")
    #: 0, 1, 2, ... in the order the sampler chose them; at most one row per number.
    number = models.IntegerField()
    #: Reserved in the experiment when the trial was chosen (``last_wid`` bumped in the same transaction),
    #: so creating its work unit is idempotent on ``(xid, wid)``: never two units for one trial.
    wid = models.BigIntegerField()
    #: Set once the create of the unit has returned (until then the controller creates it again: idempotent).
    work_unit = models.ForeignKey("workunits.WorkUnit", on_delete=models.SET_NULL, null=True, blank=True,
                                  related_name="study_trials")
    state = models.CharField(max_length=16, choices=TrialState.choices, default=TrialState.RUNNING)
    #: ``name -> value`` the sampler chose (numbers as numbers, choices as given).
    parameters = models.JSONField(default=dict)
    #: The objective at the end (the metric's ``stat`` of the unit's execution); null until then.
    value = models.FloatField(null=True, blank=True)
    #: ``{"step": value}`` of the objective metric as the controller read them (what the pruner saw).
    intermediate = models.JSONField(default=dict)
    #: What Optuna's pruner wrote on the trial (successive halving's rungs), kept between decisions.
    system_attrs = models.JSONField(default=dict)
    pruned_at_step = models.BigIntegerField(null=True, blank=True)
    message = models.TextField(blank=True, default="")
    #: The unit has ended (or will never run): its slot is free. A pruned trial's unit holds its slot
    #: until it has stopped, so at most ``parallel_trials`` units run at any moment.
    unit_done = models.BooleanField(default=False)
    create_time = models.DateTimeField()
    end_time = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["study", "number"], name="trial_number_once"),
        ]
        indexes = [
            models.Index(fields=["study", "unit_done"], name="trial_open",
                         condition=models.Q(unit_done=False)),
        ]
