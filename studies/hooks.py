"""Extension point of the studies app: who hears that a study's rows changed, without ``studies`` knowing them.

Apps above register into :data:`changed_hooks` in their ``AppConfig.ready()``
(the researcher's pages: ``ui.apps.UiConfig.ready`` registers
``ui.live.publish_study``, which tells the open study page to read its live
part again), so ``studies`` never imports them.

The controller and the services call :func:`on_changed` where a trial's row
(its state, its value: started, completed, failed, pruned) or the study's
(stop asked, ended) changes; the listeners run after that transaction
committed (``transaction.on_commit``: at once in autocommit, never for a
rolled-back change), so a page that reads on the message reads the committed
row. A failing listener is logged and never fails the controller.
"""
from __future__ import annotations

from django.db import transaction

from core.hooks import Hooks

#: Listeners ``(xid, study_id)``: the experiment and the study whose rows a committed change touched.
changed_hooks: Hooks[[int, int]] = Hooks("studies.changed_hook_failed")


def on_changed(xid: int, study_id: int) -> None:
    """Hand the change of study ``study_id`` (of experiment ``xid``) to the listeners once it committed."""
    if len(changed_hooks):
        transaction.on_commit(lambda: changed_hooks(xid, study_id))
