"""Every write of an Experiment row.

Called by the API (gRPC and REST), the admin and ``workunits.services`` (for
the roll-up, inside its own transaction). Public entry points open one
durable transaction each; ``apply_rollup`` runs inside the caller's.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

import orjson
from django.db import connection, transaction
from django.utils import timezone

from core import convert, db, pb

from core.errors import InvalidArgument, NotFound
from experiments import acl, rollup
from experiments.choices import ActiveState, LaunchState
from experiments.models import Experiment
from experiments.wire import EXPERIMENT_MUTABLE, experiment_fields

log = logging.getLogger(__name__)


def get_experiment(xid: int) -> Experiment:
    try:
        return Experiment.objects.get(id=xid)
    except Experiment.DoesNotExist:
        raise NotFound(f"experiments/{xid} not found", field="name") from None


def default_acls(creator: str) -> dict:
    return convert.to_json(pb.xid.XidAcls(owners=[pb.xid.XidAcls.Role(user=creator.lower())]))


def create_experiment(message: pb.experiment.Experiment, *, creator: str, now: datetime | None = None) -> Experiment:
    """CreateExperiment: the client's fields plus defaults for what it left out.

    The creator is the verified identity (never a field of the request); an
    empty request yields a NORMAL-priority experiment owned by its creator,
    ACTIVE and LAUNCHING.
    """
    if not creator:
        raise InvalidArgument("creator must be a verified identity", field="creator")
    now = now or timezone.now()
    fields = experiment_fields(
        message, [p for p in EXPERIMENT_MUTABLE if p not in ("priority", "acls")]
    )
    fields["priority"] = (
        convert.enum_name(pb.priority.Priority, message.priority, field="experiment.priority")
        if message.priority else "NORMAL"
    )
    has_acls = message.HasField("acls") and any(
        (message.acls.owners, message.acls.writers, message.acls.readers)
    )
    fields["acls"] = acl.normalize_acls(convert.to_json(message.acls) if has_acls else default_acls(creator))
    with transaction.atomic(durable=True):
        return Experiment.objects.create(
            creator=creator,
            create_time=now,
            update_time=now,
            status_update_time=now,
            active_state=ActiveState.ACTIVE,
            launch_state=LaunchState.LAUNCHING,
            **fields,
        )


def update_experiment(
    xid: int, message: pb.experiment.Experiment, paths: Sequence[str], *, now: datetime | None = None
) -> Experiment:
    """UpdateExperiment: replace the masked fields (repeated fields whole)."""
    if not paths:
        raise InvalidArgument("update_mask must name at least one field", field="update_mask")
    fields = experiment_fields(message, paths)  # validates before any write
    if "acls" in fields:
        fields["acls"] = acl.normalize_acls(fields["acls"])
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        exp = _lock(xid)
        for name, value in fields.items():
            setattr(exp, name, value)
        exp.update_time = now
        exp.save(update_fields=[*fields, "update_time"])
        return exp


def update_launch_state(xid: int, launch_state: int, *, now: datetime | None = None) -> Experiment:
    """UpdateExperimentLaunchState; the active state follows the new launch state."""
    name = convert.enum_name(pb.status.ExperimentStatus.LaunchState, launch_state, field="launch_state")
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        exp = _lock(xid)
        exp.launch_state = name
        exp.update_time = now
        apply_rollup(exp, state_moves=(), severity_moves=(), now=now, extra_fields=("launch_state", "update_time"))
        return exp


def _lock(xid: int) -> Experiment:
    try:
        return Experiment.objects.select_for_update(no_key=True).get(id=xid)
    except Experiment.DoesNotExist:
        raise NotFound(f"experiments/{xid} not found", field="name") from None


def apply_rollup(
    exp: Experiment,
    *,
    state_moves: Iterable[tuple[str | None, str | None]],
    severity_moves: Iterable[tuple[str | None, str | None]],
    now: datetime,
    extra_fields: Sequence[str] = (),
) -> None:
    """Fold work unit moves into a *locked* experiment and save it.

    ``state_moves`` are ``(old, new)`` current-execution states (``None`` for
    a work unit that did not exist); ``severity_moves`` the work units'
    highest current message severity before and after. Recomputes the active
    state; entering INACTIVE sets ``complete_time``, leaving it clears it.
    """
    exp.save(update_fields=fold_rollup(exp, state_moves=state_moves, severity_moves=severity_moves, now=now,
                                       extra_fields=extra_fields))


#: The columns ``fold_rollup`` reads and writes (``apply_rollups`` loads only these), in the
#: model's field order (what ``Model.from_db`` expects of a partial row).
_ROLLUP_FIELDS = tuple(
    f for f in Experiment._meta.concrete_fields
    if f.attname in {"id", "launch_state", "active_state", "child_state_counts", "message_severity_counts",
                     "complete_time", "last_child_status_update_time", "status_update_time"}
)
_ROLLUP_NAMES = [f.attname for f in _ROLLUP_FIELDS]
_ROLLUP_JSON_AT = [i for i, f in enumerate(_ROLLUP_FIELDS) if f.get_internal_type() == "JSONField"]

_ROLLUP_LOCK = f"""
SELECT {", ".join(f.column for f in _ROLLUP_FIELDS)} FROM {Experiment._meta.db_table}
WHERE id = ANY(%s::bigint[]) ORDER BY id FOR NO KEY UPDATE
"""


def _lock_for_rollup(xids: Iterable[int]) -> list[Experiment]:
    """Lock the experiment rows in xid order (always *after* their work units), loading the
    roll-up columns only, as partial ``Experiment`` instances.

    One prepared statement rather than an ORM query: the batch write runs
    this on every batch, and compiling the query cost more than the lock.
    """
    cursor = db.kept_cursor()  # kept by the connection: not closed here
    cursor.execute(_ROLLUP_LOCK, [db.int_array(sorted(set(xids)))])
    experiments = []
    for row in cursor.fetchall():
        values = list(row)
        for i in _ROLLUP_JSON_AT:  # the raw cursor returns JSON as text (Django decodes it per field)
            if isinstance(values[i], str):
                values[i] = orjson.loads(values[i])
        experiments.append(Experiment.from_db(connection.alias, _ROLLUP_NAMES, values))
    return experiments


_ROLLUP_UPDATE = f"""
UPDATE {Experiment._meta.db_table} AS x SET
    child_state_counts = v.child_state_counts,
    message_severity_counts = v.message_severity_counts,
    active_state = v.active_state,
    complete_time = v.complete_time,
    last_child_status_update_time = v.last_child_status_update_time,
    status_update_time = v.status_update_time
FROM jsonb_to_recordset(%s::jsonb) AS v(
    id bigint, child_state_counts jsonb, message_severity_counts jsonb, active_state text,
    complete_time timestamptz, last_child_status_update_time timestamptz, status_update_time timestamptz)
WHERE x.id = v.id
"""


def apply_rollups(
    moves: Mapping[int, tuple[Sequence[tuple[str | None, str | None]], Sequence[tuple[str | None, str | None]]]],
    *,
    now: datetime,
) -> None:
    """``apply_rollup`` for many experiments: lock them in xid order, fold, one UPDATE for all.

    ``moves`` maps an xid to its ``(state_moves, severity_moves)``. The batch
    write path (``workunits.services.update_work_unit_executions``) touches
    several experiments per batch; one ORM save each cost more than the
    rest of its roll-up. The rules are ``fold_rollup``'s, unchanged.
    """
    if not moves:
        return
    rows = []
    for exp in _lock_for_rollup(moves):
        state_moves, severity_moves = moves[exp.id]
        fold_rollup(exp, state_moves=state_moves, severity_moves=severity_moves, now=now)
        rows.append({
            "id": exp.id,
            "child_state_counts": exp.child_state_counts,
            "message_severity_counts": exp.message_severity_counts,
            "active_state": exp.active_state,
            "complete_time": exp.complete_time.isoformat() if exp.complete_time else None,
            "last_child_status_update_time": (
                exp.last_child_status_update_time.isoformat() if exp.last_child_status_update_time else None
            ),
            "status_update_time": exp.status_update_time.isoformat(),
        })
    if rows:
        # States arrive as choices (str subclasses), which orjson takes as keys only with this option.
        db.kept_cursor().execute(_ROLLUP_UPDATE, [orjson.dumps(rows, option=orjson.OPT_NON_STR_KEYS).decode()])


def fold_rollup(
    exp: Experiment,
    *,
    state_moves: Iterable[tuple[str | None, str | None]],
    severity_moves: Iterable[tuple[str | None, str | None]],
    now: datetime,
    extra_fields: Sequence[str] = (),
) -> list[str]:
    """`apply_rollup` without the save: fold the moves into ``exp``, return the fields to write.

    For a caller that writes the experiment row in a statement of its own
    (``workunits.services.create_work_unit`` folds it into its insert).
    """
    state_moves = list(state_moves)
    changed_states = any(old != new for old, new in state_moves)
    exp.child_state_counts = rollup.fold_counts(exp.child_state_counts, state_moves)
    exp.message_severity_counts = rollup.fold_counts(exp.message_severity_counts, severity_moves)
    new_active = rollup.active_state(exp.launch_state, exp.child_state_counts)
    if new_active != exp.active_state:
        if new_active == ActiveState.INACTIVE:
            exp.complete_time = now
        else:
            exp.complete_time = None
        log.info("experiment.active_state", extra={"xid": exp.id, "from": exp.active_state, "to": new_active})
        exp.active_state = new_active
    if changed_states:
        exp.last_child_status_update_time = now
    exp.status_update_time = now
    return [
        "child_state_counts", "message_severity_counts", "active_state", "complete_time",
        "last_child_status_update_time", "status_update_time", *extra_fields,
    ]
