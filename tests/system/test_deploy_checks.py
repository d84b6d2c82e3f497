"""Servers refuse the public default secret; `check --deploy` passes with production settings."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from xmc import checks

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = {
    "XMC_SECRET_KEY": "p" * 10 + "roduction-secret-ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
    "XMC_HTTPS": "true",
    "XMC_ALLOWED_HOSTS": "xmc.example.com",
    "XMC_DEBUG": "false",
}


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    child = {k: v for k, v in os.environ.items() if k not in ("XMC_SECRET_KEY", "XMC_DEBUG", "XMC_HTTPS")}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env={**child, **env},
                          capture_output=True, text=True, timeout=120)


def test_it_refuses_the_default_or_a_short_key_unless_debug(settings: object) -> None:
    settings.DEBUG = False  # type: ignore[attr-defined]
    for key in (checks.DEFAULT_SECRET_KEY, "short-but-not-default"):
        settings.SECRET_KEY = key  # type: ignore[attr-defined]
        settings.XMC_TASK_SIGNING_KEY = "t" * 40  # type: ignore[attr-defined]
        assert [m.id for m in checks.check_secret_key()] == ["xmc.E001"]
        with pytest.raises(ImproperlyConfigured, match="XMC_SECRET_KEY"):
            checks.require_deploy_checks()
    settings.DEBUG = True  # type: ignore[attr-defined]
    assert checks.check_secret_key() == []
    checks.require_deploy_checks()


def test_it_refuses_to_start_the_grpc_server_with_the_default_secret() -> None:
    result = manage("grpcserver", "--port", "0", "--host", "127.0.0.1")
    assert result.returncode != 0
    assert "XMC_SECRET_KEY" in result.stderr


def test_it_passes_check_deploy_with_production_settings() -> None:
    result = manage("check", "--deploy", "--fail-level", "WARNING", **PRODUCTION)
    assert result.returncode == 0, result.stdout + result.stderr


def test_it_fails_check_deploy_with_the_default_secret() -> None:
    result = manage("check", "--deploy", **{k: v for k, v in PRODUCTION.items() if k != "XMC_SECRET_KEY"})
    assert result.returncode != 0
    assert "xmc.E001" in result.stderr


@pytest.mark.parametrize(("service", "found", "minimum", "too_old"), [
    ("Redis", "6.0.9", checks.MIN_REDIS, True),
    ("Redis", "6.2.14", checks.MIN_REDIS, False),
    ("Redis", "7.0.15", checks.MIN_REDIS, False),
    ("PostgreSQL", "13.4", checks.MIN_POSTGRES, True),
    ("PostgreSQL", "15.19", checks.MIN_POSTGRES, False),
    ("PostgreSQL", "18beta1", checks.MIN_POSTGRES, False),
])
def test_it_names_the_version_a_service_needs(service: str, found: str, minimum: tuple[int, int],
                                               too_old: bool) -> None:
    problem = checks.version_problem(service, found, minimum)
    if too_old:
        assert problem == f"{service} {found} is too old: XMC needs {service} {minimum[0]}.{minimum[1]} or newer"
    else:
        assert problem is None


@pytest.mark.django_db
def test_it_accepts_the_servers_the_suite_runs_on_and_refuses_older_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    # The suite's own servers (embedded or the machine's) are supported ones ...
    assert checks.check_service_versions() == []
    checks.require_supported_services()
    # ... and a server older than the minimum stops every server process at start.
    monkeypatch.setattr(checks, "MIN_REDIS", (99, 0))
    monkeypatch.setattr(checks, "MIN_POSTGRES", (99, 0))
    assert [m.id for m in checks.check_service_versions()] == ["xmc.E003", "xmc.E004"]
    with pytest.raises(ImproperlyConfigured, match=r"Redis .* is too old: XMC needs Redis 99\.0 or newer"):
        checks.require_supported_services()
