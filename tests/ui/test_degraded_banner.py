"""The pages say, quietly, when work waits for a worker past XMC_DEGRADED_AFTER_S (issue 38, item 2)."""
from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from tests import factories
from tests.ui.pages import signed_in
from ui import context
from workunits import services
from workunits.models import Operation

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_banner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(context, "_cached", (-1e9, 0.0))


def test_it_shows_no_banner_while_the_workers_keep_up() -> None:
    page = signed_in("rosa").get("/experiments").content.decode()
    assert 'class="degraded"' not in page


def test_it_shows_the_banner_past_the_threshold_and_clears_it_when_the_work_is_done(settings: Any) -> None:
    settings.XMC_DEGRADED_AFTER_S = 120
    exp = factories.experiment(creator="rosa@example.com")
    create = services.create_work_unit(exp.id, factories.work_unit_message()).id
    Operation.objects.filter(id=create).update(create_time=timezone.now() - timedelta(minutes=4, seconds=5))
    rosa = signed_in("rosa")
    page = rosa.get("/experiments").content.decode()
    assert '<p class="degraded" role="status">work is waiting for a worker: oldest 4 min</p>' in page
    services.complete_operation(create)  # the worker is back
    context._cached = (-1e9, 0.0)  # past the banner's 5 s cache
    assert 'class="degraded"' not in rosa.get("/experiments").content.decode()


def test_it_waits_for_the_threshold(settings: Any) -> None:
    settings.XMC_DEGRADED_AFTER_S = 600
    exp = factories.experiment(creator="rosa@example.com")
    create = services.create_work_unit(exp.id, factories.work_unit_message()).id
    Operation.objects.filter(id=create).update(create_time=timezone.now() - timedelta(minutes=4))
    assert 'class="degraded"' not in signed_in("rosa").get("/experiments").content.decode()


def test_it_says_which_process_is_down_while_dev_run_restarts_it(settings: Any, tmp_path: Any) -> None:
    """scripts/run_all.py keeps down.json in the run folder while a process waits for its restart."""
    settings.XMC_RUN_DIR = str(tmp_path)
    rosa = signed_in("rosa")
    assert 'class="degraded"' not in rosa.get("/experiments").content.decode()
    (tmp_path / "down.json").write_text(json.dumps({"reconciler": {"since": time.time() - 12, "log": "x"}}))
    page = rosa.get("/experiments").content.decode()
    assert re.search(r'<p class="degraded" role="status">the reconciler is not running \(for 1[2-9] s; ./dev run is '
                     r"starting it again\): states shown here are not updated until it is back</p>", page), page[-800:]
    (tmp_path / "down.json").write_text("{}")
    assert 'class="degraded"' not in rosa.get("/experiments").content.decode()
