"""The xprof URL a read (GetArtifact / ListArtifacts) returns for a managed xprof artifact.

The URL persisted by the artifact lifecycle (``artifacts.services.set_xprof_url``)
wins. When none is stored (the flag is off, or the run is not created yet)
the URL is constructed from the artifact: the console URL of the
MachineLearningRun of its work unit's current execution
(:func:`console_url` of :func:`mlrun_id`), which is the run the legacy sync
keeps in step. With no MachineLearningRun project or location configured, or
for an experiment-level artifact, there is nothing to construct and it stays
empty.

MachineLearningRun identity and console URLs are built here and nowhere else
(the lifecycle's rules use them too):

* :func:`mlrun_id`: the run of execution ``(xid, wid, eid)`` has a
  deterministic id, so every producer (the lifecycle rule, the legacy sync,
  the read path, the superseded-execution close) names the same run and a
  redelivered event can never create a second one.
* :func:`console_url`: the GKE AI/ML run view
  (``https://console.cloud.google.com/kubernetes/aiml/run/{location}/{id}?project={project}``),
  the route the public ML Diagnostics SDK prints (``core/create_mlrun.py`` in
  ``AI-Hypercomputer/google-cloud-mldiagnostics``); it is stored as the
  artifact's ``xprof_url`` and the execution's ``metadata.mlrun_url``.
* :func:`parse_run_id`: the run id back from a stored URL, in this form or
  the older ``.../runs/{id}`` form.
"""
from __future__ import annotations

import re
from urllib.parse import quote

from django.conf import settings

from artifacts.models import Artifact

CONSOLE = "https://console.cloud.google.com"
_CURRENT = re.compile(r"/kubernetes/aiml/run/[^/?#]+/([^/?#]+)")
_OLDER = re.compile(r"/runs/([^/?#]+)")


def mlrun_id(xid: int, wid: int, eid: int) -> str:
    """``xmc-{xid}-{wid}-{eid}``: lowercase letters, digits and dashes, starts with a letter."""
    return f"xmc-{int(xid)}-{int(wid)}-{int(eid)}"


def console_url(project: str, location: str, run_id: str) -> str:
    return f"{CONSOLE}/kubernetes/aiml/run/{quote(location, safe='')}/{quote(run_id, safe='')}?project={quote(project, safe='')}"


def parse_run_id(url: str) -> str:
    """The run id in a console URL of either form ("" when there is none)."""
    for pattern in (_CURRENT, _OLDER):
        match = pattern.search(url or "")
        if match:
            return match.group(1)
    return ""


def stored_xprof_url(artifact: Artifact) -> str:
    xprof = (artifact.payload or {}).get("managedXprof") or {}
    return str((xprof.get("xprof") or {}).get("xprofUrl") or "")


def constructed_xprof_url(artifact: Artifact) -> str:
    project, location = settings.XMC_MLRUN_PROJECT, settings.XMC_MLRUN_LOCATION
    if artifact.work_unit is None or not project or not location:
        return ""
    wu = artifact.work_unit
    return console_url(project, location, mlrun_id(wu.experiment_id, wu.wid, wu.current_eid))


def xprof_url(artifact: Artifact) -> str:
    """The persisted URL, else the constructed one ("" for other kinds)."""
    if artifact.payload_kind != "managed_xprof":
        return ""
    return stored_xprof_url(artifact) or constructed_xprof_url(artifact)
