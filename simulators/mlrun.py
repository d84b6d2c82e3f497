"""An emulator of the MachineLearningRun REST API (hypercomputecluster v1alpha).

A test double, like the cluster simulator beside it: the lifecycle talks to
it through the same client (``lifecycle.mlrun_client``) and the same settings
(``XMC_MLRUN_ENDPOINT=http://127.0.0.1:P``, any project and location) as to
the real service. Production code never imports this module.

What it reproduces (the public API shape, see docs/architecture/lifecycle.md):

* ``POST .../machineLearningRuns?machineLearningRunId=ID`` (create),
  ``GET`` (get, list), ``PATCH ...?updateMask=*`` (update; only ``*`` is
  accepted, the etag in the body must match), ``DELETE ...?force=`` (delete);
  create, update and delete answer with a long-running operation that is
  done after ``op_polls`` polls of ``GET .../operations/{id}``;
* a fresh etag (a bare UUID) on every write; ``state`` derived from
  ``runPhase``; ``endTime`` on terminal phases; ``createTime`` / ``updateTime``;
* the error shape ``{"error": {"code", "message", "status"}}``: NOT_FOUND
  (404), ALREADY_EXISTS (409) on create, ABORTED (409) on an etag mismatch,
  INVALID_ARGUMENT (400), UNAUTHENTICATED (401) without a bearer token.

Tests inject faults (``EmulatorHandle.inject`` or ``POST /emulator/faults``):
an error answer (directly or as a failed operation), or a ``touch`` that
changes the run's etag just before the request (a concurrent writer), for the
next ``times`` matching requests. ``GET /emulator/runs`` and
``GET /emulator/requests`` show what was stored and asked.

``python -m simulators.mlrun [--port P] [--host H] [--op-polls N] [--state-file F]``
serves it in the foreground (``./dev run`` does, with ``--state-file
<run>/mlrun.json``, and points ``XMC_MLRUN_ENDPOINT`` at it); tests start
`run_emulator` in-process. The runs live in memory and, with a state file,
are written there after every write and read back at start, so a restart of
``./dev run`` keeps them (operations are short-lived and are not kept).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from simulators.serving import fail, serve_until_signal

_HTTP = {"INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403,
         "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "ABORTED": 409, "RESOURCE_EXHAUSTED": 429, "INTERNAL": 500,
         "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504}
_CODE = {"INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7,
         "RESOURCE_EXHAUSTED": 8, "FAILED_PRECONDITION": 9, "ABORTED": 10, "INTERNAL": 13, "UNAVAILABLE": 14,
         "UNAUTHENTICATED": 16}
_RUNS = re.compile(r"^/v1alpha/(projects/[^/]+/locations/[^/]+)/machineLearningRuns$")
_RUN = re.compile(r"^/v1alpha/(projects/[^/]+/locations/[^/]+/machineLearningRuns/[^/]+)$")
_OPERATION = re.compile(r"^/v1alpha/(projects/[^/]+/locations/[^/]+/operations/[^/]+)$")
_ID = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")
PHASES = ("RUN_PHASE_UNSPECIFIED", "ACTIVE", "COMPLETED", "FAILED")
ORCHESTRATORS = ("GCE", "GKE", "SLURM")
ZERO_TIME = "0001-01-01T00:00:00Z"


class ApiError(Exception):
    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"error": {"code": _HTTP.get(self.status, 500), "message": self.message, "status": self.status}}


@dataclass
class Fault:
    """The next ``times`` requests matching ``method`` and ``path_contains`` misbehave."""

    method: str = ""
    path_contains: str = ""
    status: str = "UNAVAILABLE"
    message: str = "injected fault"
    times: int = 1
    #: "error": answer with the error; "operation": accept, then fail the LRO;
    #: "touch": change the run's etag first (a concurrent writer), then serve.
    action: str = "error"

    def matches(self, method: str, path: str) -> bool:
        return self.times > 0 and (not self.method or self.method == method) and self.path_contains in path


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass
class MLRunEmulator:
    """The stored runs and operations, and the API's rules; HTTP-free (the handler adapts it)."""

    op_polls: int = 1
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: where the runs are kept across restarts (None: memory only)
    state_file: Path | None = None

    # --- state across restarts -----------------------------------------------------------

    def load(self) -> None:
        """The runs the state file holds (none when it is missing or unreadable)."""
        if self.state_file is None:
            return
        try:
            runs = json.loads(self.state_file.read_text())["runs"]
        except (OSError, ValueError, KeyError, TypeError):
            return
        with self.lock:
            self.runs.update({str(name): dict(run) for name, run in runs.items()})

    def _save(self) -> None:
        """Write the runs (under the lock), atomically: a crash leaves the old file or the new one."""
        if self.state_file is None:
            return
        temporary = self.state_file.with_name(self.state_file.name + ".tmp")
        temporary.write_text(json.dumps({"runs": self.runs}, sort_keys=True))
        os.replace(temporary, self.state_file)

    # --- test controls -----------------------------------------------------------------

    def inject(self, fault: Fault) -> None:
        with self.lock:
            self.faults.append(fault)

    def reset(self) -> None:
        with self.lock:
            self.runs.clear()
            self.operations.clear()
            self.faults.clear()
            self.requests.clear()
            self._save()

    def run_by_id(self, run_id: str) -> dict[str, Any] | None:
        with self.lock:
            for name, run in self.runs.items():
                if name.rsplit("/", 1)[-1] == run_id:
                    return dict(run)
        return None

    def touch(self, name: str) -> None:
        """A write by someone else: a new etag and update time."""
        run = self.runs.get(name)
        if run is not None:
            run["etag"] = str(uuid.uuid4())
            run["updateTime"] = _now()

    # --- the API -----------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.requests.append((method, path))
            fault = next((f for f in self.faults if f.matches(method, path)), None)
            failed_operation = None
            if fault is not None:
                fault.times -= 1
                if fault.action == "error":
                    raise ApiError(fault.status, fault.message)
                if fault.action == "touch":
                    match = _RUN.match(path)
                    if match:
                        self.touch(match.group(1))
                if fault.action == "operation":
                    failed_operation = ApiError(fault.status, fault.message)
            answer = self._route(method, path, query, body, failed_operation)
            if method in ("POST", "PATCH", "DELETE"):
                self._save()
            return answer

    def _route(self, method: str, path: str, query: dict[str, str], body: dict[str, Any],
               failed_operation: ApiError | None) -> dict[str, Any]:
        if (match := _RUNS.match(path)) and method == "POST":
            return self._operation(match.group(1), lambda: self._create(match.group(1), query, body), failed_operation)
        if (match := _RUNS.match(path)) and method == "GET":
            return self._list(match.group(1), query)
        if (match := _RUN.match(path)) and method == "GET":
            return dict(self._get(match.group(1)))
        if (match := _RUN.match(path)) and method == "PATCH":
            name = match.group(1)
            return self._operation(_parent(name), lambda: self._update(name, query, body), failed_operation)
        if (match := _RUN.match(path)) and method == "DELETE":
            name = match.group(1)
            return self._operation(_parent(name), lambda: self._delete(name), failed_operation)
        if (match := _OPERATION.match(path)) and method == "GET":
            return self._poll(match.group(1))
        raise ApiError("NOT_FOUND", f"no route for {method} {path}")

    def _operation(self, parent: str, apply: Any, failed: ApiError | None) -> dict[str, Any]:
        """Validate and apply at once (errors answer directly), report through an LRO.

        An injected operation failure applies nothing and fails the LRO.
        """
        result: dict[str, Any] = apply() if failed is None else {}
        name = f"{parent}/operations/operation-{uuid.uuid4().hex[:16]}"
        op: dict[str, Any] = {"name": name, "done": False,
                              "metadata": {"@type": "type.googleapis.com/google.cloud.hypercomputecluster.v1alpha."
                                                    "OperationMetadata", "createTime": _now(),
                                           "target": result.get("name", ""), "apiVersion": "v1alpha"},
                              "_polls_left": self.op_polls}
        if failed is not None:
            op["_final"] = {"error": {"code": _CODE.get(failed.status, 2), "message": failed.message,
                                      "status": failed.status}}
        else:
            op["_final"] = {"response": result}
        self.operations[name] = op
        return self._public(op) if self.op_polls > 0 else self._poll(name)

    def _poll(self, name: str) -> dict[str, Any]:
        op = self.operations.get(name)
        if op is None:
            raise ApiError("NOT_FOUND", f"operation {name} not found")
        if not op["done"]:
            op["_polls_left"] -= 1
            if op["_polls_left"] < 0:
                op["done"] = True
                op.update(op["_final"])
                op["metadata"]["endTime"] = _now()
        return self._public(op)

    @staticmethod
    def _public(op: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in op.items() if not k.startswith("_")}

    def _get(self, name: str) -> dict[str, Any]:
        run = self.runs.get(name)
        if run is None:
            raise ApiError("NOT_FOUND", f"Resource '{name}' was not found")
        return run

    def _list(self, parent: str, query: dict[str, str]) -> dict[str, Any]:
        names = sorted(n for n in self.runs if n.startswith(parent + "/"))
        size = min(int(query.get("pageSize") or 10), 1000)
        start = int(query.get("pageToken") or 0)
        page = [dict(self.runs[n]) for n in names[start:start + size]]
        out: dict[str, Any] = {"machineLearningRuns": page}
        if start + size < len(names):
            out["nextPageToken"] = str(start + size)
        return out

    def _validate(self, body: dict[str, Any]) -> None:
        if not body.get("tools"):
            raise ApiError("INVALID_ARGUMENT", "machine_learning_run.tools is required")
        if body.get("orchestrator") not in ORCHESTRATORS:
            raise ApiError("INVALID_ARGUMENT", "machine_learning_run.orchestrator is required")
        if body.get("runPhase", "RUN_PHASE_UNSPECIFIED") not in PHASES:
            raise ApiError("INVALID_ARGUMENT", f"invalid run_phase {body.get('runPhase')!r}")
        gke = (body.get("workloadDetails") or {}).get("gke")
        if gke is not None:
            for key in ("id", "kind", "cluster", "namespace"):
                if not gke.get(key):
                    raise ApiError("INVALID_ARGUMENT", f"workload_details.gke.{key} is required")
            if not re.match(r"^projects/[^/]+/locations/[^/]+/clusters/[^/]+$", str(gke["cluster"])):
                raise ApiError("INVALID_ARGUMENT", "workload_details.gke.cluster must be "
                                                   "projects/*/locations/*/clusters/*")

    def _stamp(self, run: dict[str, Any]) -> None:
        phase = run.get("runPhase", "RUN_PHASE_UNSPECIFIED")
        run["state"] = "STATE_UNSPECIFIED" if phase == "RUN_PHASE_UNSPECIFIED" else f"STATE_{phase}"
        run["updateTime"] = _now()
        run["etag"] = str(uuid.uuid4())
        if phase in ("COMPLETED", "FAILED"):
            if run.get("endTime", ZERO_TIME) == ZERO_TIME:
                run["endTime"] = run["updateTime"]
        else:
            run["endTime"] = ZERO_TIME

    def _create(self, parent: str, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        run_id = query.get("machineLearningRunId") or f"run-{uuid.uuid4().hex[:12]}"
        if not _ID.match(run_id):
            raise ApiError("INVALID_ARGUMENT", f"invalid machine_learning_run_id {run_id!r}")
        self._validate(body)
        name = f"{parent}/machineLearningRuns/{run_id}"
        if name in self.runs:
            raise ApiError("ALREADY_EXISTS", f"Resource '{name}' already exists")
        run = {k: v for k, v in body.items() if k not in ("state", "etag", "createTime", "updateTime", "endTime")}
        run["name"] = name
        run["createTime"] = _now()
        self._stamp(run)
        self.runs[name] = run
        return dict(run)

    def _update(self, name: str, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        if query.get("updateMask") != "*":
            raise ApiError("INVALID_ARGUMENT", "update_mask must be '*': partial updates are not supported")
        current = self._get(name)
        if not body.get("etag"):
            raise ApiError("INVALID_ARGUMENT", "etag is required for update")
        if body["etag"] != current["etag"]:
            raise ApiError("ABORTED", f"etag mismatch for '{name}'")
        self._validate(body)
        run = {k: v for k, v in body.items() if k not in ("state", "etag", "createTime", "updateTime", "endTime")}
        run["name"] = name
        run["createTime"] = current["createTime"]
        run["endTime"] = current.get("endTime", ZERO_TIME)
        self._stamp(run)
        self.runs[name] = run
        return dict(run)

    def _delete(self, name: str) -> dict[str, Any]:
        self._get(name)
        del self.runs[name]
        return {"name": name}


def _parent(run_name: str) -> str:
    return run_name.split("/machineLearningRuns/")[0]


def _handler(emulator: MLRunEmulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            return

        def _send(self, code: int, data: Any) -> None:
            raw = json.dumps(data).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            if not length:
                return {}
            return json.loads(self.rfile.read(length))

        def _serve(self, method: str) -> None:
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            try:
                body = self._body()
                if not isinstance(body, dict):
                    raise ApiError("INVALID_ARGUMENT", "request body must be a JSON object")
            except ValueError:
                self._send(400, ApiError("INVALID_ARGUMENT", "request body is not JSON").body())
                return
            if parts.path.startswith("/emulator/"):
                self._control(method, parts.path, body)
                return
            auth = self.headers.get("Authorization", "")
            if not auth.startswith("Bearer ") or not auth[7:].strip():
                self._send(401, ApiError("UNAUTHENTICATED", "missing bearer token").body())
                return
            try:
                self._send(200, emulator.handle(method, parts.path, query, body))
            except ApiError as exc:
                self._send(_HTTP.get(exc.status, 500), exc.body())

        def _control(self, method: str, path: str, body: dict[str, Any]) -> None:
            if path == "/emulator/faults" and method == "POST":
                emulator.inject(Fault(**body))
                self._send(200, {})
            elif path == "/emulator/reset" and method == "POST":
                emulator.reset()
                self._send(200, {})
            elif path == "/emulator/runs" and method == "GET":
                with emulator.lock:
                    self._send(200, {"runs": list(emulator.runs.values())})
            elif path == "/emulator/requests" and method == "GET":
                with emulator.lock:
                    self._send(200, {"requests": [list(r) for r in emulator.requests]})
            else:
                self._send(404, ApiError("NOT_FOUND", f"no control route {method} {path}").body())

        def do_GET(self) -> None:  # noqa: N802 - http.server's names
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST")

        def do_PATCH(self) -> None:  # noqa: N802
            self._serve("PATCH")

        def do_DELETE(self) -> None:  # noqa: N802
            self._serve("DELETE")

    return Handler


@dataclass
class EmulatorHandle:
    emulator: MLRunEmulator
    server: ThreadingHTTPServer
    thread: threading.Thread

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def inject(self, **fault: Any) -> None:
        self.emulator.inject(Fault(**fault))

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def run_emulator(port: int = 0, host: str = "127.0.0.1", op_polls: int = 1,
                 state_file: Path | None = None) -> EmulatorHandle:
    """Serve an emulator on ``host:port`` (0: a free port) in a thread; ``.stop()`` it.

    With ``state_file`` the runs it held when it last wrote are there again.
    """
    emulator = MLRunEmulator(op_polls=op_polls, state_file=state_file)
    emulator.load()
    server = ThreadingHTTPServer((host, port), _handler(emulator))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="mlrun-emulator", daemon=True)
    thread.start()
    return EmulatorHandle(emulator, server, thread)


def main(argv: list[str] | None = None) -> None:
    """``python -m simulators.mlrun``: serve the emulator until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(
        prog="python -m simulators.mlrun",
        description="Serve an emulator of the MachineLearningRun API (hypercomputecluster v1alpha).")
    parser.add_argument("--port", type=int, default=0, help="listen port (0 = pick a free one)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--op-polls", type=int, default=1, help="polls before an operation is done")
    parser.add_argument("--state-file", type=Path, default=None,
                        help="keep the runs in this JSON file across restarts (default: memory only)")
    options = parser.parse_args(argv)
    try:
        handle = run_emulator(port=options.port, host=options.host, op_polls=options.op_polls,
                              state_file=options.state_file)
    except OSError as exc:
        fail(f"mlrun_emulator: cannot listen on {options.host}:{options.port}: {exc}")
        return

    def stop() -> str:
        handle.stop()
        return "stopped"

    serve_until_signal("mlrun_emulator", handle.url, stop)


if __name__ == "__main__":
    main()
