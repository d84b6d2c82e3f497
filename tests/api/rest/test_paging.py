"""Page tokens round-trip through REST: what one transport hands out, the other accepts."""
from __future__ import annotations

from urllib.parse import quote

import pytest

from core import pb
from tests import factories
from tests.api.rest.conftest import ALICE, Api, grpc_call
from xmc.api.registry import ESS

pytestmark = pytest.mark.django_db


@pytest.fixture
def five_work_units(db: None) -> str:
    exp = factories.experiment(ALICE, title="five")
    for wid in range(1, 6):
        factories.work_unit(exp, wid=wid)
    return f"experiments/{exp.id}"


def test_it_pages_through_work_units_with_next_page_tokens(five_work_units: str, alice_api: Api) -> None:
    seen, token, pages = [], "", 0
    while True:
        response = alice_api.get(f"/v1/{five_work_units}/workUnits?pageSize=2&pageToken={quote(token)}")
        assert response.status_code == 200, response.content
        body = response.json()
        seen += [wu["name"].rsplit("/", 1)[1] for wu in body["workUnits"]]
        pages += 1
        token = body.get("nextPageToken", "")
        if not token:
            break
    assert seen == ["1", "2", "3", "4", "5"]
    assert pages == 3


def test_it_accepts_a_rest_token_over_grpc_and_a_grpc_token_over_rest(five_work_units: str, alice_api: Api) -> None:
    rest_token = alice_api.get(f"/v1/{five_work_units}/workUnits?pageSize=2").json()["nextPageToken"]
    grpc_page = grpc_call(ESS, "ListWorkUnits", pb.api.ListWorkUnitsRequest(
        parent=five_work_units, page_size=2, page_token=rest_token))
    assert [wu.name.rsplit("/", 1)[1] for wu in grpc_page.work_units] == ["3", "4"]

    rest_page = alice_api.get(
        f"/v1/{five_work_units}/workUnits:search?page_size=2&page_token={quote(grpc_page.next_page_token)}"
    ).json()
    assert [wu["name"].rsplit("/", 1)[1] for wu in rest_page["workUnits"]] == ["5"]
    assert "nextPageToken" not in rest_page


def test_it_refuses_a_token_from_another_listing(five_work_units: str, alice_api: Api) -> None:
    token = alice_api.get(f"/v1/{five_work_units}/workUnits?pageSize=2").json()["nextPageToken"]
    response = Api(ALICE).get(f"/v1/experiments?pageToken={quote(token)}")
    assert response.status_code == 400
    assert response.json()["error"]["details"][0]["fieldViolations"][0]["field"] == "page_token"
