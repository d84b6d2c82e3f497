"""Who may call what: every RPC x owner / writer / reader / other / staff.

Runs through ``xmc.api.registry.invoke`` (the code both transports call);
the transport tests (tests/api/grpc_server/test_acl_matrix.py,
tests/api/rest/test_acl_matrix.py) run the same cases over the wire and add
the anonymous column (UNAUTHENTICATED / 401).
"""
from __future__ import annotations

import pytest

from core import pb
from core.errors import NotFound, PermissionDenied
from experiments.acl import Role
from tests import factories
from tests.api.acl_cases import CASES, NOT_FOUND_WHEN_UNREADABLE, PERSONAS, World, build_world, mask
from xmc.api.registry import DASHBOARDS, ESS, RPCS, Caller, invoke
from xmc.auth.identity import Identity

pytestmark = pytest.mark.django_db

api = pb.api


@pytest.fixture
def world() -> World:
    return build_world()


# Lists scoped to what the caller may read (no error, fewer rows) are checked separately.
SCOPED = {(ESS, "ListExperiments"), (ESS, "SearchExperiments"), (ESS, "ListArtifacts"), (ESS, "SearchArtifacts"),
          (DASHBOARDS, "ListDashboards")}


def test_it_covers_every_rpc() -> None:
    import xmc.api.handlers  # noqa: F401

    assert set(RPCS) == set(CASES) | SCOPED


@pytest.mark.parametrize("persona", sorted(PERSONAS))
@pytest.mark.parametrize("key", sorted(CASES), ids=lambda k: k[1])
def test_it_enforces_the_acl(world: World, key: tuple[str, str], persona: str) -> None:
    identity, role = PERSONAS[persona]
    build, needed = CASES[key]
    request = build(world)
    if role >= needed:
        response = invoke(*key, request, Caller(identity))
        assert response is not None
    elif key in NOT_FOUND_WHEN_UNREADABLE and role < Role.READER:
        with pytest.raises(NotFound):
            invoke(*key, request, Caller(identity))
    else:
        with pytest.raises(PermissionDenied) as exc:
            invoke(*key, request, Caller(identity))
        assert identity.email in exc.value.message


def test_it_lets_only_owners_change_acls(world: World) -> None:
    request = api.UpdateExperimentRequest(
        experiment=pb.experiment.Experiment(name=world.exp, acls=pb.xid.XidAcls()), update_mask=mask("acls"))
    with pytest.raises(PermissionDenied):
        invoke(ESS, "UpdateExperiment", request, Caller(PERSONAS["writer"][0]))
    invoke(ESS, "UpdateExperiment", request, Caller(PERSONAS["owner"][0]))


@pytest.mark.parametrize("persona", sorted(PERSONAS))
def test_it_lists_only_what_the_caller_may_read(world: World, persona: str) -> None:
    identity, role = PERSONAS[persona]
    factories.experiment(creator="zoe@example.com")  # nobody above but staff may read it
    experiments = invoke(ESS, "ListExperiments", api.ListExperimentsRequest(), Caller(identity)).experiments
    artifacts = invoke(ESS, "ListArtifacts", api.ListArtifactsRequest(), Caller(identity)).artifacts
    visible = {e.name for e in experiments}
    if identity.is_staff:
        assert len(visible) == 2
    elif role >= Role.READER:
        assert visible == {world.exp}
        assert [a.name for a in artifacts] == [f"artifacts/{world.aid}"]
    else:
        assert visible == set() and list(artifacts) == []


def test_it_shares_experiments_with_all_authenticated_users() -> None:
    acls = pb.xid.XidAcls(owners=[pb.xid.XidAcls.Role(user="alice@example.com")],
                          readers=[pb.xid.XidAcls.Role(all_authenticated_users=True)])
    exp = factories.experiment(acls=acls)
    stranger = Caller(Identity("nobody@else.net", False, frozenset()))
    assert invoke(ESS, "GetExperiment", api.GetExperimentRequest(name=exp.name), stranger).name == exp.name
    with pytest.raises(PermissionDenied):
        invoke(ESS, "UpdateExperiment", api.UpdateExperimentRequest(
            experiment=pb.experiment.Experiment(name=exp.name), update_mask=mask("title")), stranger)
