"""XMC's project package: settings, URL root, Celery app, API wiring."""
from __future__ import annotations

# Loaded with Django so that @shared_task binds to this app (Celery's Django
# pattern); importing it configures nothing else.
from xmc.celery import app as celery_app

__all__ = ["celery_app"]
