"""MachineLearningRun identity and console URLs: built here and nowhere else.

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
