"""Retention of the pod log archive: old objects and rows go, the rest stays, a failing store
keeps its rows for the next run (k8s_bridge.logs.archive.purge, task xmc.logs.purge_archive)."""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from k8s_bridge import tasks
from k8s_bridge.logs import archive
from k8s_bridge.models import PodLogArchive

pytestmark = pytest.mark.django_db
ARCHIVED, LOST, PENDING = PodLogArchive.Status.ARCHIVED, PodLogArchive.Status.LOST, PodLogArchive.Status.PENDING


def row(folder: Path, n: int, status: str, archived_days_ago: float | None, **extra: Any) -> PodLogArchive:
    url = ""
    if status == ARCHIVED:
        path = folder / f"pod-{n}" / "main.0.log"
        path.parent.mkdir(parents=True)
        path.write_text(f"2026-12-01T00:00:00Z line of pod {n}\n")
        url = f"file://{path}"
    archived_at = timezone.now() - timedelta(days=archived_days_ago) if archived_days_ago is not None else None
    return PodLogArchive.objects.create(
        xid=1, wid=1, eid=1, namespace="default", pod_name=f"pod-{n}", pod_uid=f"uid-{n}", container="main",
        replica="trainer-0", status=status, url=url, archived_at=archived_at, **extra)


def test_it_deletes_what_was_archived_or_lost_before_the_cut_and_keeps_the_rest(tmp_path: Path) -> None:
    old, new = row(tmp_path, 1, ARCHIVED, 40), row(tmp_path, 2, ARCHIVED, 5)
    lost = row(tmp_path, 3, LOST, None)
    PodLogArchive.objects.filter(id=lost.id).update(created_at=timezone.now() - timedelta(days=40))
    pending = row(tmp_path, 4, PENDING, None)
    PodLogArchive.objects.filter(id=pending.id).update(created_at=timezone.now() - timedelta(days=40))
    gone_already = row(tmp_path, 5, ARCHIVED, 50)
    Path(gone_already.url.removeprefix("file://")).unlink()  # a bucket rule deleted it first

    assert archive.purge(older_than=timezone.now() - timedelta(days=30)) == 3

    assert set(PodLogArchive.objects.values_list("id", flat=True)) == {new.id, pending.id}
    assert not Path(old.url.removeprefix("file://")).exists()
    assert Path(new.url.removeprefix("file://")).read_text().endswith("line of pod 2\n")


def test_it_keeps_the_row_of_an_object_the_store_cannot_delete_for_the_next_run(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    stuck, fine = row(tmp_path, 1, ARCHIVED, 40), row(tmp_path, 2, ARCHIVED, 40)
    real = archive.delete_object

    def flaky(url: str) -> None:
        if url == stuck.url:
            raise PermissionError("the store refused")
        real(url)

    monkeypatch.setattr(archive, "delete_object", flaky)
    assert archive.purge(older_than=timezone.now() - timedelta(days=30)) == 1
    assert list(PodLogArchive.objects.values_list("id", flat=True)) == [stuck.id]
    monkeypatch.setattr(archive, "delete_object", real)
    assert archive.purge(older_than=timezone.now() - timedelta(days=30)) == 1
    assert not PodLogArchive.objects.exists() and fine.id != stuck.id


def test_it_has_the_beat_task_keep_everything_by_default_and_honour_the_setting(tmp_path: Path, settings) -> None:
    old = row(tmp_path, 1, ARCHIVED, 400)
    assert settings.XMC_LOG_ARCHIVE_RETENTION_DAYS == 0
    assert tasks.purge_log_archive() == 0 and PodLogArchive.objects.filter(id=old.id).exists()
    settings.XMC_LOG_ARCHIVE_RETENTION_DAYS = 365
    assert tasks.purge_log_archive() == 1 and not PodLogArchive.objects.exists()
    assert "xmc.logs.purge_archive" in {e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values()}
