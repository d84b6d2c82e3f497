"""How an execution's containers ended, read from the cluster when the archive has no last line
(k8s_bridge.logs.endings): the log reads are bounded, and the bound never hides the failed container."""
from __future__ import annotations

from typing import Any

import pytest

from k8s_bridge.logs import endings
from k8s_bridge.logs import pods as podlogs

pytestmark = pytest.mark.django_db


def _pod(i: int, exit_code: int) -> podlogs.PodRef:
    status = {"state": {"terminated": {"exitCode": exit_code, "reason": "Error" if exit_code else "Completed"}}}
    return podlogs.PodRef(namespace="default", name=f"xmc-1-1-1-trainer-0-{i}", uid=f"u{i}", replica=str(i),
                          containers=("main",), statuses={"main": status}, phase="Failed" if exit_code else "Succeeded",
                          node="n", created="", restart_attempt=0, deleting=False, raw={})


def test_it_reads_the_failed_containers_log_first_however_many_replicas_succeeded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    live = [_pod(i, 0) for i in range(endings.MAX_LOG_READS + 4)] + [_pod(99, 3)]  # the failed one listed last
    read: list[str] = []

    def read_lines(pod: podlogs.PodRef, container: str, **_: Any) -> list[Any]:
        read.append(pod.name)
        return [type("Line", (), {"text": f"{pod.name}: last words"})()]

    monkeypatch.setattr(endings.client, "api_client", lambda: object())
    monkeypatch.setattr(podlogs, "execution_jobset", lambda *a, **k: {"metadata": {"name": "js"}})
    monkeypatch.setattr(podlogs, "jobset_pods", lambda *a, **k: live)
    monkeypatch.setattr(podlogs, "read_lines", read_lines)

    ended = endings.terminations(1, 1, 1)
    assert ended[0].exit_code == 3 and ended[0].last_line == "xmc-1-1-1-trainer-0-99: last words"
    assert read[0] == "xmc-1-1-1-trainer-0-99" and len(read) == endings.MAX_LOG_READS  # bounded
    assert len(ended) == len(live)  # every container's ending, with or without its last line
    assert sum(1 for t in ended if not t.last_line) == len(live) - endings.MAX_LOG_READS
