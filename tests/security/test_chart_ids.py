"""Issue 40, item 9: chart and dashboard ids are scoped, so they are neither an oracle nor a land grab.

Eve is a stranger to Alice's experiment. With one global namespace, Eve could
learn that Alice's dashboard ``q4-review`` exists (CreateDashboard with that id
answered ALREADY_EXISTS, while reads answered PERMISSION_DENIED either way),
and could take an id before Alice did. Now dashboard ids are per owner and
chart ids per work unit; what Eve may not read is NOT_FOUND, as a missing one.
Over the real gRPC server, as the attacker would call it.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest

from core import pb
from tests import factories
from tests.metrics.conftest import chart_message, dash, experiment_for, persona  # noqa: F401
from tests.api.grpc_server.conftest import (  # noqa: F401 - the shared session server
    _server_connections_closed_after_each_test,
    channel,
    grpc_server,
    grpc_target,
)

pytestmark = pytest.mark.django_db(transaction=True)

D = pb.dashboard_api
M = pb.dashboard
Persona = Callable[[str], tuple[str, list[tuple[str, str]]]]


def _code(call: Callable[[], Any]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def test_it_reveals_nothing_and_takes_nothing_when_a_dashboard_is_created_with_anothers_id(
    dash: Any, persona: Persona  # noqa: F811
) -> None:
    alice, as_alice = persona("alice")
    _, as_eve = persona("eve")
    exp = experiment_for(alice)
    factories.work_unit(exp, wid=1)
    taken = f"q4-review-{exp.id}"
    mine = dash.CreateDashboard(D.CreateDashboardRequest(dashboard=M.Dashboard(title="Alice's"), dashboard_id=taken),
                                metadata=as_alice)
    # Eve's create with Alice's id is no oracle: it succeeds, in Eve's own namespace.
    eves = dash.CreateDashboard(D.CreateDashboardRequest(dashboard=M.Dashboard(title="Eve's"), dashboard_id=taken),
                                metadata=as_eve)
    assert eves.name == mine.name and eves.owner != alice
    # Each reads their own; neither sees the other's.
    assert dash.GetDashboard(D.GetDashboardRequest(name=mine.name), metadata=as_alice).title == "Alice's"
    assert dash.GetDashboard(D.GetDashboardRequest(name=mine.name), metadata=as_eve).title == "Eve's"
    # Her own again is the one collision anyone can see.
    assert _code(lambda: dash.CreateDashboard(D.CreateDashboardRequest(
        dashboard=M.Dashboard(title="again"), dashboard_id=taken), metadata=as_eve)) == grpc.StatusCode.ALREADY_EXISTS


def test_it_still_keeps_free_for_its_owner_an_id_taken_first_by_a_stranger(dash: Any, persona: Persona) -> None:  # noqa: F811
    alice, as_alice = persona("alice")
    _, as_eve = persona("eve")
    exp = experiment_for(alice)
    factories.work_unit(exp, wid=1)
    planned = f"launch-{exp.id}"
    dash.CreateDashboard(D.CreateDashboardRequest(dashboard=M.Dashboard(title="squat"), dashboard_id=planned),
                         metadata=as_eve)
    made = dash.CreateDashboard(D.CreateDashboardRequest(dashboard=M.Dashboard(title="real"), dashboard_id=planned),
                                metadata=as_alice)
    assert made.owner == alice and made.name == f"dashboards/{planned}"


def test_it_answers_not_found_like_a_missing_one_for_a_dashboard_or_chart_the_caller_may_not_read(
    dash: Any, persona: Persona  # noqa: F811
) -> None:
    alice, as_alice = persona("alice")
    _, as_eve = persona("eve")
    exp = experiment_for(alice)
    factories.work_unit(exp, wid=1)
    chart = dash.CreateChart(D.CreateChartRequest(parent=f"experiments/{exp.id}/workUnits/1", chart=chart_message(),
                                                  chart_id=f"loss-{exp.id}"), metadata=as_alice)
    board = dash.CreateDashboard(D.CreateDashboardRequest(
        dashboard=M.Dashboard(title="private", chart_ids=[f"loss-{exp.id}"]), dashboard_id=f"p-{exp.id}"),
        metadata=as_alice)
    for call in (lambda n: dash.GetDashboard(D.GetDashboardRequest(name=n), metadata=as_eve),
                 lambda n: dash.DeleteDashboard(D.DeleteDashboardRequest(name=n), metadata=as_eve)):
        assert _code(lambda: call(board.name)) == _code(lambda: call("dashboards/never-made")) == \
            grpc.StatusCode.NOT_FOUND
    short = f"charts/loss-{exp.id}"
    assert _code(lambda: dash.GetChart(D.GetChartRequest(name=short), metadata=as_eve)) == grpc.StatusCode.NOT_FOUND
    assert _code(lambda: dash.GetChart(D.GetChartRequest(name="charts/never-made"), metadata=as_eve)) == \
        grpc.StatusCode.NOT_FOUND
    # Nor can Eve put Alice's chart on a dashboard of her own.
    assert _code(lambda: dash.CreateDashboard(D.CreateDashboardRequest(
        dashboard=M.Dashboard(title="x", chart_ids=[f"loss-{exp.id}"])), metadata=as_eve)) == \
        grpc.StatusCode.INVALID_ARGUMENT
    assert dash.GetChart(D.GetChartRequest(name=short), metadata=as_alice) == chart


def test_it_scopes_chart_ids_per_work_unit(dash: Any, persona: Persona) -> None:  # noqa: F811
    alice, as_alice = persona("alice")
    bob, as_bob = persona("bob")
    alices, bobs = experiment_for(alice), experiment_for(bob)
    factories.work_unit(alices, wid=1)
    factories.work_unit(bobs, wid=1)
    same = f"loss-{alices.id}"
    a = dash.CreateChart(D.CreateChartRequest(parent=f"experiments/{alices.id}/workUnits/1", chart=chart_message(),
                                              chart_id=same), metadata=as_alice)
    b = dash.CreateChart(D.CreateChartRequest(parent=f"experiments/{bobs.id}/workUnits/1",
                                              chart=chart_message(title="Bob's"), chart_id=same), metadata=as_bob)
    assert a.name != b.name and a.name.endswith(f"/charts/{same}") and b.name.endswith(f"/charts/{same}")
    assert dash.GetChart(D.GetChartRequest(name=f"charts/{same}"), metadata=as_bob).title == "Bob's"
    # The same id twice in one work unit (different content) is a conflict its readers can see anyway.
    assert _code(lambda: dash.CreateChart(D.CreateChartRequest(
        parent=f"experiments/{bobs.id}/workUnits/1", chart=chart_message(title="other"), chart_id=same),
        metadata=as_bob)) == grpc.StatusCode.ALREADY_EXISTS
