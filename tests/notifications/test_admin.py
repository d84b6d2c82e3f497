"""The notifications admin: what an operator may do there."""
from __future__ import annotations

from typing import Any

import pytest

from notifications.models import Event

pytestmark = pytest.mark.django_db


def test_it_offers_no_way_to_add_an_event_by_hand(admin_client: Any) -> None:
    # An empty add form once saved a row with no time: the database refused it and the page answered 500.
    assert admin_client.get("/admin/notifications/event/add/").status_code == 403
    assert admin_client.post("/admin/notifications/event/add/", {}).status_code == 403
    assert not Event.objects.exists()
    assert admin_client.get("/admin/notifications/event/").status_code == 200
