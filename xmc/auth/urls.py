"""URLs of the `xmanager login` flow, mounted at ``/api/cli/`` by `xmc.urls`.

The paths are fixed by the real CLI (the real xmanager client's behaviour, tests/system/real_client): ``login``,
``token`` and ``success``. ``signin`` is ours (the username/password form).
"""
from __future__ import annotations

from django.urls import URLPattern, path

from xmc.auth import views

urlpatterns: list[URLPattern] = [
    path("login", views.cli_login, name="xmc-cli-login"),
    path("token", views.cli_token, name="xmc-cli-token"),
    path("success", views.cli_success, name="xmc-cli-success"),
    path("signin", views.CliSignInView.as_view(), name="xmc-cli-signin"),
]
