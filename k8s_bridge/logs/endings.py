"""How an execution's containers ended: exit code, reason and last log line, from the archive, else
the cluster. The termination provider of ``workunits.hooks`` (registered by ``k8s_bridge.apps``):
what a failure message says (``notifications.details``), read once, when its body is built.

* **The archive first.** An archived failed container with a last line
  (`k8s_bridge.logs.archive.tail_from_rows`) answers without asking the cluster.
* **Else the cluster.** The archiver works on its own thread with retries
  (`k8s_bridge.logs.archive`), so a message is often built before the log is
  archived. The pods are usually still there then: the JobSet's finalizer waits
  for the archive. So the message reads them the way the logs endpoint does
  (`k8s_bridge.logs.pods`): each terminated container's status (exit code,
  reason) and the last `TAIL_LINES` lines of its log, at most `TAIL_BYTES`.
* **Bounded, never failing the message.** Every try of a call has a timeout
  (`REQUEST_TIMEOUT_S`; the client tries a timed-out read up to 4 times, so
  one call can take up to 4 timeouts), an execution gets `BUDGET_S` in all
  and `MAX_LOG_READS` log reads (failed containers first: every terminated
  container's exit code and reason come with the pod listing, so only the
  last lines of the others past that count are left out), and an error
  (unreachable, 404, 400) gives what the archive had. A
  cluster that fails is not asked again for `UNREACHABLE_FOR_S` seconds, so a
  batch of messages never waits on it once per unit. A pod that is gone and
  was never archived has no last line anywhere: the message goes without it.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from k8s_bridge import client
from k8s_bridge.logs import archive
from k8s_bridge.logs import pods as podlogs
from workunits import hooks
from workunits.models import WorkUnitExecution

log = logging.getLogger(__name__)

#: What one message may spend reading the cluster for one execution (checked between calls), and
#: each try of a call.
BUDGET_S = 5.0
REQUEST_TIMEOUT_S = 2.0
#: Container logs read per execution (failed containers first); the lines read per container, and bytes.
MAX_LOG_READS = 8
TAIL_LINES = archive.TAIL_LINES
TAIL_BYTES = archive.TAIL_BYTES
#: After a failed read, the cluster is left alone this long (other units of the batch, other batches).
UNREACHABLE_FOR_S = 30.0

_lock = threading.Lock()
#: The API client that last failed, and until when it is left alone (a new kubeconfig: a new client).
_unreachable: tuple[Any, float] = (None, 0.0)


def terminations(xid: int, wid: int, eid: int) -> list[hooks.Termination]:
    """How each container of the execution ended, failed ones first (see the module docstring)."""
    found = {(pod, container): hooks.Termination(container, code, reason, _last(tail))
             for (pod, container), (_attempt, tail, code, reason) in archive.tail_from_rows(xid, wid, eid).items()}
    if not any(t.exit_code not in (None, 0) and t.last_line for t in found.values()):
        for key, ended in _from_cluster(xid, wid, eid).items():
            held = found.get(key)
            if held is None or not held.last_line:
                found[key] = ended
    return sorted(found.values(), key=lambda t: (t.exit_code in (None, 0), t.container))


def _last(lines: list[str]) -> str:
    return next((line for line in reversed(lines) if line.strip()), "")


def _from_cluster(xid: int, wid: int, eid: int) -> dict[tuple[str, str], hooks.Termination]:
    """(pod name, container) -> how it ended, for the terminated containers of the execution's live pods."""
    global _unreachable
    found: dict[tuple[str, str], hooks.Termination] = {}
    api: Any = None
    try:
        api = client.api_client()
        with _lock:
            if _unreachable[0] is api and time.monotonic() < _unreachable[1]:
                return found
        deadline = time.monotonic() + BUDGET_S
        jobset = podlogs.execution_jobset(_namespace(xid, wid, eid), xid, wid, eid, timeout_s=REQUEST_TIMEOUT_S)
        live = podlogs.jobset_pods(jobset, timeout_s=_left(deadline)) if jobset is not None else []
        ended = [(pod, container, *e) for pod in live for container in pod.containers
                 if (e := _ended(pod.statuses.get(container) or {})) is not None]
        ended.sort(key=lambda x: x[2].get("exitCode") in (None, 0))  # failed first, stable by replica
        for i, (pod, container, terminated, previous) in enumerate(ended):
            found[(pod.name, container)] = (_read(pod, container, terminated, previous, deadline=deadline)
                                            if i < MAX_LOG_READS else _status_only(container, terminated))
    except client.ApiException as exc:  # the cluster answered (forbidden, ...): what was read is kept
        log.warning("logs.ending_unread", extra={"xid": xid, "wid": wid, "eid": eid, "status": exc.status})
    except Exception as exc:  # noqa: BLE001 - unreachable, timed out, no credentials: without it
        log.warning("logs.ending_unread", extra={"xid": xid, "wid": wid, "eid": eid, "error": repr(exc)[:300]})
        if api is not None:
            with _lock:
                _unreachable = (api, time.monotonic() + UNREACHABLE_FOR_S)
    return found


def _read(pod: podlogs.PodRef, container: str, terminated: Mapping[str, Any], previous: bool, *,
          deadline: float) -> hooks.Termination:
    """The container's ending with its last log line ("" when the kubelet no longer has the log)."""
    try:
        lines = [line.text for line in podlogs.read_lines(pod, container, previous=previous, tail_lines=TAIL_LINES,
                                                          limit_bytes=TAIL_BYTES, timeout_s=_left(deadline))]
    except client.ApiException:  # 404 gone meanwhile, 400 no such instance: the status still says how it ended
        lines = []
    return _status_only(container, terminated, _last(lines))


def _status_only(container: str, terminated: Mapping[str, Any], last_line: str = "") -> hooks.Termination:
    code = terminated.get("exitCode")
    return hooks.Termination(container, int(code) if code is not None else None, str(terminated.get("reason") or ""),
                             last_line)


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"reading the cluster took longer than {BUDGET_S}s")
    return min(left, REQUEST_TIMEOUT_S)


def _ended(status: Mapping[str, Any]) -> tuple[Mapping[str, Any], bool] | None:
    """The container's termination and whether its log is the previous instance's (it restarted
    since); None while it has never ended."""
    terminated = (status.get("state") or {}).get("terminated")
    if terminated:
        return terminated, False
    before = (status.get("lastState") or {}).get("terminated")
    return (before, True) if before else None


def _namespace(xid: int, wid: int, eid: int) -> str:
    metadata = (WorkUnitExecution.objects.filter(work_unit__experiment_id=xid, work_unit__wid=wid, eid=eid)
                .values_list("metadata", flat=True).first()) or {}
    return str(metadata.get("namespace") or settings.XMC_K8S_NAMESPACE)
