"""Builders shared by the pages' tests (tests/ui, tests/system/browser): people and experiments.

People are real Django users (the site's session login); experiments and
work units come from the real services (``tests.factories``).
"""
from __future__ import annotations

import time

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from core import pb
from tests import factories
from tests.fixtures.people import PASSWORD as PASSWORD  # the one password, for the pages that type it
from tests.fixtures.people import new_user, sign_in
from workunits import hooks, services
from workunits.models import WorkUnit
from workunits.state import ExecutionUpdate

HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(2)>"


def person(name: str) -> User:
    """A new person ``name`` (``<name>@example.com``, :data:`PASSWORD`): tests/fixtures/people.py's one way."""
    user: User = new_user(name)
    return user


def signed_in(name: str, client: Any = None) -> Any:
    """A Django test client signed in through the site's session login as a new person ``name``."""
    person(name)
    return sign_in(name, client)


def shared_with(reader: str) -> Any:
    return pb.xid.XidAcls(readers=[pb.xid.XidAcls.Role(user=reader)])


def sweep(creator: str, title: str = "lr sweep", lrs: tuple[str, ...] = ("0.1", "0.01", "0.001"),
          **experiment_kw: Any) -> tuple[Any, list[Any]]:
    """An experiment with one work unit per learning rate; ``batch`` is the same everywhere."""
    exp = factories.experiment(creator=creator, title=title, **experiment_kw)
    units = []
    for lr in lrs:
        message = factories.work_unit_message()
        message.executable.jobset.jobs[0].spec.args["lr"] = lr
        message.executable.jobset.jobs[0].spec.args["batch"] = "64"
        op = services.create_work_unit(exp.id, message, work_unit_id=0)
        units.append(WorkUnit.objects.get(id=op.work_unit_id))
    return exp, units


#: The newest state time ``move`` wrote: each change is stamped after the one before (the guards drop older ones).
_last = [timezone.now()]


def last_time() -> Any:
    """The time of the last `move` (they are a second apart and may run ahead of the clock)."""
    return _last[0]


def move(xid: int, wid: int, eid: int, *states: str, publish: bool = True) -> float:
    """Commit state changes as the reconciler does, then hand the transitions to the committed hooks.

    Returns the moment (``time.time()``, the clock a page's ``Date.now()`` reads) the last one committed: a
    page's "within N s" counts from it."""
    committed = 0.0
    for state in states:
        at = _last[0] = max(timezone.now(), _last[0] + timedelta(seconds=1))
        transitions = services.update_work_unit_executions(
            [ExecutionUpdate(xid=xid, wid=wid, eid=eid, mask=("status.state",), state=state,
                             state_update_time_ns=int(at.timestamp() * 1e9))],
            now=at,
        )
        committed = time.time()
        if publish:
            hooks.on_transitions_committed(transitions)
    return committed
