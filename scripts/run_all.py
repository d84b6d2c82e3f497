"""Run the whole system locally: ``./dev run`` (after ./dev set up services).

Migrates, makes sure an admin user exists, then starts every process the
project has (web, gRPC, cluster simulator, MachineLearningRun emulator,
worker, reconciler — each only once its management command exists), prints
the URLs and waits. Ctrl-C stops everything. ``--smoke`` starts everything, waits until each process
answers, prints the URLs and stops again (used by the tests).
"""
from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / ".run"


@dataclass
class Process:
    name: str
    argv: list[str]
    url: str = ""
    ready_url: str = ""
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None


def free_port(preferred: int) -> int:
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", preferred)) != 0:
            return preferred
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def manage(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "manage.py"), *args]


def wait_ready(proc: Process, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.popen is not None
        if proc.popen.poll() is not None:
            raise SystemExit(f"{proc.name} exited with {proc.popen.returncode}; see .run/{proc.name}.log")
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
    raise SystemExit(f"{proc.name} did not become ready in {timeout:.0f}s; see .run/{proc.name}.log")


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


def dev_secret_key() -> str:
    """The random ``XMC_SECRET_KEY`` of this checkout's dev runs, created once in ``.run/secret_key``."""
    path = RUN / "secret_key"
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(48))
    return path.read_text().strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="start, check, print and stop")
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "xmc.settings")
    sys.path.insert(0, str(ROOT))
    RUN.mkdir(exist_ok=True)
    # Servers refuse the public default secret (xmc.checks): keep one random
    # key per checkout, so tokens issued by an earlier run stay valid.
    os.environ.setdefault("XMC_SECRET_KEY", dev_secret_key())
    import django

    django.setup()
    from django.core.management import call_command, get_commands

    ensure_database()
    print("run: migrating the database", flush=True)
    call_command("migrate", interactive=False, verbosity=0)
    from django.contrib.auth import get_user_model

    User = get_user_model()
    password = os.environ.get("XMC_ADMIN_PASSWORD", "admin")
    if not User.objects.filter(username="admin").exists():
        User.objects.create_superuser("admin", "admin@example.com", password)
        print(f"run: created admin user 'admin' (password {password!r}; set XMC_ADMIN_PASSWORD to choose)")

    commands = get_commands()
    web_port = free_port(int(os.environ.get("XMC_WEB_PORT", "8000")))
    env = {"XMC_API_URL": f"http://127.0.0.1:{web_port}"}
    procs: list[Process] = []
    kubeconfig = RUN / "kubeconfig"
    if "simcluster" in commands:
        sim_port = free_port(int(os.environ.get("XMC_SIM_PORT", "6443")))
        procs.append(Process(
            "simulator",
            manage("simcluster", "--port", str(sim_port), "--kubeconfig-out", str(kubeconfig),
                   "--state-file", str(RUN / "simcluster.json")),
            url=f"http://127.0.0.1:{sim_port} (kubeconfig {kubeconfig})",
            ready_url=f"http://127.0.0.1:{sim_port}/version",
        ))
        env["KUBECONFIG"] = str(kubeconfig)
    if "mlrun_emulator" in commands and not os.environ.get("XMC_MLRUN_ENDPOINT"):
        # The MachineLearningRun API emulator stands in for the real service locally.
        mlrun_port = free_port(int(os.environ.get("XMC_MLRUN_EMULATOR_PORT", "8790")))
        procs.append(Process(
            "mlrun", manage("mlrun_emulator", "--port", str(mlrun_port)), url=f"http://127.0.0.1:{mlrun_port}",
            ready_url=f"http://127.0.0.1:{mlrun_port}/emulator/runs",
        ))
        env["XMC_MLRUN_ENDPOINT"] = f"http://127.0.0.1:{mlrun_port}"
        for name, value in (("XMC_MLRUN_PROJECT", "xmc-local"), ("XMC_MLRUN_LOCATION", "us-central1"),
                            ("XMC_MLRUN_TOKEN", "emulator")):
            env[name] = os.environ.get(name) or value
    procs.append(Process(
        "web", manage("runserver", f"127.0.0.1:{web_port}", "--noreload"),
        url=f"http://127.0.0.1:{web_port}/admin/", ready_url=f"http://127.0.0.1:{web_port}/healthz",
    ))
    if "grpcserver" in commands:
        grpc_port = free_port(int(os.environ.get("XMC_GRPC_PORT", "50051")))
        procs.append(Process(
            "grpc", manage("grpcserver", "--port", str(grpc_port)),
            url=f"http://127.0.0.1:{grpc_port} (XMANAGER_ENDPOINT)", ready_url=f"tcp://127.0.0.1:{grpc_port}",
        ))
    if "reconcile" in commands:
        metrics_port = free_port(int(os.environ.get("XMC_RECONCILER_METRICS_PORT", "9108")))
        procs.append(Process(
            "reconciler", manage("reconcile", "--metrics-port", str(metrics_port)),
            url=f"http://127.0.0.1:{metrics_port}/metrics", ready_url=f"http://127.0.0.1:{metrics_port}/metrics",
        ))
    if (ROOT / "xmc" / "celery.py").exists():
        procs.append(Process(
            # -B: beat (the outbox sweep, the operation clean-up) inside the worker.
            "worker", [sys.executable, "-m", "celery", "-A", "xmc", "worker", "-B", "--loglevel=INFO",
                       "-s", str(RUN / "celerybeat-schedule"), "-Q", "actuator,lifecycle,resumption",
                       "--concurrency", "2"],
        ))

    child_env = {**os.environ, **env}
    try:
        for proc in procs:
            log = open(RUN / f"{proc.name}.log", "ab")  # noqa: SIM115 - lives as long as the child
            proc.popen = subprocess.Popen(proc.argv, cwd=ROOT, env=child_env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
            wait_ready(proc)
            print(f"run: {proc.name:<10} up  {proc.url}", flush=True)
        print("run: logs in .run/*.log; Ctrl-C stops everything", flush=True)
        if args.smoke:
            return 0
        while all(p.popen is not None and p.popen.poll() is None for p in procs):
            time.sleep(1)
        dead = [p.name for p in procs if p.popen is not None and p.popen.poll() is not None]
        print(f"run: {', '.join(dead)} exited; stopping the rest (see .run/*.log)", flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for proc in procs:
            if proc.popen is not None and proc.popen.poll() is None:
                os.killpg(proc.popen.pid, signal.SIGTERM)
        for proc in procs:
            if proc.popen is not None:
                try:
                    proc.popen.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.popen.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
