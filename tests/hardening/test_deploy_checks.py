"""Servers refuse the public default secret; `check --deploy` passes with production settings."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from xmc import checks

ROOT = Path(__file__).resolve().parent.parent.parent
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
