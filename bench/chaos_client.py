"""The chaos suite's launch script: the real xmanager client, driven by bench/chaos.py.

Runs in the client's own virtualenv (``xmanager==0.8.5.post1``,
tests/system/real_client/client_env.py), never in the server's, and imports
nothing of XMC: what reaches the server is what ``xmanager.xm_cloud`` builds
and sends. bench/chaos.py starts it with the client's environment
(``XMANAGER_ENDPOINT``, ``XMC_AUTH_TOKEN``, a private HOME, a cwd outside any
git repository) and talks to it in JSON lines: a command per line on stdin
(``{"id": 1, "op": "add", ...}``), one answer per command on stdout, prefixed
``CHAOS: `` (the client prints its own lines there too), in any order, the
commands being carried out concurrently:

* ``create_experiment {title}`` -> ``{xid}``: ``xm_cloud.create_experiment``,
  then the experiment's ``with`` block is entered (it is left by ``close``);
* ``add {script, cpu, priority, queue, tags}`` -> ``{wid}``: ``experiment.add``
  of one ``xm.Job`` (a ``GoogleContainerRegistryImage``, a
  ``KubernetesJobExecutor`` with the simulator's ``sim.xmc.dev/script``
  annotation, ``cpu`` cores and 256 MiB, one replica, retry limit 1) with
  ``WorkUnitSettings`` (the tags; ``priority`` and ``queue``, when given, as
  ``xm_cloud.Priority`` and ``SchedulingConstraints``); the wid is the one the
  client's id predictor reserved;
* ``state {wid}`` -> ``{state, eid}``: ``xm_cloud.get_work_unit``;
* ``stop {tag}`` / ``restart {tag}`` -> ``{operation}``: ``BatchStopWorkUnits``
  / ``BatchRestartWorkUnits`` through the client's ``ExperimentStateGRpcApi``
  (what ``xmanager stop`` / ``xmanager restart`` send) with the filter
  ``tags:"<tag>"``: the client has no single-unit stop or restart;
* ``close`` -> ``{}``: leaves the ``with`` block (the client waits for its
  launches and marks the launch COMPLETED), then the script exits.

The client has no retry policy of its own: under a fault one of its calls
fails (UNAVAILABLE while the gRPC server is down or the database is, the
call that was in flight when the server died) and a plain launch script
dies with it. This one does what an operator re-running the script would
get, inside the script: it puts a gRPC client interceptor (`Retrying`) on
the client's channel that sends a call again, the same request, while it
answers UNAVAILABLE, DEADLINE_EXCEEDED or RESOURCE_EXHAUSTED (backing off
from 0.2 s to 3 s, for at most `RETRY_FOR_S`; each attempt of a call the
client sent without a deadline gets `ATTEMPT_TIMEOUT_S`). That is safe for
every call it makes but one: reads are reads, ``CreateWorkUnit`` is
idempotent on its work_unit_id (the predictor's, so a retry after a lost
answer gets the first try's operation, never a second work unit), and a
batch stop skips the units already stopping. A batch restart is not: a
second one would start a third execution. So ``BatchRestartWorkUnits`` is
never resent blindly: after a lost answer the ``restart`` command lists the
targets, and as the batch is all or nothing, it is done if they all moved to
a new execution and sent again if none did.
"""
from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from xmanager import xm, xm_cloud
from xmanager.xm_local import executables
from xmanager_cloud.experiment_state_server import experiment_state_api
from xmanager_cloud.experiment_state_server.proto import api_pb2, api_pb2_grpc, status_pb2

PREFIX = "CHAOS: "
#: How long a call is sent again while it answers a transient error.
RETRY_FOR_S = 240.0
#: The deadline of each attempt of a call the client sent without one (it sets none).
ATTEMPT_TIMEOUT_S = 30.0
TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)
#: Not resent by the interceptor: not idempotent (see the module docstring).
NOT_RETRIED = {"BatchRestartWorkUnits"}


class Retrying(grpc.UnaryUnaryClientInterceptor):
    """Sends a call again while it answers a transient error (the client's channel has no retry policy)."""

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        method = details.method.rsplit("/", 1)[-1]
        if method in NOT_RETRIED:
            return continuation(details, request)
        if details.timeout is None:
            details = details._replace(timeout=ATTEMPT_TIMEOUT_S)
        deadline = time.monotonic() + RETRY_FOR_S
        delay = 0.2
        tries = 1
        while True:
            outcome = continuation(details, request)
            if outcome.exception() is None or outcome.code() not in TRANSIENT or time.monotonic() > deadline:
                if tries > 1:
                    log(f"{method}: {outcome.code().name} after {tries} tries")
                return outcome
            if tries == 1:
                log(f"{method}: {outcome.code().name}, sending it again")
            time.sleep(delay)
            delay = min(delay * 2, 3.0)
            tries += 1


def log(line: str) -> None:
    sys.stderr.write(f"chaos_client: {line}\n")  # one write: the threads' lines never interleave
    sys.stderr.flush()


class Driver:
    def __init__(self) -> None:
        self.api = experiment_state_api.get_experiment_state_api()  # the client's own, cached: every call uses it
        # The client's channel (its auth interceptor inside), wrapped once more by the retrying one.
        self.api._stub = api_pb2_grpc.ExperimentStateServiceStub(  # noqa: SLF001
            grpc.intercept_channel(self.api._channel, Retrying()))  # noqa: SLF001
        self.experiment: Any = None
        self.add_lock = threading.Lock()
        self.out_lock = threading.Lock()

    # -- commands ----------------------------------------------------------------------------------

    def create_experiment(self, title: str) -> dict[str, Any]:
        self.experiment = xm_cloud.create_experiment(experiment_title=title)
        self.experiment.__enter__()
        return {"xid": self.experiment.id}

    def add(self, script: str, cpu: float, tags: list[str], priority: str = "", queue: str = "") -> dict[str, Any]:
        job = xm.Job(
            executable=executables.GoogleContainerRegistryImage(name="main", image_path="gcr.io/chaos/job:v1"),
            executor=xm_cloud.KubernetesJobExecutor(
                requirements=xm.JobRequirements(cpu=cpu, memory=256 * xm.MiB, replicas=1),
                replica_retry_limit=1,
                annotations={"sim.xmc.dev/script": script},
            ),
            name="main",
        )
        settings = xm_cloud.WorkUnitSettings(tags=tags)
        if priority:
            settings.priority = xm_cloud.Priority.Value(priority)
        if queue:
            settings.scheduling_constraints = xm_cloud.SchedulingConstraints(queue_name=queue)
        with self.add_lock:  # the predictor reserves wids in add() order
            launched = self.experiment.add(job, settings=settings)

        async def launch() -> Any:
            return await launched

        work_unit = asyncio.run_coroutine_threadsafe(launch(), self.experiment._event_loop).result()  # noqa: SLF001
        return {"wid": work_unit.work_unit_id}

    def state(self, wid: int) -> dict[str, Any]:
        proto = xm_cloud.get_work_unit(self.experiment.id, wid).work_unit_proto
        execution = proto.current_work_unit_execution
        return {"state": status_pb2.WorkUnitStatus.WorkUnitState.Name(execution.status.state),
                "eid": int(execution.name.rsplit("/", 1)[-1]) if execution.name else 0}

    def stop(self, tag: str) -> dict[str, Any]:
        op = self.api.batch_stop_work_units(api_pb2.BatchStopWorkUnitsRequest(
            parent=self.experiment.resource_name, filter=f'tags:"{tag}"'))
        return {"operation": op.name}

    def restart(self, tag: str) -> dict[str, Any]:
        request = api_pb2.BatchRestartWorkUnitsRequest(parent=self.experiment.resource_name, filter=f'tags:"{tag}"')
        before = self._eids(tag)
        while True:
            try:
                return {"operation": self.api.batch_restart_work_units(request).name}
            except grpc.RpcError as exc:
                if exc.code() not in TRANSIENT:
                    raise
                log(f"BatchRestartWorkUnits: {exc.code().name}; was it carried out?")
            time.sleep(1.0)
            now = self._eids(tag)  # read through the retrying channel
            if now == {wid: eid + 1 for wid, eid in before.items()}:
                log("BatchRestartWorkUnits: it was (every target on a new execution)")
                return {"operation": ""}
            if now != before:
                raise RuntimeError(f"BatchRestartWorkUnits half done? executions {before} -> {now}")

    def _eids(self, tag: str) -> dict[int, int]:
        eids: dict[int, int] = {}
        token = ""
        while True:
            page = self.api.list_work_units(api_pb2.ListWorkUnitsRequest(
                parent=self.experiment.resource_name, filter=f'tags:"{tag}"', page_token=token, page_size=100))
            for unit in page.work_units:
                name = unit.current_work_unit_execution.name
                eids[int(unit.name.rsplit("/", 1)[-1])] = int(name.rsplit("/", 1)[-1]) if name else 0
            token = page.next_page_token
            if not token:
                return eids

    def close(self) -> dict[str, Any]:
        if self.experiment is not None:
            self.experiment.__exit__(None, None, None)
        return {}

    # -- the loop ----------------------------------------------------------------------------------

    def answer(self, reply: dict[str, Any]) -> None:
        with self.out_lock:
            sys.stdout.write(PREFIX + json.dumps(reply) + "\n")
            sys.stdout.flush()

    def serve(self, command: dict[str, Any]) -> None:
        cid, op = command.pop("id"), command.pop("op")
        try:
            reply = {"id": cid, **getattr(self, op)(**command)}
        except grpc.RpcError as exc:
            reply = {"id": cid, "error": f"{exc.code().name}: {exc.details()}"}
        except Exception as exc:  # noqa: BLE001 - answered, the harness decides
            log(traceback.format_exc())
            reply = {"id": cid, "error": f"{type(exc).__name__}: {exc}"}
        self.answer(reply)


def main() -> int:
    driver = Driver()
    pool = ThreadPoolExecutor(max_workers=16)
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "create_experiment":  # first, and on this thread (the with block's)
            driver.serve(command)
        elif command["op"] == "close":  # last: after every other command has been answered
            pool.shutdown(wait=True)
            driver.serve(command)
            return 0
        else:
            pool.submit(driver.serve, command)
    return 1  # stdin closed without a close: the harness is gone


if __name__ == "__main__":
    sys.exit(main())
