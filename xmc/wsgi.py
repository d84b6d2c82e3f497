"""WSGI entry point for the web process (``gunicorn xmc.wsgi``)."""
from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "xmc.settings")

application = get_wsgi_application()

# Refuse to serve with the public default secret (gunicorn and runserver both load this module).
from xmc.checks import require_deploy_checks  # noqa: E402 - needs the configured settings

require_deploy_checks()
