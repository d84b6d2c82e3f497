"""The JobSet contract: what identifies a JobSet of ours, spelled once.

The JobSet's API group and version, its name, the identity labels, the
notify-when annotation and our finalizer: the builder stamps them
(``jobsets.builder``), the actuator and the reconciler read them
(``k8s_bridge``), the lifecycle's notify-when codec names the annotation
(``lifecycle.notify_when``). Pure data: no SDK, no Django.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_PLURAL = "jobsets"

LABEL_XID = "xmc.google.com/xid"
LABEL_WID = "xmc.google.com/wid"
LABEL_EID = "xmc.google.com/execution-id"
LABEL_LAST_EDIT = "xmc.google.com/last-edit"
ANNOTATION_NOTIFY_WHEN = "xmc.google.com/notify-when"
FINALIZER = "jobset.xmanager.cloud/finalizer"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
#: Label selector of the JobSets this system created (the builder sets all three).
JOBSET_SELECTOR = f"{LABEL_XID},{LABEL_WID},{LABEL_EID}"


def jobset_name(xid: int, wid: int) -> str:
    """``xmc-<xid>-<wid>``: one name for every execution of a work unit."""
    return f"xmc-{xid}-{wid}"


@dataclass(frozen=True)
class Stamp:
    """What identifies one execution's JobSet (labels, annotation)."""

    xid: int
    wid: int
    eid: int
    last_edit_ns: int
    notify_when: str = ""
    priority: str = ""
    #: Variables added to every container (the metrics environment, `metrics.tokens.execution_env`);
    #: they replace a variable of the same name the executable set.
    env: tuple[tuple[str, str], ...] = ()


def identity(jobset: dict[str, Any]) -> tuple[int | None, int | None, int | None, int | None]:
    """(xid, wid, eid, last_edit_ns) read from a JobSet's labels (None when absent or garbled)."""
    labels = (jobset.get("metadata") or {}).get("labels") or {}

    def number(key: str) -> int | None:
        try:
            return int(labels[key])
        except (KeyError, TypeError, ValueError):
            return None

    return number(LABEL_XID), number(LABEL_WID), number(LABEL_EID), number(LABEL_LAST_EDIT)
