"""Leader election with a ``coordination.k8s.io/v1`` Lease: one reconciler writes at a time.

The same protocol as client-go's leaderelection package
(kubernetes/client-go ``tools/leaderelection/leaderelection.go``), reduced to
what we need:

* A candidate reads the Lease. Absent -> it creates it holding it. Held by
  itself -> it renews ``renewTime`` (an update carrying the
  resourceVersion, so two writers cannot both win). Held by someone else ->
  it remembers the record and when *it* first saw it; if the record has not
  changed for ``lease_duration_s`` of the candidate's own monotonic clock the
  holder is presumed dead and the candidate takes the Lease over (again
  guarded by resourceVersion). Comparing against one's own clock, never the
  holder's ``renewTime``, keeps clock skew out of it.
* The leader renews every ``renew_period_s``. :meth:`LeaderElector.is_leader`
  is true only until ``lease_duration_s`` after the start of the last
  successful renewal, so a leader cut off from the API server stops writing
  on its own before a standby can take over; a renewal that finds another
  holder drops leadership at once.
* ``release()`` (clean shutdown) empties ``holderIdentity`` so a standby takes
  over on its next try instead of waiting out the lease.
* A holder that was a process on this very host (the default identity is
  ``host-pid-random``, ``k8s_bridge.management.commands.reconcile``) and no
  longer runs is not waited out either (`holder_gone`): a reconciler killed
  or crashed under ``./dev run`` is restarted on the same host, and the
  lease it left (kept by the simulator across restarts) would otherwise hold
  the new one back for ``lease_duration_s`` -- long enough for a short job
  to start, run and finish unseen (issue 39).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from k8s_bridge import client
from k8s_bridge.reconciler import metrics

log = logging.getLogger(__name__)


def _micro_time(now: datetime | None = None) -> str:
    return (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def holder_gone(holder: str) -> bool:
    """Whether ``holder`` names a process of this host (``host-pid-random``) that is not running."""
    parts = holder.rsplit("-", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not (parts[1].isascii() and parts[1].isdigit()):
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError, ValueError):
        return False
    return False


class LeaderElector:
    def __init__(
        self,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration_s: float = 15.0,
        renew_period_s: float | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration_s = lease_duration_s
        self.renew_period_s = renew_period_s or max(0.2, lease_duration_s / 3)
        self.on_lost = on_lost
        self._valid_until = 0.0
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def is_leader(self) -> bool:
        with self._lock:
            return time.monotonic() < self._valid_until

    def _set_leader(self, until: float) -> None:
        with self._lock:
            self._valid_until = until
        metrics.LEADER.set(1 if until > time.monotonic() else 0)

    def _lose(self, why: str) -> None:
        was = self.is_leader()
        self._set_leader(0.0)
        if was:
            log.warning("reconciler.leader_lost", extra={"identity": self.identity, "why": why})
            if self.on_lost is not None:
                self.on_lost()

    def _body(self, lease: Any, transitions: int, acquire: bool) -> dict[str, Any]:
        now = _micro_time()
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, int(round(self.lease_duration_s))),
            "renewTime": now,
            "leaseTransitions": transitions,
        }
        if acquire:
            spec["acquireTime"] = now
        elif lease is not None and lease.spec.acquire_time is not None:
            spec["acquireTime"] = _micro_time(lease.spec.acquire_time)
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if lease is not None:
            metadata["resourceVersion"] = lease.metadata.resource_version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    def try_acquire_or_renew(self) -> bool:
        """One round of the protocol; ``True`` when this process holds the lease afterwards."""
        api = client.coordination()
        started = time.monotonic()
        try:
            lease = api.read_namespaced_lease(self.name, self.namespace, _request_timeout=5)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            try:
                api.create_namespaced_lease(self.namespace, self._body(None, 0, True), _request_timeout=5)
            except client.ApiException as create_exc:
                if create_exc.status == 409:
                    return False  # someone else created it first
                raise
            self._set_leader(started + self.lease_duration_s)
            log.info("reconciler.leader_acquired", extra={"identity": self.identity, "lease_created": True})
            return True
        spec = lease.spec
        holder = spec.holder_identity or ""
        renew = str(spec.renew_time or "")
        transitions = int(spec.lease_transitions or 0)
        if holder == self.identity:  # ours (also a record from before a restart with the same identity)
            body = self._body(lease, transitions, acquire=False)
        else:
            record = (holder, renew)
            if record != self._observed:
                self._observed, self._observed_at = record, started
            if holder and started - self._observed_at < self.lease_duration_s and not holder_gone(holder):
                if self.is_leader():
                    self._lose(f"lease held by {holder}")
                return False
            body = self._body(lease, transitions + 1, acquire=True)
        try:
            api.replace_namespaced_lease(self.name, self.namespace, body, _request_timeout=5)
        except client.ApiException as exc:
            if exc.status == 409:
                if holder == self.identity:
                    self._lose("renewal conflict")
                return False
            raise
        if holder != self.identity:
            log.info("reconciler.leader_acquired", extra={"identity": self.identity, "previous": holder})
        self._set_leader(started + self.lease_duration_s)
        return True

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.try_acquire_or_renew()
            except Exception:
                log.exception("reconciler.lease_error", extra={"identity": self.identity})
            if not self.is_leader() and self._valid_until:
                self._lose("lease expired without renewal")
            self._stop.wait(self.renew_period_s if self.is_leader() else min(self.renew_period_s, 1.0))

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="reconciler-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop campaigning and, if we hold the lease, give it up at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if not self.is_leader():
            return
        self._set_leader(0.0)
        api = client.coordination()
        try:
            lease = api.read_namespaced_lease(self.name, self.namespace, _request_timeout=5)
            if lease.spec.holder_identity == self.identity:
                body = self._body(lease, int(lease.spec.lease_transitions or 0), acquire=False)
                body["spec"]["holderIdentity"] = ""
                api.replace_namespaced_lease(self.name, self.namespace, body, _request_timeout=5)
        except Exception:  # best effort: the lease expires anyway
            log.exception("reconciler.lease_release_failed")
