"""Built-in defaulting and validation of the simulated API server.

Called by `simulators.cluster.store.Store` on create (defaults) and on every
main-resource write (validation), standing in for the apiserver's registry
strategies: pods get the defaults kubectl and controllers expect to read back
(restartPolicy, terminationGracePeriodSeconds, dnsPolicy, imagePullPolicy...),
batch/v1 Jobs get the generated selector and controller-uid labels, namespaces
their finalizer and phase.  Validation is deliberately minimal: names,
required pod/job fields and the fields the python client's models require.
"""

from __future__ import annotations

import re
from typing import Any

from simulators.cluster.resources import ResourceType

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)


def _qos_class(spec: dict[str, Any]) -> str:
    containers = list(spec.get("containers") or []) + list(spec.get("initContainers") or [])
    any_set = False
    guaranteed = True
    for c in containers:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if req or lim:
            any_set = True
        for r in ("cpu", "memory"):
            if r not in lim or (r in req and str(req[r]) != str(lim[r])):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def default_pod_spec(spec: dict[str, Any], restart_policy: str = "Always") -> None:
    spec.setdefault("restartPolicy", restart_policy)
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or []:
            if not isinstance(c, dict):
                continue
            image = str(c.get("image") or "")
            tag = image.rsplit("/", 1)[-1]
            latest = "@" not in tag and (":" not in tag or tag.endswith(":latest"))
            c.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            c.setdefault("resources", {})


def apply_create_defaults(rt: ResourceType, obj: dict[str, Any], uid: str) -> None:
    """Defaults a real API server applies on create (obj is mutated)."""
    meta = obj["metadata"]
    if rt.plural == "pods":
        spec = obj.setdefault("spec", {})
        if isinstance(spec, dict):
            default_pod_spec(spec)
            obj["status"] = {"phase": "Pending", "qosClass": _qos_class(spec)}
    elif rt.plural == "namespaces":
        meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
        obj["spec"] = {"finalizers": ["kubernetes"]}
        obj["status"] = {"phase": "Active"}
    elif rt.plural == "jobs":
        spec = obj.setdefault("spec", {})
        if not isinstance(spec, dict):
            return
        if spec.get("completions") is None and spec.get("parallelism") is None:
            spec["completions"] = 1
            spec["parallelism"] = 1
        spec.setdefault("parallelism", 1)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("backoffLimit", 2147483647 if spec.get("backoffLimitPerIndex") is not None else 6)
        spec.setdefault("suspend", False)
        spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
        template = spec.setdefault("template", {})
        if isinstance(template, dict):
            tmeta = template.setdefault("metadata", {})
            labels = tmeta.setdefault("labels", {})
            if not spec.get("manualSelector"):
                labels["batch.kubernetes.io/controller-uid"] = uid
                labels["batch.kubernetes.io/job-name"] = meta["name"]
                labels["controller-uid"] = uid
                labels["job-name"] = meta["name"]
                spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
            tspec = template.setdefault("spec", {})
            if isinstance(tspec, dict):
                default_pod_spec(tspec, restart_policy=tspec.get("restartPolicy") or "Never")
    elif rt.plural == "leases":
        obj.setdefault("spec", {})


def _cause(field: str, message: str, reason: str = "FieldValueInvalid") -> dict[str, str]:
    return {"reason": reason, "message": message, "field": field}


def validate(rt: ResourceType, obj: dict[str, Any]) -> list[dict[str, str]]:
    """StatusCauses for an invalid object (empty list when valid)."""
    causes: list[dict[str, str]] = []
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    if rt.plural == "namespaces":
        if len(name) > 63 or not _DNS_LABEL.match(name):
            causes.append(_cause("metadata.name", f'Invalid value: "{name}": {_LABEL_MSG}'))
    elif rt.plural != "events" and (len(name) > 253 or not _DNS_SUBDOMAIN.match(name)):
        causes.append(_cause("metadata.name", f'Invalid value: "{name}": {_SUBDOMAIN_MSG}'))
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for req in ("apiVersion", "kind", "name", "uid"):
            if not isinstance(ref, dict) or not ref.get(req):
                causes.append(_cause(f"metadata.ownerReferences[{i}].{req}", "Required value", "FieldValueRequired"))
    if rt.plural == "pods":
        causes += _validate_pod_spec(obj.get("spec"), "spec")
    elif rt.plural == "jobs":
        spec = obj.get("spec") or {}
        template = spec.get("template") or {}
        causes += _validate_pod_spec(template.get("spec"), "spec.template.spec")
        # kubernetes pkg/apis/batch/validation/validation.go: Indexed Jobs need completions.
        if spec.get("completionMode") == "Indexed" and spec.get("completions") is None:
            causes.append(_cause("spec.completions", "Required value: when completion mode is Indexed", "FieldValueRequired"))
        policy = (template.get("spec") or {}).get("restartPolicy")
        if policy not in ("Never", "OnFailure"):
            causes.append(_cause(
                "spec.template.spec.restartPolicy",
                f'Unsupported value: "{policy}": supported values: "OnFailure", "Never"',
                "FieldValueNotSupported",
            ))
    elif rt.plural == "events":
        if not isinstance(obj.get("involvedObject"), dict):
            causes.append(_cause("involvedObject", "Required value", "FieldValueRequired"))
    return causes


def _validate_pod_spec(spec: Any, path: str) -> list[dict[str, str]]:
    if not isinstance(spec, dict):
        return [_cause(path, "Required value", "FieldValueRequired")]
    causes: list[dict[str, str]] = []
    containers = spec.get("containers")
    if not containers:
        causes.append(_cause(f"{path}.containers", "Required value", "FieldValueRequired"))
    for key in ("containers", "initContainers"):
        for i, c in enumerate(spec.get(key) or []):
            if not isinstance(c, dict) or not c.get("name"):
                causes.append(_cause(f"{path}.{key}[{i}].name", "Required value", "FieldValueRequired"))
            elif not c.get("image"):
                causes.append(_cause(f"{path}.{key}[{i}].image", "Required value", "FieldValueRequired"))
    return causes
