"""XMC_LOG_FORMAT=json: one JSON object per line, with the ids a pipeline filters on."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

from xmc.logs import JsonFormatter, PlainFormatter

ROOT = Path(__file__).resolve().parents[3]


def test_it_writes_the_event_and_every_extra_field_as_json() -> None:
    record = logging.LogRecord("reconciler", logging.INFO, __file__, 1, "reconciler.flush", None, None)
    record.xid, record.wid, record.batch = 7, 3, 12
    entry = json.loads(JsonFormatter().format(record))
    assert entry["event"] == "reconciler.flush" and entry["level"] == "INFO" and entry["logger"] == "reconciler"
    assert (entry["xid"], entry["wid"], entry["batch"]) == (7, 3, 12)
    assert entry["time"].endswith("+00:00")


def test_it_prints_the_extra_fields_after_the_event_in_the_plain_format() -> None:
    record = logging.LogRecord("xmc.api.grpc_server", logging.INFO, __file__, 1, "grpc.rpc", None, None)
    record.method, record.code, record.identity = "ExperimentStateService/GetExperiment", "OK", "alice example"
    line = PlainFormatter("%(levelname)s %(name)s %(message)s").format(record)
    assert line == ('INFO xmc.api.grpc_server grpc.rpc method=ExperimentStateService/GetExperiment code=OK '
                    'identity="alice example"')


def test_it_keeps_the_exception_in_the_same_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "task.failed", None, sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line and "ValueError: boom" in json.loads(line)["exception"]


@pytest.mark.django_db
def test_it_logs_one_line_per_request_with_its_request_id(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="xmc.request"):
        response = Client().get("/v1/experiments", HTTP_X_REQUEST_ID="req-42")
    assert response["X-Request-ID"] == "req-42"
    [record] = [r for r in caplog.records if r.name == "xmc.request"]
    assert record.getMessage() == "http.request"
    assert (record.request_id, record.method, record.path, record.status) == ("req-42", "GET", "/v1/experiments", 401)


def test_it_configures_every_process_from_the_environment() -> None:
    code = "import logging, django; django.setup(); logging.getLogger('probe').info('probe.event', extra={'wid': 5})"
    env = {**os.environ, "XMC_LOG_FORMAT": "json", "DJANGO_SETTINGS_MODULE": "xmc.settings"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    entry = json.loads(out.stderr.strip().splitlines()[-1])
    assert entry["event"] == "probe.event" and entry["wid"] == 5
