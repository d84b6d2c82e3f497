"""Kubelet (and scheduler) stand-in: makes simulated Pods behave.

For each Pod (key: namespace, name) it binds the pod to a fake node (the
scheduler's job: `spec.nodeName`, `PodScheduled`, event `Scheduled`), then
writes the pod status that the pod's behaviour script
(`simulators.cluster.controllers.script`, annotation `sim.xmc.dev/script`) says
the pod has at the current simulated time: phase, conditions with transition
times, container statuses (waiting / running / terminated, restartCount,
lastState), plus the kubelet Events (Pulling, Pulled, Failed, BackOff,
Created, Started, Killing).  It requeues itself for the timeline's next change
through the `simulators.cluster.clock.SimClock`.  Graceful deletions
(`deletionTimestamp` set by the store) are acted on like a kubelet: event
`Killing`, the container terminates, then the deletion is confirmed with
grace period 0.

Container logs are kept in memory and served by `Kubelet.log_lines`
(exposed as `simulators.cluster.controllers.Controllers.pod_log`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, cast

from simulators.cluster.clock import format_time, parse_time
from simulators.cluster.controllers.runtime import (
    PODS,
    Controller,
    ControllerContext,
    Key,
    Obj,
    clone,
    find_condition,
    is_deleting,
)
from simulators.cluster.controllers.script import (
    DEFAULT_SCRIPT,
    GPU_ANNOTATION,
    SCRIPT_ANNOTATION,
    Script,
    ScriptError,
    Timeline,
    View,
    container_args,
    metric_points,
    parse_gpu,
    parse_script,
)
from simulators.cluster.controllers.usage import PodUsage, pod_usage

log = logging.getLogger(__name__)

RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
# Simulated seconds a deleted running container takes to stop before the
# kubelet confirms the deletion (capped by the pod's grace period).
STOP_SECONDS = 1.0


class LogUnavailable(Exception):
    """The container has no logs yet (HTTP 400 with this message)."""


@dataclass
class PodRuntime:
    uid: str
    node: str
    scheduled_at: float
    timeline: Timeline
    emitted: int = 0
    killed_at: float | None = None
    killed_view: View | None = None
    script_error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Kubelet(Controller):
    name = "kubelet"
    workers = 2

    def __init__(self, ctx: ControllerContext, nodes: list[str] | None = None) -> None:
        super().__init__(ctx)
        self.nodes = nodes or ["sim-node-1"]
        self._rr = itertools.count()
        self._ip = itertools.count(2)
        self._lock = threading.Lock()
        self._runtimes: dict[str, PodRuntime] = {}
        self.cache.add_handler(PODS.plural, self._on_pod)

    def _on_pod(self, event: str, obj: Obj, old: Obj | None) -> None:
        md = obj["metadata"]
        if self.is_own(event, obj):
            return
        if event == "DELETED":
            with self._lock:
                self._runtimes.pop(md.get("uid") or "", None)
            return
        self.queue.add((md.get("namespace") or "", md["name"]))

    def resync_keys(self) -> Iterable[Hashable]:
        return self.cache.keys(PODS.plural)

    # --- logs ------------------------------------------------------------------

    def log_lines(self, namespace: str, name: str, container: str | None = None,
                  previous: bool = False) -> list[tuple[float, str, str]]:
        """(simulated time, line, stream) of a container's log; LookupError if no such pod.

        The stream is ``stdout`` or ``stderr``. As the kubelet, only the current
        container's log and (``previous``) the one before it are kept."""
        pod = self.cache.get(PODS.plural, namespace, name)
        if pod is None:
            raise LookupError(f'pods "{name}" not found')
        names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        names += [c.get("name") for c in (pod.get("spec") or {}).get("initContainers") or []]
        cname = container or (names[0] if names else "main")
        if cname not in names:
            raise LogUnavailable(f'container "{cname}" is not valid for pod "{name}"')
        with self._lock:
            rt = self._runtimes.get(pod["metadata"]["uid"])
        if rt is None:
            raise LogUnavailable(f'container "{cname}" in pod "{name}" is waiting to start: ContainerCreating')
        view = rt.killed_view or rt.timeline.view(self.clock.now())
        seg = view.segment
        waiting = (seg.state.get("waiting") or {}).get("reason")
        if "running" in seg.state or "terminated" in seg.state:
            current = seg.restart_count
        elif waiting == "CrashLoopBackOff":
            current = seg.restart_count  # restartCount rises only when the next container starts
        else:
            current = -1
        if previous:
            current -= 1 if waiting != "CrashLoopBackOff" else 1
            if current < 0:
                raise LogUnavailable(f'previous terminated container "{cname}" in pod "{name}" not found')
        elif current < 0:
            why = {"ErrImagePull": "image can't be pulled",
                   "ImagePullBackOff": "trying and failing to pull image"}.get(waiting or "", waiting or "ContainerCreating")
            raise LogUnavailable(f'container "{cname}" in pod "{name}" is waiting to start: {why}')
        return [(t, text, stream) for (t, attempt, text, stream) in view.logs if attempt == current]

    # --- usage (metrics-server, cAdvisor, DCGM exporter) ---------------------------

    def pod_usage(self, namespace: str | None = None) -> list[PodUsage]:
        """What every pod (of ``namespace``, None: all) whose main container runs uses now
        (`simulators.cluster.controllers.usage`)."""
        now = self.clock.now()
        out = []
        for key in list(self.cache.keys(PODS.plural)):
            ns, name = key
            if namespace is not None and ns != namespace:
                continue
            pod = self.cache.get(PODS.plural, ns, name)
            if pod is None or is_deleting(pod):
                continue
            with self._lock:
                rt = self._runtimes.get(pod["metadata"]["uid"])
            if rt is None or rt.killed_view is not None:
                continue
            seg = rt.timeline.view(now).segment
            if "running" not in seg.state or seg.attempt_start is None:
                continue
            out.append(pod_usage(pod, self._gpu_load(pod, rt.timeline.script), max(0.0, now - seg.attempt_start),
                                 rt.node, now))
        return out

    def _gpu_load(self, pod: Obj, script: Script) -> Script:
        """``script`` with its ``gpu`` key replaced by the pod's `GPU_ANNOTATION` now, if it has a valid one
        (an invalid one is ignored: the script's load goes on)."""
        text = ((pod.get("metadata") or {}).get("annotations") or {}).get(GPU_ANNOTATION)
        if not text:
            return script
        try:
            argv = (((pod.get("spec") or {}).get("containers") or [{}])[0] or {}).get("args")
            load = parse_gpu(text, container_args(argv))
            return dataclasses.replace(script, gpu_util=load["gpu_util"], gpu_mem=load.get("gpu_mem"))
        except ScriptError:
            return script

    # --- reconcile -------------------------------------------------------------

    def reconcile(self, key: Hashable) -> float | None:
        ns, name = cast(Key, key)
        pod = self.cache.get(PODS.plural, ns, name)
        if pod is None:
            return None
        uid = pod["metadata"]["uid"]
        now = self.clock.now()
        with self._lock:
            rt = self._runtimes.get(uid)
        if is_deleting(pod):
            if _node_lost(pod):
                return None  # nobody is left to stop the containers: stuck Terminating
            return self._stop_pod(pod, rt, now)
        spec = pod.get("spec") or {}
        if not spec.get("nodeName"):
            return self._schedule(pod, now)
        phase = (pod.get("status") or {}).get("phase")
        if rt is None:
            if phase in ("Succeeded", "Failed"):
                return None  # finished before this kubelet started: leave it alone
            rt = self._start(pod, now)
        if (pod.get("status") or {}).get("reason") == "Evicted":
            return None
        script = rt.timeline.script
        disruption: float | None = None
        for after in (script.evict_after, script.node_lost_after):
            if after is not None:
                disruption = rt.timeline.t0 + after if disruption is None else min(disruption, rt.timeline.t0 + after)
        if disruption is not None and now >= disruption and phase not in ("Succeeded", "Failed"):
            view = rt.timeline.view(disruption)
            self._emit(pod, rt, view)
            if script.node_lost_after is not None and disruption == rt.timeline.t0 + script.node_lost_after:
                return self._lose_node(pod, rt, view, now)
            return self._evict(pod, rt, view, now)
        view = rt.timeline.view(now)
        status = self._status(pod, rt, view)
        if status != pod.get("status"):
            pod = self.update_own_status(PODS, {**pod, "status": status})
        self._emit(pod, rt, view)
        nxt = view.next_change
        if disruption is not None and not view.segment.final:
            nxt = disruption if nxt is None else min(nxt, disruption)
        due = self._report_metrics(pod, rt, view, now)
        if due is not None:
            nxt = due if nxt is None else min(nxt, due)
        if nxt is None:
            return None
        return max(0.0, nxt - self.clock.now()) + 1e-6

    # --- metrics (script key `metrics=`) ----------------------------------------------------

    def _report_metrics(self, pod: Obj, rt: PodRuntime, view: View, now: float) -> float | None:
        """While the container runs, POST the points its script makes to ``XMC_METRICS_URL`` (as a job's
        writer would, with its ``XMC_METRICS_TOKEN``); the simulated time of the next point, or None.

        Sent from a background thread, one batch in flight per pod; a point counts as sent once the
        server answered (it is idempotent on the step, so a batch sent twice doubles nothing)."""
        script = rt.timeline.script
        seg = view.segment
        if script.metrics_every is None or "running" not in seg.state or seg.attempt_start is None:
            return None
        env = {var.get("name"): var.get("value") for var in
               ((pod.get("spec") or {}).get("containers") or [{}])[0].get("env") or []}
        if not env.get("XMC_METRICS_URL") or not env.get("XMC_METRICS_TOKEN"):
            return None
        key = f"metrics_sent_{seg.restart_count}"  # points of this attempt answered by the server
        with self._lock:
            sent = int(rt.extra.get(key, 0))
            busy = rt.extra.get("metrics_in_flight", False)
            points = [] if busy else metric_points(script, seg.attempt_start, sent, now)
            if points:
                rt.extra["metrics_in_flight"] = True
        if busy:
            return now + script.metrics_every  # look again once the batch in flight is answered
        if points:
            threading.Thread(target=self._post_metrics, args=(rt, key, env, points), daemon=True,
                             name="sim-metrics").start()
        return seg.attempt_start + (max(sent, points[-1][0] if points else 0) + 1) * script.metrics_every

    def _post_metrics(self, rt: PodRuntime, key: str, env: dict[str, Any],
                      points: list[tuple[int, float, dict[str, float]]]) -> None:
        body = {"points": [{"metric": name, "step": n, "value": value, "time": format_time(t)}
                           for n, t, values in points for name, value in values.items()]}
        url = (f"{str(env['XMC_METRICS_URL']).rstrip('/')}/v1/experiments/{env.get('XMC_XID')}"
               f"/workUnits/{env.get('XMC_WID')}/metrics:write")
        request = urllib.request.Request(url, json.dumps(body).encode(), method="POST", headers={
            "Authorization": f"Bearer {env['XMC_METRICS_TOKEN']}", "Content-Type": "application/json"})
        ok = False
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                ok = 200 <= response.status < 300
        except urllib.error.HTTPError as exc:
            log.info("sim.metrics.refused status=%s url=%s", exc.code, url)
            ok = exc.code in (400, 401, 403, 404)  # refused for good: do not send these again
        except (OSError, ValueError) as exc:
            log.info("sim.metrics.unreachable url=%s error=%s", url, exc)
        with self._lock:
            if ok:
                rt.extra[key] = max(int(rt.extra.get(key, 0)), points[-1][0])
            rt.extra["metrics_in_flight"] = False

    def _evict(self, pod: Obj, rt: PodRuntime, view: View, now: float) -> float | None:
        """Kubelet node-pressure eviction (kubernetes pkg/kubelet/eviction): phase Failed, reason
        Evicted, containers killed, `DisruptionTarget=True/TerminationByKubelet`."""
        message = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 42Mi. "
        status = self._status(pod, rt, view)
        for cs in status["containerStatuses"]:
            started = ((cs.get("state") or {}).get("running") or {}).get("startedAt")
            cs.update(ready=False, started=False, state={"terminated": {
                "exitCode": 137, "reason": "Error", "startedAt": started, "finishedAt": format_time(now),
                "containerID": cs.get("containerID", "")}})
        status.update(phase="Failed", reason="Evicted", message=message)
        self._down(status, now)
        status["conditions"].append({"type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
                                     "lastTransitionTime": format_time(now), "reason": "TerminationByKubelet",
                                     "message": message})
        pod = self.update_own_status(PODS, {**pod, "status": status})
        self.ctx.event(pod, PODS, "Warning", "Evicted", message, "kubelet", rt.node)
        return None

    def _lose_node(self, pod: Obj, rt: PodRuntime, view: View, now: float) -> float | None:
        """The node stops answering: the taint-eviction controller marks the pod
        `DisruptionTarget=True/DeletionByTaintManager` and deletes it; no kubelet confirms,
        so it stays Terminating (kubernetes pkg/controller/tainteviction) until force-deleted."""
        md = pod["metadata"]
        status = self._status(pod, rt, view)
        self._down(status, now, ready_only=True)
        status["conditions"].append({"type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
                                     "lastTransitionTime": format_time(now), "reason": "DeletionByTaintManager",
                                     "message": "Taint manager: deleting due to NoExecute taint"})
        pod = self.update_own_status(PODS, {**pod, "status": status})
        self.ctx.event(pod, PODS, "Normal", "TaintManagerEviction", f"Marking for deletion Pod {md.get('namespace')}/{md['name']}",
                       "taint-eviction-controller")
        self.ctx.delete(PODS, md.get("namespace") or "", md["name"], uid=md["uid"])
        self.store.keep_terminating(md.get("namespace"), md["name"])
        return None

    @staticmethod
    def _down(status: dict[str, Any], now: float, ready_only: bool = False) -> None:
        for cond in status.get("conditions") or []:
            if cond["type"] in ("Ready", "ContainersReady") or (not ready_only and cond["type"] == "PodReadyToStartContainers"):
                if cond["status"] != "False":
                    cond["lastTransitionTime"] = format_time(now)
                cond["status"] = "False"

    def _effective_script(self, pod: Obj) -> tuple[Script, str | None]:
        md = pod.get("metadata") or {}
        text = (md.get("annotations") or {}).get(SCRIPT_ANNOTATION)
        argv = (((pod.get("spec") or {}).get("containers") or [{}])[0] or {}).get("args")
        try:
            script = parse_script(text if text is not None else DEFAULT_SCRIPT, container_args(argv))
            error = None
        except ScriptError as exc:
            script, error = parse_script(DEFAULT_SCRIPT), f"invalid {SCRIPT_ANNOTATION} {text!r}: {exc}"
        if script.heal_restarts is not None:
            try:
                attempt = int((md.get("labels") or {}).get(RESTART_ATTEMPT_LABEL, "0"))
            except ValueError:
                attempt = 0
            if attempt >= script.heal_restarts:
                script = script.healed()
        return script, error

    def _schedule(self, pod: Obj, now: float) -> float | None:
        script, _ = self._effective_script(pod)
        md = pod["metadata"]
        if script.schedule_fail:
            status = clone(pod.get("status") or {})
            conds = status.setdefault("conditions", [])
            msg = f"0/{len(self.nodes)} nodes are available: {len(self.nodes)} Insufficient resources (sim.xmc.dev/script schedule=fail). preemption: not eligible."
            if not find_condition(conds, "PodScheduled"):
                conds.append({"type": "PodScheduled", "status": "False", "lastProbeTime": None,
                              "lastTransitionTime": format_time(now), "reason": "Unschedulable", "message": msg})
                pod = self.ctx.update_status(PODS, {**pod, "status": status})
                self.ctx.event(pod, PODS, "Warning", "FailedScheduling", msg, "default-scheduler")
            return None
        created = parse_time(md.get("creationTimestamp")) or now
        if now < created + script.schedule_delay:
            return created + script.schedule_delay - now
        node = self.nodes[next(self._rr) % len(self.nodes)]
        pod = self.ctx.update(PODS, {**pod, "spec": {**pod["spec"], "nodeName": node}})
        self.ctx.event(pod, PODS, "Normal", "Scheduled",
                       f"Successfully assigned {md.get('namespace')}/{md['name']} to {node}", "default-scheduler")
        return 0.0  # reconcile again: the kubelet starts it

    def _start(self, pod: Obj, now: float) -> PodRuntime:
        md, spec = pod["metadata"], pod.get("spec") or {}
        script, error = self._effective_script(pod)
        containers = spec.get("containers") or [{"name": "main", "image": "busybox"}]
        main = containers[0]
        started = parse_time((pod.get("status") or {}).get("startTime"))
        t0 = started if started is not None else now
        sched = find_condition(pod, "PodScheduled")
        sched_at = parse_time((sched or {}).get("lastTransitionTime")) or t0
        timeline = Timeline(script, spec.get("restartPolicy") or "Always", t0, main.get("image") or "",
                            main.get("name") or "main", f"{md['name']}_{md.get('namespace')}({md['uid']})")
        rt = PodRuntime(md["uid"], spec.get("nodeName") or self.nodes[0], min(sched_at, t0), timeline, script_error=error)
        rt.extra["pod_ip"] = (pod.get("status") or {}).get("podIP") or _ip(next(self._ip))
        if started is not None:
            # Restored from a saved state: the events up to now were emitted by
            # the previous run; don't repeat them.
            rt.emitted = len(timeline.view(now).happenings)
        with self._lock:
            rt = self._runtimes.setdefault(md["uid"], rt)
        if error:
            self.ctx.event(pod, PODS, "Warning", "InvalidSimScript", error, "kubelet", rt.node)
        return rt

    def _emit(self, pod: Obj, rt: PodRuntime, view: View) -> None:
        with self._lock:
            new = view.happenings[rt.emitted:]
            rt.emitted = max(rt.emitted, len(view.happenings))
        for h in new:
            self.ctx.event(pod, PODS, h.etype, h.reason, h.message, "kubelet", rt.node)

    def _stop_pod(self, pod: Obj, rt: PodRuntime | None, now: float) -> float | None:
        """Graceful deletion: Killing event, container terminates, deletion confirmed."""
        md = pod["metadata"]
        phase = (pod.get("status") or {}).get("phase")
        if rt is None or phase in ("Succeeded", "Failed"):
            self.ctx.delete(PODS, md.get("namespace") or "", md["name"], uid=md["uid"], grace_period_seconds=0)
            return None
        if rt.killed_at is None:
            view = rt.timeline.view(now)
            with self._lock:
                rt.killed_at = now
                rt.killed_view = view
            self._emit(pod, rt, view)
            containers = (pod.get("spec") or {}).get("containers") or []
            for c in containers:
                self.ctx.event(pod, PODS, "Normal", "Killing", f"Stopping container {c.get('name')}", "kubelet", rt.node)
            grace = md.get("deletionGracePeriodSeconds")
            stop = min(STOP_SECONDS, float(grace)) if grace is not None else STOP_SECONDS
            return stop
        if now < rt.killed_at + STOP_SECONDS - 1e-9 and rt.killed_view is not None:
            return rt.killed_at + STOP_SECONDS - now
        status = self._killed_status(pod, rt, now)
        if status is not None and status != pod.get("status"):
            # The kubelet reports the terminal phase before confirming the deletion.
            self.update_own_status(PODS, {**pod, "status": status})
        self.ctx.delete(PODS, md.get("namespace") or "", md["name"], uid=md["uid"], grace_period_seconds=0)
        return None

    def _killed_status(self, pod: Obj, rt: PodRuntime, now: float) -> dict[str, Any] | None:
        """Status after SIGTERM: running containers terminated with exit 143, phase Failed."""
        view = rt.killed_view
        if view is None or "running" not in view.segment.state:
            return None
        status = self._status(pod, rt, view)
        started = view.segment.state["running"].get("startedAt")
        for cs in status["containerStatuses"]:
            cs.update(ready=False, started=False, state={"terminated": {
                "exitCode": 143, "reason": "Error", "startedAt": started, "finishedAt": format_time(now),
                "containerID": cs.get("containerID", "")}})
        status["phase"] = "Failed"
        for cond in status["conditions"]:
            if cond["type"] in ("Ready", "ContainersReady", "PodReadyToStartContainers"):
                if cond["status"] != "False":
                    cond["lastTransitionTime"] = format_time(now)
                cond["status"] = "False"
                if cond["type"] != "PodReadyToStartContainers":
                    cond["reason"] = "PodCompleted"
                    cond.pop("message", None)
        return status

    # --- status --------------------------------------------------------------------

    def _status(self, pod: Obj, rt: PodRuntime, view: View) -> dict[str, Any]:
        spec = pod.get("spec") or {}
        seg = view.segment
        t0 = rt.timeline.t0
        containers = spec.get("containers") or []
        names = [c.get("name") for c in containers]
        terminal = seg.phase in ("Succeeded", "Failed")
        ready = seg.ready and not terminal

        def cond(ctype: str, ok: bool, since: float, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
            c: dict[str, Any] = {"type": ctype, "status": "True" if ok else "False", "lastProbeTime": None,
                                 "lastTransitionTime": format_time(since)}
            if reason:
                c["reason"] = reason
            if message:
                c["message"] = message
            return c

        if ready:
            ready_c = cond("Ready", True, view.ready_since or t0)
            cready_c = cond("ContainersReady", True, view.ready_since or t0)
        else:
            reason = "PodCompleted" if terminal else "ContainersNotReady"
            message = None if terminal else f"containers with unready status: [{' '.join(n for n in names if n)}]"
            ready_c = cond("Ready", False, view.unready_since, reason, message)
            cready_c = cond("ContainersReady", False, view.unready_since, reason, message)
        conditions = [
            cond("PodReadyToStartContainers", not terminal, t0 if not terminal else seg.start),
            cond("Initialized", True, t0),
            ready_c,
            cready_c,
            cond("PodScheduled", True, rt.scheduled_at),
        ]
        statuses = []
        for i, c in enumerate(containers):
            statuses.append({
                "name": c.get("name"),
                "image": c.get("image"),
                "imageID": "" if "waiting" in seg.state and not seg.started else f"docker.io/library/{c.get('image')}@sha256:{'0' * 64}",
                "containerID": f"containerd://{rt.uid[:8]}{i}{seg.restart_count}",
                "ready": ready,
                "started": seg.started,
                "restartCount": seg.restart_count,
                "state": clone(seg.state),
                "lastState": clone(seg.last_state),
            })
            if "waiting" in seg.state and seg.restart_count == 0 and not seg.last_state:
                statuses[-1].pop("containerID")
        status: dict[str, Any] = {
            "phase": seg.phase,
            "conditions": conditions,
            "hostIP": _node_ip(rt.node, self.nodes),
            "hostIPs": [{"ip": _node_ip(rt.node, self.nodes)}],
            "podIP": rt.extra["pod_ip"],
            "podIPs": [{"ip": rt.extra["pod_ip"]}],
            "startTime": format_time(t0),
            "containerStatuses": statuses,
            "qosClass": (pod.get("status") or {}).get("qosClass") or "BestEffort",
        }
        init = spec.get("initContainers") or []
        if init:
            inits: list[dict[str, Any]] = []
            for c in init:
                sidecar = c.get("restartPolicy") == "Always"
                state: dict[str, Any] = ({"running": {"startedAt": format_time(t0)}} if sidecar and not terminal else
                         {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": format_time(t0),
                                         "finishedAt": format_time(t0 if not sidecar else seg.start)}})
                inits.append({"name": c.get("name"), "image": c.get("image"), "imageID": "", "ready": sidecar and not terminal,
                              "started": sidecar and not terminal, "restartCount": 0, "state": state, "lastState": {}})
            status["initContainerStatuses"] = inits
        return status


def _node_lost(pod: Obj) -> bool:
    cond = find_condition(pod, "DisruptionTarget")
    return bool(cond and cond.get("status") == "True" and cond.get("reason") == "DeletionByTaintManager")


def _ip(n: int) -> str:
    return f"10.{64 + (n >> 16) % 64}.{(n >> 8) & 255}.{n & 255}"


def _node_ip(node: str, nodes: list[str]) -> str:
    try:
        i = nodes.index(node)
    except ValueError:
        i = 0
    return f"10.128.0.{i + 2}"
