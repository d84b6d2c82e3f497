"""AIP-160 filters, order_by and paging on the real resources, through the handlers."""
from __future__ import annotations

import pytest

from core import pb
from core.errors import InvalidArgument
from tests import factories
from workunits import services as wu_services
from workunits import state
from workunits.state import ExecutionUpdate
from xmc.api.registry import ESS, Caller, invoke
from xmc.auth.identity import Identity

pytestmark = pytest.mark.django_db

ALICE = Caller(Identity("alice@example.com", False, frozenset()))
api = pb.api


@pytest.fixture
def experiments() -> dict[str, int]:
    made = {
        "edge": factories.experiment(title="edge detector", tags=["ckpt", "vision"], notes="first try"),
        "nlp": factories.experiment(title="nlp baseline", tags=["text"], priority=pb.priority.Priority.HIGH),
        "plain": factories.experiment(title="Plain"),
    }
    factories.experiment(creator="bob@example.com", title="edge of bob")  # not readable by alice
    return {k: v.id for k, v in made.items()}


@pytest.mark.parametrize(
    "filter_text,expected",
    [
        ("", {"edge", "nlp", "plain"}),
        ("tags:ckpt", {"edge"}),
        ('title:"edge"', {"edge"}),
        ('title = "Plain"', {"plain"}),
        ('creator="alice@example.com"', {"edge", "nlp", "plain"}),
        ('creator="bob@example.com"', set()),
        ("priority=HIGH", {"nlp"}),
        ("NOT priority=HIGH", {"edge", "plain"}),
        ("tags:ckpt OR tags:text", {"edge", "nlp"}),
        ("(tags:ckpt OR tags:text) AND priority=NORMAL", {"edge"}),
        ("status.active_state=ACTIVE AND status.launch_state=LAUNCHING", {"edge", "nlp", "plain"}),
        ('create_time > "2000-01-01T00:00:00Z"', {"edge", "nlp", "plain"}),
        ('create_time < "2000-01-01T00:00:00Z"', set()),
        ("notes:try", {"edge"}),
        ('name="experiments/0"', set()),
        ('title:"\'; DROP TABLE experiments_experiment; --"', set()),
    ],
)
def test_it_filters_experiments(experiments: dict[str, int], filter_text: str, expected: set[str]) -> None:
    for method in ("ListExperiments", "SearchExperiments"):
        response = invoke(ESS, method, api.ListExperimentsRequest(filter=filter_text), ALICE)
        by_id = {v: k for k, v in experiments.items()}
        assert {by_id[int(e.name.split("/")[1])] for e in response.experiments} == expected


@pytest.mark.parametrize(
    "filter_text,fragment",
    [
        ("colour=red", "unknown field"),
        ("priority=URGENT", "URGENT"),
        ("title:", ""),
        ("(tags:ckpt", ""),
        ("create_time > yesterday", "create_time"),
        ("status.active_state=RUNNING", "RUNNING"),
    ],
)
def test_it_rejects_bad_filters_naming_the_problem(experiments: dict[str, int], filter_text: str,
                                                   fragment: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        invoke(ESS, "ListExperiments", api.ListExperimentsRequest(filter=filter_text), ALICE)
    assert exc.value.field == "filter"
    assert fragment in exc.value.message


def test_it_filters_work_units_by_current_state_and_type() -> None:
    exp = factories.experiment()
    wus = [factories.work_unit(exp) for _ in range(3)]
    wu_services.update_work_unit_executions([ExecutionUpdate(
        xid=exp.id, wid=wus[1].wid, eid=1, mask=(state.STATE,), state="RUNNING", state_update_time_ns=1 << 62)])
    request = api.ListWorkUnitsRequest(parent=exp.name, filter="state=RUNNING")
    assert [w.name for w in invoke(ESS, "ListWorkUnits", request, ALICE).work_units] == [wus[1].name]
    request = api.ListWorkUnitsRequest(parent=exp.name, filter="state!=RUNNING AND work_unit_type=STANDARD")
    assert len(invoke(ESS, "SearchWorkUnits", request, ALICE).work_units) == 2
    listed = invoke(ESS, "ListWorkUnits", api.ListWorkUnitsRequest(parent=exp.name, order_by="wid desc"), ALICE)
    assert [w.name for w in listed.work_units] == [w.name for w in reversed(wus)]
    assert listed.work_units[0].current_work_unit_execution.status.state == pb.status.WorkUnitStatus.INITIALIZING


def test_it_pages_with_opaque_tokens_and_rejects_tampering() -> None:
    exp = factories.experiment()
    for _ in range(5):
        factories.work_unit(exp)
    seen, token = [], ""
    while True:
        response = invoke(ESS, "ListWorkUnits", api.ListWorkUnitsRequest(parent=exp.name, page_size=2,
                                                                          page_token=token), ALICE)
        seen += [w.name for w in response.work_units]
        token = response.next_page_token
        if not token:
            break
    assert len(seen) == 5 == len(set(seen))
    first = invoke(ESS, "ListWorkUnits", api.ListWorkUnitsRequest(parent=exp.name, page_size=2), ALICE)
    with pytest.raises(InvalidArgument) as exc:
        invoke(ESS, "ListWorkUnits", api.ListWorkUnitsRequest(parent=exp.name, page_size=2,
                                                               page_token=first.next_page_token[:-3] + "abc"), ALICE)
    assert exc.value.field == "page_token"
    with pytest.raises(InvalidArgument):  # a token for another filter
        invoke(ESS, "ListWorkUnits", api.ListWorkUnitsRequest(parent=exp.name, page_size=2, filter="wid>0",
                                                               page_token=first.next_page_token), ALICE)


def test_it_filters_batch_stop_targets() -> None:
    exp = factories.experiment()
    wus = [factories.work_unit(exp) for _ in range(3)]
    wu_services.update_work_unit(exp.id, wus[0].wid, pb.work_unit.WorkUnit(tags=["stop-me"]), ["tags"])
    invoke(ESS, "BatchStopWorkUnits", api.BatchStopWorkUnitsRequest(parent=exp.name, filter="tags:stop-me"), ALICE)
    states = [invoke(ESS, "GetWorkUnit", api.GetWorkUnitRequest(name=w.name), ALICE)
              .current_work_unit_execution.status.state for w in wus]
    assert states == [pb.status.WorkUnitStatus.STOPPING, pb.status.WorkUnitStatus.INITIALIZING,
                      pb.status.WorkUnitStatus.INITIALIZING]
    with pytest.raises(InvalidArgument):
        invoke(ESS, "BatchStopWorkUnits", api.BatchStopWorkUnitsRequest(parent=exp.name, filter="bogus:1"), ALICE)


def test_it_acts_on_nothing_when_a_batch_filter_matches_nothing() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    other = factories.experiment(creator="bob@example.com")
    other_wu = factories.work_unit(other)
    for method, request in (("BatchStopWorkUnits", api.BatchStopWorkUnitsRequest),
                            ("BatchRestartWorkUnits", api.BatchRestartWorkUnitsRequest)):
        op = invoke(ESS, method, request(parent=exp.name, filter="wid=99"), ALICE)
        assert op.done
    for w in (wu, other_wu):
        w.refresh_from_db()
        assert w.current_eid == 1
    assert wu_services.current_execution(wu).state == "INITIALIZING"
    assert wu_services.current_execution(other_wu).state == "INITIALIZING"
