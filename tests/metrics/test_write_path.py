"""``POST .../metrics:write``: who may write, what a bad point gets, replays, the token's lifetime."""
from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from django.test import Client
from django.utils import timezone

from metrics import tokens
from metrics.models import MetricPoint
from tests import factories
from tests.metrics.conftest import experiment_for, fresh_write_buckets
from workunits.models import WorkUnit, WorkUnitExecution
from xmc.auth.tokens import issue_token

pytestmark = pytest.mark.django_db

ALICE, BOB, EVE = "alice@example.com", "bob@example.com", "eve@example.com"


def _post(xid: int, wid: int, body: Any, token: str) -> Any:
    raw = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return Client().post(f"/v1/experiments/{xid}/workUnits/{wid}/metrics:write", raw,
                         content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")


@pytest.fixture
def unit() -> WorkUnit:
    exp = experiment_for(ALICE, readers=(BOB,))
    return factories.work_unit(exp, wid=1)


def _points(**filters: Any) -> list[tuple[str, int, float]]:
    return list(MetricPoint.objects.filter(**filters).order_by("metric", "step").values_list("metric", "step", "value"))


def test_it_writes_points_with_the_executions_token_and_a_replay_adds_nothing(unit: WorkUnit) -> None:
    token = tokens.token_for(unit.experiment_id, 1, 1)
    body = {"points": [{"metric": "loss", "step": 10, "value": 0.5, "time": "2026-12-01T10:00:00Z"},
                       {"metric": "loss", "step": "11", "value": 0.25}, {"metric": "acc", "step": 10, "value": 1}]}
    first = _post(unit.experiment_id, 1, body, token)
    assert first.status_code == 200, first.content
    assert first.json() == {"written": 3, "duplicates": 0}
    again = _post(unit.experiment_id, 1, body, token)
    assert again.json() == {"written": 0, "duplicates": 3}
    assert _points() == [("acc", 10, 1.0), ("loss", 10, 0.5), ("loss", 11, 0.25)]
    stamped = MetricPoint.objects.get(metric="loss", step=10).time
    assert stamped.isoformat() == "2026-12-01T10:00:00+00:00"


@pytest.mark.parametrize("point,field", [
    ({"metric": "", "step": 1, "value": 1}, "points[0].metric"),
    ({"metric": "x", "step": 1, "value": "NaN"}, "points[0].value"),
    ({"metric": "x", "step": 1, "value": True}, "points[0].value"),
    ({"metric": "x", "step": 2**64, "value": 1}, "points[0].step"),
    ({"metric": "x", "step": "one", "value": 1}, "points[0].step"),
    ({"metric": "x", "step": 1, "value": 1, "time": "yesterday"}, "points[0].time"),
    ({"metric": "x", "step": 1, "value": 1, "time": "2026-12-01T10:00:00"}, "points[0].time"),
    ({"metric": "x" * 300, "step": 1, "value": 1}, "points[0].metric"),
    ({"metric": "x", "step": 1, "value": 1, "extra": 1}, "points[0]"),
])
def test_it_answers_a_bad_point_with_a_400_naming_it(unit: WorkUnit, point: dict[str, Any], field: str) -> None:
    response = _post(unit.experiment_id, 1, {"points": [point]}, tokens.token_for(unit.experiment_id, 1, 1))
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT"
    assert error["details"][0]["fieldViolations"][0]["field"] == field
    assert not _points()


def test_it_refuses_empty_oversized_and_garbled_bodies(unit: WorkUnit, settings: Any) -> None:
    token = tokens.token_for(unit.experiment_id, 1, 1)
    settings.XMC_METRICS_MAX_POINTS = 3
    for body in ({"points": []}, {"points": [{"metric": "m", "step": i, "value": 1} for i in range(4)]}, b"{", "[1]",
                 b"[" * 100000):
        response = _post(unit.experiment_id, 1, body, token)
        assert response.status_code == 400, response.content
        assert response.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_it_refuses_tokens_of_other_executions_forged_tokens_and_users_without_rights(unit: WorkUnit) -> None:
    xid = unit.experiment_id
    other = factories.work_unit(unit.experiment, wid=2)
    body = {"points": [{"metric": "m", "step": 1, "value": 1}]}
    assert _post(xid, 1, body, tokens.token_for(xid, 2, 1)).status_code == 403  # another work unit's
    assert _post(xid, 1, {**body, "executionId": "2"}, tokens.token_for(xid, 1, 1)).status_code == 403
    forged = tokens.token_for(xid, 1, 1)[:-2] + "AA"
    assert _post(xid, 1, body, forged).status_code == 401
    assert _post(xid, 1, body, "not-a-token").status_code == 401
    assert _post(xid, 1, body, issue_token(BOB)).status_code == 403  # a reader may not write
    assert _post(xid, 1, body, issue_token(EVE)).status_code == 403
    assert not _points()
    # The owner's own token writes into the current execution.
    response = _post(xid, 2, body, issue_token(ALICE))
    assert response.status_code == 200, response.content
    assert MetricPoint.objects.get().execution == WorkUnitExecution.objects.get(work_unit=other, eid=1)


def test_it_stops_taking_the_token_after_its_execution_ended_and_the_grace(unit: WorkUnit, settings: Any) -> None:
    settings.XMC_METRICS_TOKEN_GRACE_S = 60
    token = tokens.token_for(unit.experiment_id, 1, 1)
    body = {"points": [{"metric": "m", "step": 1, "value": 1}]}
    ended = timezone.now()
    WorkUnitExecution.objects.filter(work_unit=unit, eid=1).update(state="COMPLETED", complete_time=ended)
    with time_machine.travel(ended + timedelta(seconds=30)):
        assert _post(unit.experiment_id, 1, body, token).status_code == 200
    with time_machine.travel(ended + timedelta(seconds=61)):
        response = _post(unit.experiment_id, 1, {"points": [{"metric": "m", "step": 2, "value": 1}]}, token)
    assert response.status_code == 403
    assert "no longer writes" in response.json()["error"]["message"]


def test_it_gives_every_execution_its_own_token() -> None:
    assert tokens.verify(tokens.token_for(1, 2, 3)) == tokens.ExecutionKey(1, 2, 3)
    assert tokens.token_for(1, 2, 3) != tokens.token_for(1, 2, 4)
    assert tokens.verify(tokens.token_for(1, 2, 3).replace(".3.", ".4.")) is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12)
    | st.sampled_from(["NaN", "Infinity", "2026-12-01T10:00:00Z", "9999-12-31T23:59:59+23:59", "\x00", "x" * 300]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["points", "executionId", "metric", "step", "value", "time", "other"]), inner, max_size=4),
    max_leaves=12,
)
POINT = st.fixed_dictionaries({}, optional={"metric": JSON, "step": JSON, "value": JSON, "time": JSON})


def test_it_never_answers_500_to_any_body(unit: WorkUnit) -> None:
    """Fuzz: generated bodies (and points) with the execution's token or the owner's are never a 500."""
    token = tokens.token_for(unit.experiment_id, 1, 1)
    owner = issue_token(ALICE)

    @hsettings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(JSON, st.fixed_dictionaries({"points": st.lists(POINT, max_size=3)},
                                                 optional={"executionId": JSON})), st.booleans())
    def one(body: Any, as_owner: bool) -> None:
        try:
            raw = json.dumps(body, allow_nan=True)
        except (ValueError, OverflowError):
            return
        response = _post(unit.experiment_id, 1, raw, owner if as_owner else token)
        assert response.status_code < 500, (raw[:300], response.content[:300])

    one()


@pytest.mark.parametrize("bad,field", [
    ({"value": "x"}, "points[5].value"),
    ({"value": 10**400}, "points[5].value"),
    ({"time": "yesterday"}, "points[5].time"),
    ({"step": 2**64}, "points[5].step"),
    ({"metric": ""}, "points[5].metric"),
    ({"metric": ["loss"]}, "points[5].metric"),
    ({"other": 1}, "points[5]"),
])
def test_it_names_a_bad_point_after_good_ones_as_before(unit: WorkUnit, bad: dict[str, Any], field: str) -> None:
    """The fast path (metric and time already checked in this body) still names the bad point."""
    good = {"metric": "loss", "step": 1, "value": 0.5, "time": "2026-12-01T10:00:00Z"}
    body = {"points": [{**good, "step": i} for i in range(5)] + [{**good, "step": 5, **bad}]}
    response = _post(unit.experiment_id, 1, json.dumps(body), tokens.token_for(unit.experiment_id, 1, 1))
    assert response.status_code == 400, response.content
    assert response.json()["error"]["details"][0]["fieldViolations"][0]["field"] == field
    assert not _points()


def test_it_gives_the_same_answers_to_what_the_fast_json_parser_refuses(unit: WorkUnit) -> None:
    """NaN literals and huge integers (orjson refuses them) go through the standard library: the same 400s."""
    token = tokens.token_for(unit.experiment_id, 1, 1)
    nan = '{"points": [{"metric": "m", "step": 1, "value": 1}, {"metric": "m", "step": 2, "value": NaN}]}'
    response = _post(unit.experiment_id, 1, nan, token)
    assert response.status_code == 400
    assert response.json()["error"]["details"][0]["fieldViolations"][0]["field"] == "points[1].value"
    huge = '{"points": [{"metric": "m", "step": 1' + "0" * 30 + ', "value": 1}]}'
    response = _post(unit.experiment_id, 1, huge, token)
    assert response.json()["error"]["details"][0]["fieldViolations"][0]["field"] == "points[0].step"
    ok = '{"points": [{"metric": "m", "step": 1, "value": 1, "time": "2026-12-01T10:00:00Z"}]}'
    assert _post(unit.experiment_id, 1, ok.encode(), token).json() == {"written": 1, "duplicates": 0}


def test_it_answers_429_with_retry_after_to_an_execution_writing_too_often_and_others_still_write(
        unit: WorkUnit, settings: Any) -> None:
    """A bucket of XMC_METRICS_WRITES_BURST calls per execution, refilled at XMC_METRICS_WRITES_PER_S
    (here one that never refills in the test's time): the call over it writes nothing."""
    settings.XMC_METRICS_WRITES_PER_S, settings.XMC_METRICS_WRITES_BURST = 0.001, 3
    other = factories.work_unit(unit.experiment, wid=2)
    fresh_write_buckets(unit, other)
    token = tokens.token_for(unit.experiment_id, 1, 1)
    for step in range(3):
        assert _post(unit.experiment_id, 1, {"points": [{"metric": "m", "step": step, "value": 1}]}, token).status_code == 200
    refused = _post(unit.experiment_id, 1, {"points": [{"metric": "m", "step": 9, "value": 1}]}, token)
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert refused.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert "XMC_METRICS_WRITES_PER_S" in refused.json()["error"]["message"]
    assert [s for _, s, _ in _points(execution__work_unit=unit)] == [0, 1, 2]  # the refused point is not written
    # A user token writing the same execution shares its budget; another execution has its own.
    owner = issue_token(ALICE)
    assert _post(unit.experiment_id, 1, {"points": [{"metric": "m", "step": 9, "value": 1}]}, owner).status_code == 429
    theirs = tokens.token_for(unit.experiment_id, 2, 1)
    assert _post(unit.experiment_id, 2, {"points": [{"metric": "m", "step": 0, "value": 1}]}, theirs).status_code == 200
    assert _points(execution__work_unit=other) == [("m", 0, 1.0)]
    # A bad body is refused before it costs anything: still 400, not 429.
    assert _post(unit.experiment_id, 1, {"points": [{"metric": "", "step": 1, "value": 1}]}, token).status_code == 400
