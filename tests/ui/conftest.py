"""The people of the page tests, each signed in through the site's session login."""
from __future__ import annotations

import pytest
from django.test import Client

from tests.ui import pages


@pytest.fixture
def alice(client: Client) -> Client:
    """Alice, signed in on the test's own Django client."""
    return pages.signed_in("alice", client)
