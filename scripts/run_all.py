"""Run the whole system locally: ``./dev run`` (after ./dev set up services).

Migrates, makes sure an admin user exists, collects static files, then starts
every process the project has — the cluster simulator, the MachineLearningRun
emulator, web (gunicorn with uvicorn workers, xmc/asgi.py; WhiteNoise), gRPC, one Celery worker on every
queue, Celery beat and the reconciler (each only once its command exists) —
and prints the URLs, a bearer token for the admin user and the ``export``
lines a launch script needs.

Everything lives in the run folder (``XMC_RUN_DIR``, default ``.run/``): logs
(``<process>.log``), the simulator's state, a generated secret key, and
``env``, the settings the processes were given, which ``./dev manage`` reads
so management commands talk to the same database and cluster. A second run
reuses all of it.

SIGINT (Ctrl-C), SIGTERM and SIGHUP stop every process it started (each runs
in its own process group, so its children go too), and the embedded Postgres
and Redis that ``./dev run`` started for it (``--stop-postgres DIR``,
``--stop-redis PORT``); a server that was already running when ``./dev run``
began (e.g. the one a ``./dev test`` beside it uses) is never stopped. ``--smoke`` starts everything,
waits until each process answers, prints the URLs and stops again.
"""
from __future__ import annotations

import argparse
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
RUN = Path(os.environ.get("XMC_RUN_DIR") or ROOT / ".run").resolve()
ADMIN_EMAIL = "admin@example.com"


@dataclass
class Process:
    name: str
    argv: list[str]
    url: str = ""
    ready_url: str = ""
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None


class Stop(Exception):
    """Raised by the signal handlers: unwinds into the clean-up."""


def _stop(signum: int, frame: FrameType | None) -> None:
    raise Stop(signal.Signals(signum).name)


def free_port(preferred: int) -> int:
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", preferred)) != 0:
            return preferred
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def manage(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "manage.py"), *args]


def wait_ready(proc: Process, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.popen is not None
        if proc.popen.poll() is not None:
            raise SystemExit(f"{proc.name} exited with {proc.popen.returncode}; see {RUN}/{proc.name}.log")
        if not proc.ready_url:
            return
        try:
            if proc.ready_url.startswith("tcp://"):
                host, port = proc.ready_url[6:].split(":")
                with socket.create_connection((host, int(port)), timeout=1):
                    return
            with urllib.request.urlopen(proc.ready_url, timeout=2) as response:
                if response.status < 500:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{proc.name} did not become ready in {timeout:.0f}s; see {RUN}/{proc.name}.log")


def ensure_database() -> None:
    """Create the configured database when the server has no such database yet."""
    from django.db import connection
    from django.db.utils import OperationalError

    try:
        connection.ensure_connection()
        return
    except OperationalError as exc:
        if "does not exist" not in str(exc):
            raise
    name = connection.settings_dict["NAME"]
    with connection._nodb_cursor() as cursor:  # Django's own way to reach the server's maintenance db
        cursor.execute(f"CREATE DATABASE {connection.ops.quote_name(name)}")
    print(f"run: created database {name!r}", flush=True)


def secret_key() -> str:
    """XMC_SECRET_KEY from the environment, else one generated once and kept."""
    if os.environ.get("XMC_SECRET_KEY"):
        return os.environ["XMC_SECRET_KEY"]
    path = RUN / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(48))
        path.chmod(0o600)
    return path.read_text().strip()


def write_env(env: dict[str, str]) -> None:
    """The settings given to the processes, for ``./dev manage`` (mode 0600)."""
    lines = [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    path = RUN / "env"
    path.write_text("# Written by ./dev run: the settings its processes use.\n" + "\n".join(lines) + "\n")
    path.chmod(0o600)


def plan(commands: dict[str, str], env: dict[str, str]) -> list[Process]:
    """Every process the system has so far, in start order."""
    procs: list[Process] = []
    # The cluster simulator (simulators/cluster) stands in for a cluster locally.
    sim_port = free_port(int(os.environ.get("XMC_SIM_PORT", "6443")))
    kubeconfig = RUN / "kubeconfig"
    procs.append(Process(
        "simulator",
        [sys.executable, "-m", "simulators.cluster", "--port", str(sim_port), "--kubeconfig-out", str(kubeconfig),
         "--state-file", str(RUN / "simcluster.json")],
        url=f"http://127.0.0.1:{sim_port} (kubeconfig {kubeconfig})",
        ready_url=f"http://127.0.0.1:{sim_port}/version",
    ))
    env["KUBECONFIG"] = str(kubeconfig)
    if not os.environ.get("XMC_MLRUN_ENDPOINT"):
        # The MachineLearningRun API emulator stands in for the real service locally.
        mlrun_port = free_port(int(os.environ.get("XMC_MLRUN_EMULATOR_PORT", "8790")))
        procs.append(Process(
            "mlrun", [sys.executable, "-m", "simulators.mlrun", "--port", str(mlrun_port)],
            url=f"http://127.0.0.1:{mlrun_port} (MachineLearningRun emulator; /emulator/runs lists the runs)",
            ready_url=f"http://127.0.0.1:{mlrun_port}/emulator/runs",
        ))
        env["XMC_MLRUN_ENDPOINT"] = f"http://127.0.0.1:{mlrun_port}"
        for name, value in (("XMC_MLRUN_PROJECT", "xmc-local"), ("XMC_MLRUN_LOCATION", "us-central1"),
                            ("XMC_MLRUN_TOKEN", "emulator")):
            env[name] = os.environ.get(name) or value
    web_port = int(env["XMC_API_URL"].rsplit(":", 1)[1])
    # Pods of the simulator run on this machine: they reach the web service at its origin.
    env.setdefault("XMC_METRICS_URL", os.environ.get("XMC_METRICS_URL") or env["XMC_API_URL"])
    procs.append(Process(
        "web",
        [sys.executable, "-m", "gunicorn", "xmc.asgi:application", "--worker-class", "xmc.web_worker.UvicornWorker",
         "--bind", f"127.0.0.1:{web_port}", "--workers", "2", "--graceful-timeout", "10", "--keep-alive", "75", "--access-logfile", "-"],
        url=f"http://127.0.0.1:{web_port}/admin/", ready_url=f"http://127.0.0.1:{web_port}/healthz",
    ))
    if "grpcserver" in commands:
        grpc_port = free_port(int(os.environ.get("XMC_GRPC_PORT", "50051")))
        procs.append(Process(
            "grpc", manage("grpcserver", "--port", str(grpc_port)),
            url=f"http://127.0.0.1:{grpc_port} (XMANAGER_ENDPOINT)", ready_url=f"tcp://127.0.0.1:{grpc_port}",
        ))
        env["XMANAGER_ENDPOINT"] = f"http://127.0.0.1:{grpc_port}"
        # The DashboardService is on the same port; its two clients take a bare host:port
        # (xm_cloud's sends no credentials and is refused; xdash sends XMC_AUTH_TOKEN).
        env["XMANAGER_DASHBOARD_ENDPOINT"] = f"127.0.0.1:{grpc_port}"
        env["XMC_DASHBOARD_ENDPOINT"] = f"127.0.0.1:{grpc_port}"
    if (ROOT / "xmc" / "celery.py").exists():
        procs.append(Process(
            "worker", [sys.executable, "-m", "celery", "-A", "xmc", "worker", "--loglevel=INFO",
                       "-Q", "actuator,lifecycle,resumption,notifications", "--concurrency", "2",
                       "--hostname", "xmc-worker@%h"],
            url="queues actuator, lifecycle, resumption, notifications",
        ))
        procs.append(Process(
            "beat", [sys.executable, "-m", "celery", "-A", "xmc", "beat", "--loglevel=INFO",
                     "--schedule", str(RUN / "celerybeat-schedule")],
            url="periodic sweeps and clean-ups",
        ))
    if "reconcile" in commands:
        metrics_port = free_port(int(os.environ.get("XMC_RECONCILER_METRICS_PORT", "9108")))
        procs.append(Process(
            "reconciler", manage("reconcile", "--metrics-port", str(metrics_port)),
            url=f"http://127.0.0.1:{metrics_port}/metrics", ready_url=f"http://127.0.0.1:{metrics_port}/metrics",
        ))
    return procs


def stop_all(procs: list[Process]) -> None:
    for proc in procs:
        if proc.popen is not None and proc.popen.poll() is None:
            try:
                os.killpg(proc.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 20
    for proc in procs:
        if proc.popen is None:
            continue
        try:
            proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:  # the group may outlive its leader (e.g. a worker's pool)
            os.killpg(proc.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def stop_embedded_services(postgres_dir: str, redis_port: str) -> None:
    """Stop the embedded Postgres / Redis that ./dev started for this run (and only those)."""
    script = ROOT / "scripts" / "devservices.py"
    if redis_port:
        subprocess.run([sys.executable, str(script), "stop-redis", redis_port], check=False, timeout=30)
    if postgres_dir:
        subprocess.run([sys.executable, str(script), "stop-postgres", postgres_dir], check=False, timeout=60)


def print_welcome(procs: list[Process], env: dict[str, str], token: str) -> None:
    api = env["XMC_API_URL"]
    print(f"\nrun: admin           {api}/admin/  (user 'admin')", flush=True)
    print(f"run: REST API docs   {api}/v1/docs", flush=True)
    print(f"run: experiments     {api}/experiments  (the researcher's pages)", flush=True)
    print(f"run: bearer token for {ADMIN_EMAIL} (staff):\n{token}\n", flush=True)
    print("run: paste these into the shell that runs your launch script:", flush=True)
    exports = {
        "XMANAGER_ENDPOINT": env.get("XMANAGER_ENDPOINT", ""),
        "XMANAGER_DASHBOARD_ENDPOINT": env.get("XMANAGER_DASHBOARD_ENDPOINT", ""),
        "XMC_DASHBOARD_ENDPOINT": env.get("XMC_DASHBOARD_ENDPOINT", ""),
        "XMC_AUTH_TOKEN": token,
        "XMC_API_URL": api,
        "XMANAGER_UI_URL": api,  # the researcher's pages: the client prints $XMANAGER_UI_URL/experiments/<xid>
        "KUBECONFIG": env.get("KUBECONFIG", ""),
    }
    for key, value in exports.items():
        if value:
            print(f"export {key}={shlex.quote(value)}", flush=True)
    if os.environ.get("EMAIL_HOST"):
        mail = f"SMTP {os.environ['EMAIL_HOST']}:{os.environ.get('EMAIL_PORT', '25')}"
    else:
        mail = f"files in {os.environ.get('EMAIL_FILE_PATH') or RUN / 'mail'} (set EMAIL_HOST for SMTP)"
    print(f"\nrun: notification emails: {mail}", flush=True)
    print(f"run: the researcher's command line, with the same exports: pip install {ROOT / 'clients' / 'python'} "
          "(Python >= 3.10), then `xmc list`, `xmc status <xid>`, `xmc why <xid>/<wid>`, `xmc logs -f <xid>/<wid>`, "
          "`xmc watch <xid>` (docs/architecture/cli.md)", flush=True)
    print(f"\nrun: logs in {RUN}/*.log; `./dev manage <command>` talks to this system; "
          "Ctrl-C (or SIGTERM) stops everything", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="start, check, print and stop")
    parser.add_argument("--stop-postgres", default="", metavar="DIR",
                        help="stop the embedded Postgres in DIR on exit (./dev run passes it when it started it)")
    parser.add_argument("--stop-redis", default="", metavar="PORT",
                        help="stop the embedded Redis on PORT on exit (likewise)")
    args = parser.parse_args()
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _stop)

    RUN.mkdir(parents=True, exist_ok=True)
    procs: list[Process] = []
    try:
        web_port = free_port(int(os.environ.get("XMC_WEB_PORT", "8000")))
        env = {"XMC_API_URL": f"http://127.0.0.1:{web_port}", "XMC_SECRET_KEY": secret_key()}
        env.setdefault("XMC_PUBLIC_URL", os.environ.get("XMC_PUBLIC_URL") or env["XMC_API_URL"])  # links in notifications
        for key in ("DATABASE_URL", "REDIS_URL"):
            # Embedded services are found again by ./dev; explicit ones are kept.
            embedded = os.environ.get("XMC_DEV_EMBEDDED_PG" if key == "DATABASE_URL" else "XMC_DEV_EMBEDDED_REDIS")
            if os.environ.get(key) and not embedded:
                env[key] = os.environ[key]
        os.environ.update(env)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "xmc.settings")
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from django.core.management import call_command, get_commands

        ensure_database()
        print("run: migrating the database", flush=True)
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        token = ensure_admin()

        procs = plan(get_commands(), env)
        write_env(env)
        child_env = {**os.environ, **env}
        for proc in procs:
            log = open(RUN / f"{proc.name}.log", "ab")  # noqa: SIM115 - lives as long as the child
            proc.popen = subprocess.Popen(proc.argv, cwd=ROOT, env={**child_env, **proc.env}, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
            wait_ready(proc)
            print(f"run: {proc.name:<10} up  {proc.url}", flush=True)
        print_welcome(procs, env, token)
        if args.smoke:
            return 0
        while all(p.popen is not None and p.popen.poll() is None for p in procs):
            time.sleep(1)
        dead = [p.name for p in procs if p.popen is not None and p.popen.poll() is not None]
        print(f"run: {', '.join(dead)} exited; stopping the rest (see {RUN}/*.log)", flush=True)
        return 1
    except Stop as why:
        print(f"run: {why}: stopping", flush=True)
        return 0
    finally:
        # No second signal may interrupt the clean-up.
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)
        stop_all(procs)
        stop_embedded_services(args.stop_postgres, args.stop_redis)


def ensure_admin() -> str:
    """The admin user (staff) and a bearer token for it."""
    from django.contrib.auth import get_user_model

    from xmc.auth.tokens import issue_token

    User = get_user_model()
    password = os.environ.get("XMC_ADMIN_PASSWORD", "admin")
    if not User.objects.filter(username="admin").exists():
        User.objects.create_superuser("admin", ADMIN_EMAIL, password)
        print(f"run: created admin user 'admin' (password {password!r}; set XMC_ADMIN_PASSWORD to choose)")
    return issue_token(ADMIN_EMAIL)


if __name__ == "__main__":
    sys.exit(main())
