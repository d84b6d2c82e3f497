"""Start and stop a whole simulated cluster: store, API server, controllers.

`run_simulator` is the one entry point: `python -m simulators.cluster`
(`simulators.cluster.__main__`) calls it and then waits for a
signal; the tests (tests/simulators/cluster/api/conftest.py) call it once per session and
stop the returned `SimulatorHandle`.  It wires the pieces owned by two people:
the store and HTTP layer here, and ``simulators.cluster.controllers.start_controllers``
with ``simulators.cluster.clock.SimClock`` from the controllers side.  When the
controllers package is not importable the simulator still serves the API (a
plain API server) if ``controllers=False``, and fails with a clear message
otherwise.

It also owns the housekeeping threads: graceful-deletion reaping of pods past
their deadline (a backstop for the kubelet stand-in) and periodic state-file
persistence.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from simulators.cluster import apiserver
from simulators.cluster.apiserver import ApiServer, PodLogBuffer, pod_log_buffer
from simulators.cluster.resources import by_plural
from simulators.cluster.store import Store, not_found

logger = logging.getLogger(__name__)


class ControllersUnavailable(RuntimeError):
    """simulators.cluster.controllers / simulators.cluster.clock cannot be imported."""


def write_kubeconfig(path: str, server_url: str, context: str = "xmc-sim", namespace: str = "default") -> None:
    """A kubeconfig any client accepts: no credentials, plain HTTP."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {"server": server_url}}],
        "users": [{"name": context, "user": {}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context, "namespace": namespace}}],
        "current-context": context,
        "preferences": {},
    }
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".kubeconfig-")
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump(config, fh, sort_keys=False)
    os.replace(tmp, path)


def save_state(store: Store, path: str) -> None:
    """Atomically write the store snapshot (plus the simulated time) as JSON."""
    data = store.snapshot()
    data["simTime"] = store.clock()
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".simstate-")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, separators=(",", ":"))
    os.replace(tmp, path)


def read_state(path: str | None) -> dict[str, Any] | None:
    if not path or not os.path.exists(path):
        return None
    with open(path) as fh:
        return json.load(fh)  # type: ignore[no-any-return]


@dataclass
class SimulatorHandle:
    """A running simulator.  `stop()` saves state (if configured) and shuts down."""

    store: Store
    server: ApiServer
    clock: Any
    controllers: Any = None
    kubeconfig_path: str | None = None
    state_file: str | None = None
    _threads: list[threading.Thread] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        return int(self.server.port)

    @property
    def faults(self) -> Any:
        """The API server's injected faults (``simulators.cluster.faults.Faults``)."""
        return self.server.api.faults

    @property
    def pod_logs(self) -> PodLogBuffer:
        """Fallback log buffer (used when no kubelet log provider is registered)."""
        return pod_log_buffer(self.store)

    def save(self) -> None:
        if self.state_file:
            save_state(self.store, self.state_file)

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        stop_controllers = getattr(self.controllers, "stop", None)
        if callable(stop_controllers):
            try:
                stop_controllers()
            except Exception:  # noqa: BLE001 - shutting down anyway
                logger.exception("sim.server.controllers_stop_failed")
        try:
            self.save()
        except Exception:  # noqa: BLE001
            logger.exception("sim.server.save_failed")
        self.server.stop()
        stop_clock = getattr(self.clock, "stop", None)
        if callable(stop_clock):
            stop_clock()
        for t in self._threads:
            t.join(timeout=2)
        apiserver.forget_store(self.store)


def _clock_fn(clock: Any) -> Callable[[], float]:
    if callable(getattr(clock, "now", None)):
        return clock.now  # type: ignore[no-any-return]
    if callable(clock):
        return clock  # type: ignore[no-any-return]
    raise TypeError("clock must be callable or have now()")


def _make_clock(speed: float, start: float | None) -> Any:
    try:
        from simulators.cluster.clock import SimClock
    except ImportError as exc:
        raise ControllersUnavailable(f"simulators.cluster.clock.SimClock is not available yet: {exc}") from exc
    return SimClock(speed, start=start)


def _start_controllers(store: Store, clock: Any, queues_config: str | None) -> Any:
    try:
        from simulators.cluster.controllers import start_controllers
    except ImportError as exc:
        raise ControllersUnavailable(
            "simulators.cluster.controllers.start_controllers is not available yet "
            f"({exc}); run with controllers=False for a plain API server"
        ) from exc
    return start_controllers(store, clock, queues_config)


def _register_controller_hooks(store: Store, controllers: Any) -> None:
    """Serve pods/log, the pods' resource metrics and the Kueue visibility API from the running controllers."""
    log_lines = getattr(controllers, "pod_log_lines", None)
    if callable(log_lines):
        apiserver.register_log_provider(
            lambda ns, name, container, previous: log_lines(ns, name, container, previous), store=store
        )
    usage = getattr(controllers, "pod_usage", None)
    if callable(usage):
        apiserver.register_usage_provider(usage, store=store)
    pending = getattr(controllers, "pending_workloads", None)
    if callable(pending):

        def visibility(kind: str, namespace: str | None, name: str) -> list[dict[str, Any]]:
            try:
                if kind == "clusterqueues":
                    return pending(cluster_queue=name)  # type: ignore[no-any-return]
                return pending(namespace=namespace, local_queue=name)  # type: ignore[no-any-return]
            except Exception as exc:
                if type(exc).__name__ == "UnknownQueue":
                    raise not_found(by_plural(kind), name) from None
                raise

        apiserver.register_visibility_provider(visibility, store=store)


def run_simulator(
    port: int = 0,
    host: str = "127.0.0.1",
    speed: float = 1.0,
    state_file: str | None = None,
    queues_config: str | None = None,
    kubeconfig_out: str | None = None,
    controllers: bool = True,
    clock: Any = None,
    save_interval_s: float = 10.0,
    reap_interval_s: float = 0.2,
    event_ttl_s: float = 3600.0,
    controller_hooks: bool = True,
    faults: str | None = None,
) -> SimulatorHandle:
    """Start a simulator and return its handle (call `.stop()` when done).

    `port=0` picks a free port.  With `controllers=False` only the API server
    runs (no JobSet/Kueue/kubelet behaviour); `clock` defaults to a
    `SimClock(speed)` when controllers run, else to `time.time`.
    Core Events older than `event_ttl_s` simulated seconds are deleted, as
    the real apiserver's --event-ttl does.  `queues_config` is the controllers' seeding YAML (their format; None = their
    default). `faults` is a JSON or YAML file of injected API faults
    (`simulators.cluster.faults`), also settable at run time on `/sim/faults`.
    """
    state = read_state(state_file)
    if clock is None:
        # Simulated time never runs backwards across a restart: resume from the
        # saved simulated time when it is ahead of the wall clock (speed > 1).
        start = max(time.time(), float(state.get("simTime") or 0)) if state else None
        clock = _make_clock(speed, start) if controllers else time.time
    store = Store(clock=_clock_fn(clock))
    if state is not None:
        store.restore(state)
        logger.info("sim.server.state_restored", extra={"state_file": state_file, "rv": store.resource_version})
    server = ApiServer(store, host, port)
    if faults:
        server.api.faults.load(faults)
    handle = SimulatorHandle(store=store, server=server, clock=clock, state_file=state_file)
    if controllers:
        handle.controllers = _start_controllers(store, clock, queues_config)
        if controller_hooks:
            _register_controller_hooks(store, handle.controllers)
    server.start()
    if kubeconfig_out:
        write_kubeconfig(kubeconfig_out, server.url)
        handle.kubeconfig_path = kubeconfig_out

    def reaper() -> None:
        last_expiry = time.monotonic()
        while not handle._stop.wait(reap_interval_s):
            try:
                store.reap_graceful_deletions()
                if time.monotonic() - last_expiry > 5.0:
                    last_expiry = time.monotonic()
                    store.expire_events(event_ttl_s)
            except Exception:  # noqa: BLE001 - keep reaping
                logger.exception("sim.server.reap_failed")

    def saver() -> None:
        while not handle._stop.wait(save_interval_s):
            try:
                handle.save()
            except Exception:  # noqa: BLE001 - keep serving
                logger.exception("sim.server.save_failed")

    for target, name in ((reaper, "reaper"), (saver, "saver")):
        if name == "saver" and not state_file:
            continue
        t = threading.Thread(target=target, name=f"sim-{name}-{server.port}", daemon=True)
        t.start()
        handle._threads.append(t)
    return handle
