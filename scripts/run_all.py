"""Run the whole system locally: ``./dev run`` (after ./dev set up services).

Migrates, makes sure an admin user exists, collects static files, then starts
every process the project has — the cluster simulator, a Prometheus scraping
its metrics (scripts/prometheus.py; when Debian's package is installed), the MachineLearningRun
emulator, web (gunicorn with uvicorn workers, xmc/asgi.py; WhiteNoise), gRPC, one Celery worker on every
queue, Celery beat and the reconciler (each only once its command exists) —
and prints the URLs, a bearer token for the admin user and the ``export``
lines a launch script needs.

Everything lives in the run folder (``XMC_RUN_DIR``, default ``.run/``): logs
(``<process>.log``), the simulator's state, a generated secret key, and
``env``, the settings the processes were given, which ``./dev manage`` reads
so management commands talk to the same database and cluster, and
``ports.json``, the port each process listened on. A second run reuses all of
it: the same ports again when they are free (`stable_port`), so the printed
URLs stay valid across restarts.

SIGINT (Ctrl-C), SIGTERM and SIGHUP stop every process it started (each runs
in its own process group, so its children go too), and the embedded Postgres
and Redis that ``./dev run`` started for it (``--stop-postgres DIR``,
``--stop-redis DIR``); a server that was already running when ``./dev run``
began (e.g. the one a ``./dev test`` beside it uses) is never stopped. ``--smoke`` starts everything,
waits until each process answers, prints the URLs and stops again.

A process that dies is started again (:class:`Restarts`: after 1, 2, 4 ...
seconds, at most ``XMC_RUN_RESTART_MAX_DELAY_S``), each death and restart
logged on the console and in the process's log; the others keep running (a
dead worker's work waits in the outbox and is carried out once it is back).
Only a crash loop, more than ``XMC_RUN_RESTART_LIMIT`` deaths of one process
within ``XMC_RUN_RESTART_WINDOW_S``, stops everything, naming the process
and its log.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from core.signals import TERMINATION, ignore, raise_on  # noqa: E402 - stdlib only; no Django yet
import prometheus  # noqa: E402 - scripts/prometheus.py, beside this file

RUN = Path(os.environ.get("XMC_RUN_DIR") or ROOT / ".run").resolve()
ADMIN_EMAIL = "admin@example.com"


@dataclass
class Restarts:
    """When to start a dead process again, and when to give up (a crash loop). Pure: the caller passes ``now``."""

    limit: int = 5
    window_s: float = 120.0
    base_s: float = 1.0
    max_delay_s: float = 30.0
    deaths: list[float] = field(default_factory=list)

    @classmethod
    def from_env(cls) -> Restarts:
        return cls(limit=int(os.environ.get("XMC_RUN_RESTART_LIMIT", "5")),
                   window_s=float(os.environ.get("XMC_RUN_RESTART_WINDOW_S", "120")),
                   base_s=float(os.environ.get("XMC_RUN_RESTART_BASE_S", "1")),
                   max_delay_s=float(os.environ.get("XMC_RUN_RESTART_MAX_DELAY_S", "30")))

    def died(self, now: float) -> float | None:
        """Record a death; the delay before the restart, or None for a crash loop (stop everything)."""
        self.deaths = [t for t in self.deaths if now - t < self.window_s] + [now]
        if len(self.deaths) > self.limit:
            return None
        return min(self.max_delay_s, self.base_s * 2 ** (len(self.deaths) - 1))


class CrashLoop(Exception):
    """A process keeps dying: the message names it and its log."""


@dataclass
class Process:
    name: str
    argv: list[str]
    url: str = ""
    ready_url: str = ""
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None
    restarts: Restarts = field(default_factory=Restarts.from_env)
    #: monotonic time of the restart this dead process waits for (None: running)
    restart_at: float | None = None


class Stop(Exception):
    """Raised by the signal handlers: unwinds into the clean-up."""


def _stop(signum: int) -> Stop:
    return Stop(signal.Signals(signum).name)


#: The ports this machine's runs have chosen, ``{port: pid of the run}``, kept while that run lives. A port
#: is chosen seconds before its process binds it (each process waits for the one before it): two runs
#: started together (two checkouts) both found the default 9090 free, and the second's Prometheus died.
CLAIMS = Path(os.environ.get("XMC_PORT_CLAIMS") or Path(tempfile.gettempdir()) / "xmc-port-claims.json")


def _in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _choose(preferred: int, claims: dict[int, int], mine: int) -> int:
    port = preferred
    while _in_use(port) or claims.get(port, mine) != mine:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
    return port


def free_port(preferred: int) -> int:
    """``preferred`` when nothing listens on it and no other live run chose it, else a free port; either way
    claimed for this process in `CLAIMS` (under a lock), so no other run takes it before its process binds.
    Where the claims cannot be written (another user's file), the port is chosen as if there were none."""
    mine = os.getpid()
    try:
        lock = open(CLAIMS.with_suffix(".lock"), "a")  # noqa: SIM115 - closed below
    except OSError:
        return _choose(preferred, {}, mine)
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            loaded = json.loads(CLAIMS.read_text())
        except (OSError, ValueError):
            loaded = {}
        claims = {int(port): pid for port, pid in loaded.items()
                  if str(port).isdigit() and isinstance(pid, int) and (pid == mine or _alive(pid))}
        port = _choose(preferred, claims, mine)
        claims[port] = mine
        part = CLAIMS.with_suffix(f".{mine}.part")
        try:
            part.write_text(json.dumps({str(k): v for k, v in sorted(claims.items())}))
            part.replace(CLAIMS)
        except OSError:
            pass
        return port


PORTS = RUN / "ports.json"


def stable_port(name: str, setting: str, default: int) -> int:
    """The port of process ``name``: the one it had last time in this run folder, when free.

    An explicit ``setting`` (e.g. ``XMC_WEB_PORT``) wins; otherwise the port
    recorded in ``ports.json`` by the previous run, else ``default``. When that
    one is taken a free port is chosen, and whatever is chosen is recorded, so
    a restart keeps the URLs it printed (exports, bookmarks, links in e-mails)
    as long as nothing else has taken them meanwhile.
    """
    try:
        recorded: dict[str, int] = json.loads(PORTS.read_text())
    except (OSError, ValueError):
        recorded = {}
    preferred = int(os.environ.get(setting) or recorded.get(name) or default)
    port = free_port(preferred)
    PORTS.write_text(json.dumps({**recorded, name: port}, indent=1, sort_keys=True) + "\n")
    return port


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
    sim_port = stable_port("simulator", "XMC_SIM_PORT", 6443)
    kubeconfig = RUN / "kubeconfig"
    procs.append(Process(
        "simulator",
        [sys.executable, "-m", "simulators.cluster", "--port", str(sim_port), "--kubeconfig-out", str(kubeconfig),
         "--state-file", str(RUN / "simcluster.json")],
        url=f"http://127.0.0.1:{sim_port} (kubeconfig {kubeconfig})",
        ready_url=f"http://127.0.0.1:{sim_port}/version",
    ))
    env["KUBECONFIG"] = str(kubeconfig)
    # A real Prometheus scrapes the simulator's GPU / container metrics; XMC reads it (system metrics).
    executable = prometheus.binary()
    if executable is None:
        print("run: no prometheus on PATH (apt-get install prometheus): system metrics are off", flush=True)
    elif not os.environ.get("XMC_PROMETHEUS_URL"):
        prom_port = stable_port("prometheus", "XMC_PROMETHEUS_PORT", 9090)
        config = RUN / "prometheus.yml"
        config.write_text(prometheus.config_text(
            f"http://127.0.0.1:{sim_port}", scrape_interval_s=float(os.environ.get("XMC_PROMETHEUS_SCRAPE_S", "5"))))
        procs.append(Process(
            "prometheus", prometheus.argv(executable, config, RUN / "prometheus", prom_port),
            url=f"http://127.0.0.1:{prom_port} (scrapes the simulator's DCGM / cAdvisor metrics)",
            ready_url=f"http://127.0.0.1:{prom_port}/-/ready",
        ))
        env["XMC_PROMETHEUS_URL"] = f"http://127.0.0.1:{prom_port}"
    if not os.environ.get("XMC_MLRUN_ENDPOINT"):
        # The MachineLearningRun API emulator stands in for the real service locally.
        mlrun_port = stable_port("mlrun", "XMC_MLRUN_EMULATOR_PORT", 8790)
        procs.append(Process(
            "mlrun", [sys.executable, "-m", "simulators.mlrun", "--port", str(mlrun_port),
                      "--state-file", str(RUN / "mlrun.json")],
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
        grpc_port = stable_port("grpc", "XMC_GRPC_PORT", 50051)
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
        metrics_port = stable_port("reconciler", "XMC_RECONCILER_METRICS_PORT", 9108)
        procs.append(Process(
            "reconciler", manage("reconcile", "--metrics-port", str(metrics_port)),
            url=f"http://127.0.0.1:{metrics_port}/metrics", ready_url=f"http://127.0.0.1:{metrics_port}/metrics",
        ))
    return procs


def start(proc: Process, env: dict[str, str]) -> None:
    log = open(RUN / f"{proc.name}.log", "ab")  # noqa: SIM115 - lives as long as the child
    proc.popen = subprocess.Popen(proc.argv, cwd=ROOT, env={**env, **proc.env}, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)


def _note(proc: Process, line: str) -> None:
    """A line on the console and in the process's own log (where its next lines will follow)."""
    print(f"run: {line}", flush=True)
    with open(RUN / f"{proc.name}.log", "a") as log:
        log.write(f"\n=== run_all {time.strftime('%Y-%m-%d %H:%M:%S')}: {line}\n")


#: The processes that are down right now (died, waiting for their restart), for the pages' banner
#: (``ui.context``, which reads it from the run folder): ``{name: {"since": epoch s, "log": path}}``.
DOWN_FILE = "down.json"


def mark_down(name: str, down: bool) -> None:
    """Add or remove ``name`` in the run folder's `DOWN_FILE` (written whole, then renamed)."""
    path = RUN / DOWN_FILE
    try:
        now_down = json.loads(path.read_text())
    except (OSError, ValueError):
        now_down = {}
    if down:
        now_down[name] = {"since": time.time(), "log": str(RUN / f"{name}.log")}
    else:
        now_down.pop(name, None)
    part = path.with_suffix(".part")
    part.write_text(json.dumps(now_down))
    part.replace(path)


def supervise(procs: list[Process], env: dict[str, str], *, tick_s: float = 0.5) -> None:
    """Keep every process up: restart one that died after its back-off; raise CrashLoop for a crash loop."""
    (RUN / DOWN_FILE).unlink(missing_ok=True)  # a fresh run: nothing is down
    while True:
        now = time.monotonic()
        for proc in procs:
            assert proc.popen is not None
            if proc.restart_at is None and proc.popen.poll() is not None:
                code = proc.popen.returncode
                delay = proc.restarts.died(now)
                if delay is None:
                    raise CrashLoop(
                        f"{proc.name} keeps dying ({len(proc.restarts.deaths)} times in "
                        f"{proc.restarts.window_s:.0f} s, last exit code {code}); its log: {RUN}/{proc.name}.log")
                proc.restart_at = now + delay
                mark_down(proc.name, True)
                _note(proc, f"{proc.name} exited with code {code}; restarting it in {delay:.0f} s "
                            f"(log {RUN}/{proc.name}.log)")
            elif proc.restart_at is not None and now >= proc.restart_at:
                proc.restart_at = None
                try:  # what is left of its process group (a worker's pool)
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                start(proc, env)
                mark_down(proc.name, False)
                _note(proc, f"{proc.name} restarted (pid {proc.popen.pid})")
        time.sleep(tick_s)


#: Processes the others talk to (the cluster and the MachineLearningRun stand-ins): stopped last.
BACKENDS = ("simulator", "mlrun")


def stop_all(procs: list[Process]) -> None:
    """SIGTERM every process, the ones that talk to the simulator first, the simulator after them.

    The reconciler gives up its leader lease on the way out; the lease lives in
    the simulator (restored from its state file by the next run). Stopped at
    the same moment, the reconciler found the simulator gone, the lease stayed
    held, and the next run's reconciler waited it out (15 s): a short job
    launched right after the restart was first seen COMPLETED, its STARTING and
    RUNNING never written.
    """
    for wave in ([p for p in procs if p.name not in BACKENDS], [p for p in procs if p.name in BACKENDS]):
        deadline = time.monotonic() + 20
        for proc in wave:
            if proc.popen is not None and proc.popen.poll() is None:
                try:
                    os.killpg(proc.popen.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in wave:
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


def stop_embedded_services(postgres_dir: str, redis_dir: str) -> None:
    """Stop the embedded Postgres / Redis that ./dev started for this run (and only those)."""
    script = ROOT / "scripts" / "devservices.py"
    if redis_dir:
        subprocess.run([sys.executable, str(script), "stop-redis", redis_dir], check=False, timeout=30)
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
    parser.add_argument("--stop-redis", default="", metavar="DIR",
                        help="stop the run folder's embedded Redis of DIR on exit (likewise)")
    args = parser.parse_args()
    raise_on(TERMINATION, _stop)

    RUN.mkdir(parents=True, exist_ok=True)
    procs: list[Process] = []
    try:
        web_port = stable_port("web", "XMC_WEB_PORT", 8000)
        env = {"XMC_API_URL": f"http://127.0.0.1:{web_port}", "XMC_SECRET_KEY": secret_key()}
        env.setdefault("XMC_PUBLIC_URL", os.environ.get("XMC_PUBLIC_URL") or env["XMC_API_URL"])  # links in notifications
        for key in ("DATABASE_URL", "REDIS_URL"):
            # Embedded services are found again by ./dev; explicit ones are kept.
            embedded = os.environ.get("XMC_DEV_EMBEDDED_PG" if key == "DATABASE_URL" else "XMC_DEV_EMBEDDED_REDIS")
            if os.environ.get(key) and not embedded:
                env[key] = os.environ[key]
        os.environ.update(env)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "xmc.settings")
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
            start(proc, child_env)
            wait_ready(proc)
            print(f"run: {proc.name:<10} up  {proc.url}", flush=True)
        print_welcome(procs, env, token)
        if args.smoke:
            return 0
        try:
            supervise(procs, child_env)
        except CrashLoop as loop:
            print(f"run: {loop}; stopping everything", flush=True)
            return 1
        return 1  # not reached: supervise returns only by an exception
    except Stop as why:
        print(f"run: {why}: stopping", flush=True)
        return 0
    finally:
        ignore(TERMINATION)  # no second signal may interrupt the clean-up
        stop_all(procs)
        (RUN / DOWN_FILE).unlink(missing_ok=True)
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
