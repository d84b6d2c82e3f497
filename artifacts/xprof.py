"""The xprof URL a read (GetArtifact / ListArtifacts) returns for a managed xprof artifact.

The URL persisted by the artifact lifecycle (``artifacts.services.set_xprof_url``)
wins. When none is stored (the flag is off, or the run is not created yet)
the URL is constructed from the artifact: the console URL of the
MachineLearningRun of its work unit's current execution
(``lifecycle.urls``), which is the run the legacy sync keeps in step. With
no MachineLearningRun project or location configured, or for an
experiment-level artifact, there is nothing to construct and it stays empty.
"""
from __future__ import annotations

from django.conf import settings

from artifacts.models import Artifact
from lifecycle import urls


def stored_xprof_url(artifact: Artifact) -> str:
    xprof = (artifact.payload or {}).get("managedXprof") or {}
    return str((xprof.get("xprof") or {}).get("xprofUrl") or "")


def constructed_xprof_url(artifact: Artifact) -> str:
    project, location = settings.XMC_MLRUN_PROJECT, settings.XMC_MLRUN_LOCATION
    if artifact.work_unit is None or not project or not location:
        return ""
    wu = artifact.work_unit
    return urls.console_url(project, location, urls.mlrun_id(wu.experiment_id, wu.wid, wu.current_eid))


def xprof_url(artifact: Artifact) -> str:
    """The persisted URL, else the constructed one ("" for other kinds)."""
    if artifact.payload_kind != "managed_xprof":
        return ""
    return stored_xprof_url(artifact) or constructed_xprof_url(artifact)
