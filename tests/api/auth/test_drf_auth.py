"""DRF: bearer authentication and the per-identity throttle on a tiny view."""
from __future__ import annotations

import time
from typing import Any

import pytest
from django.test import Client, override_settings
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from xmc.auth.drf import BearerAuthentication, IdentityRateThrottle, IdentityUser
from xmc.auth.tokens import issue_token

pytestmark = pytest.mark.django_db


class WhoAmIView(APIView):
    authentication_classes = [BearerAuthentication]
    permission_classes = [IsAuthenticated]
    throttle_classes = [IdentityRateThrottle]

    def get(self, request: Request) -> Response:
        user = request.user
        assert isinstance(user, IdentityUser)
        return Response({"email": user.email, "is_staff": user.is_staff, "groups": sorted(user.groups)})


@pytest.fixture(autouse=True)
def _drf_urls() -> Any:
    with override_settings(ROOT_URLCONF="tests.api.auth.drf_urls"):
        yield


def _get(token: str | None = None, scheme: str = "Bearer") -> Any:
    headers = {} if token is None else {"HTTP_AUTHORIZATION": f"{scheme} {token}"}
    return Client().get("/whoami", **headers)


def test_it_serves_alice_with_her_bearer_token(alice: Any) -> None:
    response = _get(issue_token("alice@example.com"))
    assert response.status_code == 200
    assert response.json() == {"email": "alice@example.com", "is_staff": False, "groups": []}


def test_it_shows_oscar_as_staff(oscar: Any) -> None:
    response = _get(issue_token("oscar@example.com"))
    assert response.json() == {"email": "oscar@example.com", "is_staff": True, "groups": ["ml-infra", "sre"]}


def test_it_answers_401_with_a_bearer_challenge_when_there_is_no_token() -> None:
    response = _get()
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"


def test_it_answers_401_for_another_scheme() -> None:
    response = _get("YWxpY2U6cHc=", scheme="Basic")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"


def test_it_says_why_a_token_is_refused() -> None:
    expired = issue_token("alice@example.com", ttl_s=60, now=time.time() - 3600)
    response = _get(expired)
    assert response.status_code == 401
    assert response.json() == {"detail": "invalid bearer token: token expired"}


def test_it_refuses_the_token_of_a_deactivated_user(make_user: Any) -> None:
    make_user("dora", "dora@example.com", is_active=False)
    response = _get(issue_token("dora@example.com"))
    assert response.status_code == 401
    assert "deactivated" in response.json()["detail"]
