"""URLs of the notifications app, included by ``xmc.urls`` ahead of the REST API's catch-all."""
from __future__ import annotations

from notifications.rest import urlpatterns as urlpatterns
