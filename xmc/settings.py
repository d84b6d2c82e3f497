"""XMC settings: every setting is read from the environment here, once.

Each environment variable below is listed in the README's configuration table
(a test keeps the two in step). Processes (web, grpc, worker, reconciler,
simulator) all load this module through ``DJANGO_SETTINGS_MODULE``.
"""
from __future__ import annotations

import ipaddress
from pathlib import Path
from urllib.parse import unquote

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

# --- Core --------------------------------------------------------------------
DEBUG = env.bool("XMC_DEBUG", default=False)
# The default is public: every server refuses to start with it (or with a key
# under 32 bytes) unless XMC_DEBUG is on (xmc.checks, a deploy-level check).
SECRET_KEY = env.str("XMC_SECRET_KEY", default="xmc-insecure-dev-secret-change-me")
ALLOWED_HOSTS = env.list("XMC_ALLOWED_HOSTS", default=["*"])

# --- HTTPS (behind a TLS-terminating proxy or ingress) -------------------------
# Off by default so ./dev run works over plain http on 127.0.0.1; a deployment
# sets XMC_HTTPS=true: Secure session and CSRF cookies, HSTS, http -> https
# redirects, and the proxy's X-Forwarded-Proto trusted to say "https".
XMC_HTTPS = env.bool("XMC_HTTPS", default=False)
SESSION_COOKIE_SECURE = XMC_HTTPS
CSRF_COOKIE_SECURE = XMC_HTTPS
SECURE_SSL_REDIRECT = XMC_HTTPS
# Probes reach the pods over plain http inside the cluster.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env.int("XMC_HSTS_SECONDS", default=31536000 if XMC_HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = XMC_HTTPS
SECURE_HSTS_PRELOAD = False
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if XMC_HTTPS else None
CSRF_TRUSTED_ORIGINS = env.list("XMC_CSRF_TRUSTED_ORIGINS", default=[])
SILENCED_SYSTEM_CHECKS = ["security.W021"]  # HSTS preload is an opt-in decision for the domain owner

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
# A database that does not answer fails a connection attempt after this many
# seconds (libpq connect_timeout), so a request answers UNAVAILABLE / 503 fast
# instead of hanging while Postgres is down or unreachable.
XMC_DB_CONNECT_TIMEOUT_S = env.int("XMC_DB_CONNECT_TIMEOUT_S", default=3)
DATABASES["default"].setdefault("OPTIONS", {})["connect_timeout"] = XMC_DB_CONNECT_TIMEOUT_S
# How often the gRPC server checks the database for its health service (NOT_SERVING while down).
XMC_HEALTH_CHECK_INTERVAL_S = env.float("XMC_HEALTH_CHECK_INTERVAL_S", default=2.0)
#: After how many runs on one connection the hot write statements
#: and the API's one-statement reads (``core.db``) become server-side prepared
#: statements, so Postgres stops planning them on every call; 0 turns
#: preparing off (a connection pooler in transaction mode without
#: prepared-statement support).
XMC_DB_PREPARE_THRESHOLD = env.int("XMC_DB_PREPARE_THRESHOLD", default=5)
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
# Failed sign-ins (/api/cli/signin, /admin/login/) per account and per client
# address within a window, counted in Redis (xmc.auth.throttle).
XMC_LOGIN_MAX_FAILURES_PER_ACCOUNT = env.int("XMC_LOGIN_MAX_FAILURES_PER_ACCOUNT", default=5)
XMC_LOGIN_MAX_FAILURES_PER_ADDRESS = env.int("XMC_LOGIN_MAX_FAILURES_PER_ADDRESS", default=30)
XMC_LOGIN_FAILURE_WINDOW_S = env.int("XMC_LOGIN_FAILURE_WINDOW_S", default=900)
# Past the per-account count, addresses the account never signed in from wait a
# delay that doubles with every further failure, up to this many seconds.
XMC_LOGIN_MAX_DELAY_S = env.int("XMC_LOGIN_MAX_DELAY_S", default=60)
# Proxies (addresses or CIDR networks) whose X-Forwarded-For names the client
# (xmc.auth.proxies); from anyone else the header is ignored.
XMC_TRUSTED_PROXIES = env.list("XMC_TRUSTED_PROXIES", default=[])
for _proxy in XMC_TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_proxy.strip(), strict=False)
    except ValueError as _exc:
        raise ImproperlyConfigured(f"XMC_TRUSTED_PROXIES: {_proxy!r} is not an address or network") from _exc
XMC_GRPC_PORT = env.int("XMC_GRPC_PORT", default=50051)
XMC_GRPC_MAX_WORKERS = env.int("XMC_GRPC_MAX_WORKERS", default=16)
# WaitOperation holds a worker thread: at most this many at once per process,
# and per identity; the excess returns at once (xmc.api.waits). Longest wait.
XMC_WAIT_MAX_CONCURRENT = env.int("XMC_WAIT_MAX_CONCURRENT", default=4)
XMC_WAIT_MAX_PER_IDENTITY = env.int("XMC_WAIT_MAX_PER_IDENTITY", default=2)
XMC_WAIT_MAX_S = env.float("XMC_WAIT_MAX_S", default=10.0)

# When set, the web process's /metrics answers only "Authorization: Bearer <this>" (xmc.ops.metrics).
XMC_METRICS_SCRAPE_TOKEN = env.str("XMC_METRICS_SCRAPE_TOKEN", default="")
# Port of a Celery worker's /metrics (0: none). With a prefork pool set
# PROMETHEUS_MULTIPROC_DIR too, so every pool process is counted.
XMC_WORKER_METRICS_PORT = env.int("XMC_WORKER_METRICS_PORT", default=0)

# --- Kubernetes --------------------------------------------------------------
XMC_K8S_NAMESPACE = env.str("XMC_K8S_NAMESPACE", default="default")
KUBECONFIG = env.str("KUBECONFIG", default="")

# --- Actuator (k8s_bridge.tasks, workunits.outbox) ----------------------------
XMC_ACTUATOR_MAX_RETRIES = env.int("XMC_ACTUATOR_MAX_RETRIES", default=8)
XMC_ACTUATOR_BACKOFF_BASE_S = env.float("XMC_ACTUATOR_BACKOFF_BASE_S", default=1.0)
XMC_ACTUATOR_BACKOFF_MAX_S = env.float("XMC_ACTUATOR_BACKOFF_MAX_S", default=60.0)
XMC_ACTUATOR_RESTART_WAIT_RETRIES = env.int("XMC_ACTUATOR_RESTART_WAIT_RETRIES", default=120)
XMC_ACTUATOR_SOFT_TIME_LIMIT_S = env.int("XMC_ACTUATOR_SOFT_TIME_LIMIT_S", default=60)
XMC_OUTBOX_SWEEP_INTERVAL_S = env.float("XMC_OUTBOX_SWEEP_INTERVAL_S", default=10.0)
# Leased delivery (workunits.delivery): a sent operation or message that is not
# done, whose last send is older than this and that no worker holds a live claim
# on, is sent again by the sweep; a worker's claim lasts this long and is
# extended while it works. Recovery from a lost message or a dead worker takes
# at most about lease + sweep interval.
XMC_OPERATION_LEASE_S = env.float("XMC_OPERATION_LEASE_S", default=45.0)
# Done outbox messages (lifecycle events, resumption runs) are deleted this long after they ended.
XMC_OUTBOX_MESSAGE_RETENTION_DAYS = env.int("XMC_OUTBOX_MESSAGE_RETENTION_DAYS", default=7)
XMC_OUTBOX_SWEEP_MIN_AGE_S = env.float("XMC_OUTBOX_SWEEP_MIN_AGE_S", default=10.0)
#: Past this many seconds without a worker on the oldest pending row of a queue, /readyz says
#: "degraded", the pages show a banner and OPERATOR_DELIVERY_DEGRADED is sent (docs/architecture/delivery.md).
XMC_DEGRADED_AFTER_S = env.float("XMC_DEGRADED_AFTER_S", default=120.0)
XMC_OUTBOX_FAILURES_BEFORE_MESSAGE = env.int("XMC_OUTBOX_FAILURES_BEFORE_MESSAGE", default=3)
XMC_OPERATION_RETENTION_DAYS = env.int("XMC_OPERATION_RETENTION_DAYS", default=90)
XMC_CELERY_VISIBILITY_TIMEOUT_S = env.int("XMC_CELERY_VISIBILITY_TIMEOUT_S", default=3600)
# A message not acknowledged within this window is handed back by Redis (what a
# SIGKILLed worker held comes back after it). It no longer carries correctness:
# the lease above re-sends lost work much sooner, and the late copy Redis gives
# back is dropped by the claim check. Keep it above the longest task and retry
# countdown, so Redis does not hand out copies of tasks still running.
# kombu's Redis transport minus a client built per published message (xmc/broker.py).
CELERY_BROKER_TRANSPORT = "xmc.broker:Transport" if CELERY_BROKER_URL.startswith("redis://") else None
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": XMC_CELERY_VISIBILITY_TIMEOUT_S,
    # A Redis that does not answer fails a publish in seconds (the outbox keeps the
    # row), instead of holding a request.
    "socket_connect_timeout": 2.0,
    "socket_timeout": 5.0,
}

# --- Artifact lifecycle (feature flag and MLRun) ------------------------------
XMC_ARTIFACT_LIFECYCLE_ENABLED = env.bool("XMC_ARTIFACT_LIFECYCLE_ENABLED", default=False)
XMC_MLRUN_ENDPOINT = env.str("XMC_MLRUN_ENDPOINT", default="")
XMC_MLRUN_PROJECT = env.str("XMC_MLRUN_PROJECT", default="")
XMC_MLRUN_LOCATION = env.str("XMC_MLRUN_LOCATION", default="")
XMC_MLRUN_TOKEN = env.str("XMC_MLRUN_TOKEN", default="")
XMC_GKE_CLUSTER = env.str("XMC_GKE_CLUSTER", default="")

# --- Reconciler --------------------------------------------------------------
XMC_RECONCILER_FLUSH_INTERVAL_MS = env.int("XMC_RECONCILER_FLUSH_INTERVAL_MS", default=200)
# Connections the reconciler's batcher writes through, a batch split by experiment (workunits.writers).
XMC_RECONCILER_WRITE_CONNECTIONS = env.int("XMC_RECONCILER_WRITE_CONNECTIONS", default=2)
XMC_STARTUP_IMAGE_PULL_GRACE_S = env.int("XMC_STARTUP_IMAGE_PULL_GRACE_S", default=120)
XMC_MAX_STOPPED_WRITE_RETRY_AGE_S = env.int("XMC_MAX_STOPPED_WRITE_RETRY_AGE_S", default=600)
XMC_RECONCILER_MAX_BATCH = env.int("XMC_RECONCILER_MAX_BATCH", default=500)
XMC_RECONCILER_RESYNC_S = env.int("XMC_RECONCILER_RESYNC_S", default=300)
XMC_RECONCILER_LEASE_DURATION_S = env.float("XMC_RECONCILER_LEASE_DURATION_S", default=15.0)
XMC_RECONCILER_METRICS_PORT = env.int("XMC_RECONCILER_METRICS_PORT", default=9108)

# --- Container logs (k8s_bridge.logs, docs/architecture/logs.md) -------------------
# Where archived pod logs go: any fsspec URL (s3://bucket/prefix, gs://...); empty =
# a folder under the run directory (XMC_RUN_DIR, default .run/).
XMC_RUN_DIR = env.str("XMC_RUN_DIR", default=str(BASE_DIR / ".run"))
XMC_LOG_ARCHIVE_URL = env.str("XMC_LOG_ARCHIVE_URL", default="") or f"file://{Path(XMC_RUN_DIR).resolve()}/log-archive"
# The last this-many bytes of each container's log are archived.
XMC_LOG_ARCHIVE_MAX_BYTES = env.int("XMC_LOG_ARCHIVE_MAX_BYTES", default=10 * 1024 * 1024)
# How long the finalizer keeps a stopped JobSet (and so its pods) for their logs to be archived.
#: Archived pod logs are deleted this many days after they were archived (0: kept for ever).
XMC_LOG_ARCHIVE_RETENTION_DAYS = env.int("XMC_LOG_ARCHIVE_RETENTION_DAYS", default=0)
XMC_LOG_ARCHIVE_FINALIZER_WAIT_S = env.float("XMC_LOG_ARCHIVE_FINALIZER_WAIT_S", default=30.0)
# "Open in your cluster's log explorer": a URL with {namespace}, {pod}, {container}, {xid}, {wid}, {eid}.
XMC_LOGS_CONSOLE_URL_TEMPLATE = env.str("XMC_LOGS_CONSOLE_URL_TEMPLATE", default="")
# Followed logs (?follow=true) one web process keeps open at once; each holds a request thread.
XMC_LOGS_MAX_FOLLOWS = env.int("XMC_LOGS_MAX_FOLLOWS", default=2)
# An open event stream re-checks its caller's access before every event it sends and at least this
# often (seconds); a stream whose caller lost access, or was deactivated, ends with a final "denied" event.
XMC_STREAM_RECHECK_S = env.float("XMC_STREAM_RECHECK_S", default=10.0)
# Name of this cluster in execution metadata (management/executing cluster); "" leaves it out.
XMC_K8S_CLUSTER_NAME = env.str("XMC_K8S_CLUSTER_NAME", default="")

# --- Pause and resume of scheduling --------------------------------------------
XMC_PAUSE_DRAIN_TIMEOUT_S = env.float("XMC_PAUSE_DRAIN_TIMEOUT_S", default=120.0)

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
    "delivery",
    "experiments",
    "workunits",
    "artifacts",
    "metrics",
    "lifecycle",
    "studies",
    "k8s_bridge",
    "notifications",
    "usage",
    "ui",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files (the admin's CSS and JavaScript) served by the web process
    # itself from STATIC_ROOT (filled by collectstatic), in and outside debug.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "xmc.logs.RequestLogMiddleware",
    "xmc.ops.DatabaseUnavailableMiddleware",
    # No NUL or lone surrogate in a path, query parameter or form field reaches a view (core.inputs).
    "xmc.inputs.InputMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "xmc.urls"
# The researcher's pages (ui/) sign in at /login; the admin keeps its own login page.
LOGIN_URL = "ui-login"
LOGIN_REDIRECT_URL = "ui-experiments"
# Threads per web worker for everything but the event streams (xmc/asgi.py: the WSGI app in a pool).
XMC_WEB_THREADS = env.int("XMC_WEB_THREADS", default=8)
# The largest request body the web process reads in (xmc/wsgi_bridge.py holds a body in memory): a
# guard far above DATA_UPLOAD_MAX_MEMORY_SIZE, the limit the API itself answers 413 for.
XMC_WEB_MAX_BODY_BYTES = env.int("XMC_WEB_MAX_BODY_BYTES", default=64 * 1024 * 1024)
# Bodies before sign-in (xmc/body_guard.py): a request without valid credentials may send at most
# XMC_WEB_PREAUTH_MAX_BODY_BYTES within XMC_WEB_PREAUTH_BODY_TIMEOUT_S; a larger body is read only
# once its credentials check, within XMC_WEB_BODY_TIMEOUT_S. Per process, the bodies being read hold
# at most XMC_WEB_INFLIGHT_BODY_BYTES (XMC_WEB_PREAUTH_INFLIGHT_BYTES of them unauthenticated): 429 past it.
XMC_WEB_PREAUTH_MAX_BODY_BYTES = env.int("XMC_WEB_PREAUTH_MAX_BODY_BYTES", default=64 * 1024)
XMC_WEB_PREAUTH_BODY_TIMEOUT_S = env.float("XMC_WEB_PREAUTH_BODY_TIMEOUT_S", default=15.0)
XMC_WEB_BODY_TIMEOUT_S = env.float("XMC_WEB_BODY_TIMEOUT_S", default=120.0)
XMC_WEB_INFLIGHT_BODY_BYTES = env.int("XMC_WEB_INFLIGHT_BODY_BYTES", default=256 * 1024 * 1024)
XMC_WEB_PREAUTH_INFLIGHT_BYTES = env.int("XMC_WEB_PREAUTH_INFLIGHT_BYTES", default=16 * 1024 * 1024)
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
                "ui.context.delivery",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / ".static"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# "plain" text, or "json": one object per line with the record's ids
# (xmc/logs.py), for log pipelines.
XMC_LOG_FORMAT = env.str("XMC_LOG_FORMAT", default="plain")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"()": "xmc.logs.PlainFormatter", "format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "xmc.logs.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler",
                             "formatter": "json" if XMC_LOG_FORMAT == "json" else "plain"}},
    "root": {"handlers": ["console"], "level": env.str("XMC_LOG_LEVEL", default="INFO")},
}

# --- Celery ------------------------------------------------------------------
CELERY_TASK_ALWAYS_EAGER = False
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
#: Every periodic task ``celery -A xmc beat`` runs: the backstops of the
#: event-driven paths (STYLE.md 14). ``expires`` drops a tick that waited in
#: the queue longer than that (the next tick does the same work).
# --- Notifications (notifications/, docs/architecture/notifications.md) ----------------
# Email: SMTP from the environment (EMAIL_HOST...), else the file backend under the run folder.
EMAIL_HOST = env.str("EMAIL_HOST", default="")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=10)
EMAIL_BACKEND = env.str("EMAIL_BACKEND", default=(
    "django.core.mail.backends.smtp.EmailBackend" if EMAIL_HOST else "django.core.mail.backends.filebased.EmailBackend"))
EMAIL_FILE_PATH = env.str("EMAIL_FILE_PATH", default=str(Path(XMC_RUN_DIR) / "mail"))
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="xmc@localhost")
#: Hosts (names or addresses) a webhook may target although they resolve to private/loopback addresses.
XMC_WEBHOOK_ALLOWED_HOSTS = env.list("XMC_WEBHOOK_ALLOWED_HOSTS", default=[])
XMC_WEBHOOK_TIMEOUT_S = env.float("XMC_WEBHOOK_TIMEOUT_S", default=10.0)
#: Tries before a delivery becomes a dead letter; backoff base and cap (exponential, full jitter).
XMC_NOTIFY_MAX_ATTEMPTS = env.int("XMC_NOTIFY_MAX_ATTEMPTS", default=8)
XMC_NOTIFY_BACKOFF_S = env.float("XMC_NOTIFY_BACKOFF_S", default=5.0)
XMC_NOTIFY_BACKOFF_MAX_S = env.float("XMC_NOTIFY_BACKOFF_MAX_S", default=3600.0)
#: How long a worker holds a delivery it is sending; a crashed worker's delivery is taken over after it.
XMC_NOTIFY_LEASE_S = env.float("XMC_NOTIFY_LEASE_S", default=60.0)
#: How many messages of one deliver task are sent at the same time.
XMC_NOTIFY_SEND_CONCURRENCY = env.int("XMC_NOTIFY_SEND_CONCURRENCY", default=8)
#: Events of one experiment within this window travel in one message.
XMC_NOTIFY_COALESCE_S = env.float("XMC_NOTIFY_COALESCE_S", default=30.0)
#: Circuit breaker: open after this many consecutive failures of an endpoint, for this long.
XMC_NOTIFY_BREAKER_FAILURES = env.int("XMC_NOTIFY_BREAKER_FAILURES", default=5)
XMC_NOTIFY_BREAKER_OPEN_S = env.float("XMC_NOTIFY_BREAKER_OPEN_S", default=60.0)
XMC_NOTIFY_SWEEP_INTERVAL_S = env.float("XMC_NOTIFY_SWEEP_INTERVAL_S", default=15.0)
#: Links in messages point here (the web process' address).
XMC_PUBLIC_URL = env.str("XMC_PUBLIC_URL", default="http://127.0.0.1:8000")
#: The researcher's pages, which notification links open ($XMANAGER_UI_URL/experiments/<xid>):
#: XMANAGER_UI_URL when the pages live elsewhere, else the web origin.
XMC_UI_URL = env.str("XMANAGER_UI_URL", default="") or XMC_PUBLIC_URL

# Metrics (metrics/, docs/architecture/metrics.md).
#: The base URL pods reach the web service at: every container gets XMC_METRICS_URL from it
#: (an in-cluster Service URL in the manifests; the web origin under ./dev run).
XMC_METRICS_URL = env.str("XMC_METRICS_URL", default="") or XMC_PUBLIC_URL
#: How long after its execution ended an execution's metrics token still writes.
XMC_METRICS_TOKEN_GRACE_S = env.float("XMC_METRICS_TOKEN_GRACE_S", default=300.0)
#: Most points one metrics:write call may carry.
XMC_METRICS_MAX_POINTS = env.int("XMC_METRICS_MAX_POINTS", default=10_000)
# Calls of the metrics write path per execution (one token bucket each in Redis, core.ratelimit):
# a job's writer flushes about once a second; a runaway loop gets 429 with Retry-After. 0 turns it off.
XMC_METRICS_WRITES_PER_S = env.float("XMC_METRICS_WRITES_PER_S", default=50.0)
XMC_METRICS_WRITES_BURST = env.int("XMC_METRICS_WRITES_BURST", default=200)
#: Points older than this are dropped with their daily partition by the hourly maintenance (0 keeps them for ever).
XMC_METRICS_RETENTION_DAYS = env.int("XMC_METRICS_RETENTION_DAYS", default=90)
# How far ahead of the server's clock a point's time may be (a job's clock runs a
# little fast); later ones are refused, and maintenance deletes any stored.
XMC_METRICS_MAX_FUTURE_S = env.int("XMC_METRICS_MAX_FUTURE_S", default=3600)
#: How many days of partitions of the points table exist ahead of today (metrics.partitions).
XMC_METRICS_PARTITIONS_AHEAD_DAYS = env.int("XMC_METRICS_PARTITIONS_AHEAD_DAYS", default=7)
#: How often the collector's pending finest blocks are added to their coarser sizes (metrics.tasks.roll_up_blocks).
XMC_METRICS_ROLL_UP_S = env.float("XMC_METRICS_ROLL_UP_S", default=600.0)

# Studies (studies/, docs/architecture/studies.md).
#: How often the beat steps every running study (besides the steps that unit changes and points ring).
XMC_STUDY_TICK_S = env.float("XMC_STUDY_TICK_S", default=5.0)

# System metrics (metrics/system.py, docs/architecture/system_metrics.md).
#: A Prometheus-compatible query API (Prometheus, Google Managed Prometheus, Thanos, VictoriaMetrics)
#: holding the DCGM exporter's and cAdvisor's series of the cluster; "" turns system metrics off.
XMC_PROMETHEUS_URL = env.str("XMC_PROMETHEUS_URL", default="")
XMC_PROMETHEUS_TIMEOUT_S = env.float("XMC_PROMETHEUS_TIMEOUT_S", default=10.0)
#: The window of the CPU counter's rate() (at least two scrapes of it).
XMC_PROMETHEUS_RATE_WINDOW_S = env.int("XMC_PROMETHEUS_RATE_WINDOW_S", default=60)
#: How often the collector records each running execution's system metrics.
XMC_SYSTEM_METRICS_INTERVAL_S = env.float("XMC_SYSTEM_METRICS_INTERVAL_S", default=15.0)
#: GPUs below this utilisation (0-1) for XMC_IDLE_GPU_AFTER_S seconds are idle: a WARNING and WORK_UNIT_IDLE.
XMC_IDLE_GPU_UTIL = env.float("XMC_IDLE_GPU_UTIL", default=0.05)
XMC_IDLE_GPU_AFTER_S = env.float("XMC_IDLE_GPU_AFTER_S", default=900.0)
#: A container whose working set reaches this fraction of its memory limit gets a WARNING.
XMC_MEMORY_NEAR_LIMIT = env.float("XMC_MEMORY_NEAR_LIMIT", default=0.9)

CELERY_BEAT_SCHEDULE = {
    # Notifications: fan out stranded events, send due deliveries, take over expired leases, queued-too-long.
    "notifications-sweep": {"task": "xmc.notifications.sweep", "schedule": XMC_NOTIFY_SWEEP_INTERVAL_S,
                            "options": {"queue": "notifications", "expires": 60}},
    # The one delivery sweep (delivery.sweep): every row committed while the broker was down,
    # or whose lease ran out (a lost message, a dead worker), is sent again, whatever its queue.
    "delivery-sweep": {"task": "xmc.delivery.sweep", "schedule": XMC_OUTBOX_SWEEP_INTERVAL_S,
                       "options": {"queue": "actuator", "expires": 300}},
    "message-purge": {"task": "xmc.delivery.purge", "schedule": 3600.0,
                      "options": {"queue": "actuator", "expires": 300}},
    # Archived pod logs are deleted XMC_LOG_ARCHIVE_RETENTION_DAYS after archiving (0: never).
    "log-archive-purge": {"task": "xmc.logs.purge_archive", "schedule": 3600.0,
                          "options": {"queue": "actuator", "expires": 300}},
    # Done operations are deleted XMC_OPERATION_RETENTION_DAYS after they ended.
    "operation-purge": {"task": "xmc.actuator.purge_operations", "schedule": 3600.0,
                        "options": {"queue": "actuator", "expires": 300}},
    # The points table's daily partitions: created ahead, dropped after XMC_METRICS_RETENTION_DAYS (metrics.tasks).
    "metrics-partitions": {"task": "xmc.metrics.maintain_partitions", "schedule": 3600.0,
                      "options": {"queue": "actuator", "expires": 300}},
    # The collector's pending finest blocks into their coarser sizes (chart reads roll up their own first).
    "metrics-roll-up": {"task": "xmc.metrics.roll_up_blocks", "schedule": XMC_METRICS_ROLL_UP_S,
                        "options": {"queue": "actuator", "expires": XMC_METRICS_ROLL_UP_S}},
    # Each running execution's GPU / CPU / memory use from Prometheus, idle GPUs, memory near its limit.
    "system-metrics": {"task": "xmc.metrics.collect_system", "schedule": XMC_SYSTEM_METRICS_INTERVAL_S,
                       "options": {"queue": "actuator", "expires": XMC_SYSTEM_METRICS_INTERVAL_S}},
    # The mean GPU utilisation of running intervals that ended is stored (usage.tasks).
    "usage-settle": {"task": "xmc.usage.settle", "schedule": 60.0,
                     "options": {"queue": "actuator", "expires": 55}},
    # Processed paused tasks expire 7 days after processing (workunits.resumption).
    # Every running study is stepped at least this often (studies.controller.tick), whatever else rang.
    "study-tick": {"task": "xmc.studies.tick", "schedule": XMC_STUDY_TICK_S,
                   "options": {"queue": "lifecycle", "expires": 60}},
    "paused-task-cleanup": {"task": "xmc.resumption.cleanup", "schedule": 3600.0,
                            "options": {"queue": "resumption", "expires": 300}},
}

# --- REST (DRF) ----------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["xmc.auth.drf.BearerAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_THROTTLE_CLASSES": ["xmc.auth.drf.IdentityRateThrottle"],
    "UNAUTHENTICATED_USER": None,
    # No `?format=` override: an unknown one raised Http404 inside content negotiation (a 500); the logs
    # endpoint has a `format` parameter of its own.
    "URL_FORMAT_OVERRIDE": None,
}
