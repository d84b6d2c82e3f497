"""XMC settings: every setting is read from the environment here, once.

Each environment variable below is listed in the README's configuration table
(a test keeps the two in step). Processes (web, grpc, worker, reconciler,
simulator) all load this module through ``DJANGO_SETTINGS_MODULE``.
"""
from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

# --- Core --------------------------------------------------------------------
DEBUG = env.bool("XMC_DEBUG", default=False)
SECRET_KEY = env.str("XMC_SECRET_KEY", default="xmc-insecure-dev-secret-change-me")
ALLOWED_HOSTS = env.list("XMC_ALLOWED_HOSTS", default=["*"])

# --- Storage and broker ------------------------------------------------------
DATABASES = {
    "default": env.db_url("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/xmc"),
}
# A percent-encoded host is a Unix socket directory (the embedded Postgres
# started by ./dev listens only there); django-environ leaves it encoded.
DATABASES["default"]["HOST"] = unquote(DATABASES["default"].get("HOST", ""))
# Persistent connections (seconds); request handlers and gRPC threads close
# stale ones with close_old_connections().
DATABASES["default"]["CONN_MAX_AGE"] = env.int("XMC_DB_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=REDIS_URL)

# --- Security of internal messages and tokens --------------------------------
XMC_TASK_SIGNING_KEY = env.str("XMC_TASK_SIGNING_KEY", default=SECRET_KEY)
# Key rotation: the current key's id, and older keys still accepted
# ("id=key,id=key"; the current key is always included under its id).
XMC_TASK_SIGNING_KEY_ID = env.str("XMC_TASK_SIGNING_KEY_ID", default="k1")
XMC_TASK_SIGNING_KEYS = {
    **env.dict("XMC_TASK_SIGNING_OLD_KEYS", default={}),
    XMC_TASK_SIGNING_KEY_ID: XMC_TASK_SIGNING_KEY,
}
# How long a signed task stays valid (resumption re-signs with a fresh expiry).
XMC_TASK_TTL_S = env.int("XMC_TASK_TTL_S", default=24 * 3600)

# --- Identity and API -------------------------------------------------------
# Bearer tokens are JWTs signed by this server (HS256 with XMC_SECRET_KEY).
XMC_TOKEN_TTL_S = env.int("XMC_TOKEN_TTL_S", default=30 * 24 * 3600)
XMC_JWT_ISSUER = env.str("XMC_JWT_ISSUER", default="xmc")
XMC_LOGIN_CODE_TTL_S = env.int("XMC_LOGIN_CODE_TTL_S", default=300)
# Per-identity request rate (token bucket) for gRPC and REST.
# Seconds a process remembers a caller's identity (staff, groups, deactivation); 0: no cache.
XMC_IDENTITY_CACHE_S = env.float("XMC_IDENTITY_CACHE_S", default=5.0)
XMC_RATE_LIMIT_PER_S = env.float("XMC_RATE_LIMIT_PER_S", default=50.0)
XMC_RATE_LIMIT_BURST = env.int("XMC_RATE_LIMIT_BURST", default=200)
XMC_GRPC_PORT = env.int("XMC_GRPC_PORT", default=50051)
XMC_GRPC_MAX_WORKERS = env.int("XMC_GRPC_MAX_WORKERS", default=16)

# --- Kubernetes --------------------------------------------------------------
XMC_K8S_NAMESPACE = env.str("XMC_K8S_NAMESPACE", default="default")
KUBECONFIG = env.str("KUBECONFIG", default="")

# --- Artifact lifecycle (feature flag and MLRun) ------------------------------
XMC_ARTIFACT_LIFECYCLE_ENABLED = env.bool("XMC_ARTIFACT_LIFECYCLE_ENABLED", default=False)
XMC_MLRUN_ENDPOINT = env.str("XMC_MLRUN_ENDPOINT", default="")
XMC_MLRUN_PROJECT = env.str("XMC_MLRUN_PROJECT", default="")
XMC_MLRUN_LOCATION = env.str("XMC_MLRUN_LOCATION", default="")

# --- Reconciler --------------------------------------------------------------
XMC_RECONCILER_FLUSH_INTERVAL_MS = env.int("XMC_RECONCILER_FLUSH_INTERVAL_MS", default=200)
XMC_STARTUP_IMAGE_PULL_GRACE_S = env.int("XMC_STARTUP_IMAGE_PULL_GRACE_S", default=120)
XMC_MAX_STOPPED_WRITE_RETRY_AGE_S = env.int("XMC_MAX_STOPPED_WRITE_RETRY_AGE_S", default=600)

# --- Django ------------------------------------------------------------------
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "xmc",
    "experiments",
    "workunits",
    "artifacts",
    "lifecycle",
    "k8s_bridge",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "xmc.urls"
WSGI_APPLICATION = "xmc.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = []

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / ".static"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("XMC_LOG_LEVEL", default="INFO")},
}

# --- Celery ------------------------------------------------------------------
CELERY_TASK_ALWAYS_EAGER = False
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True

# --- REST (DRF) ----------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["xmc.auth.drf.BearerAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_THROTTLE_CLASSES": ["xmc.auth.drf.IdentityRateThrottle"],
    "UNAUTHENTICATED_USER": None,
}
