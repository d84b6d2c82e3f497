"""The chaos suite's launch script (bench/chaos_client.py): the real client, and what it sends again.

The script runs as bench/chaos.py runs it (the client's virtualenv and
environment, JSON lines on stdin and stdout) against the in-process server,
whose handlers are wrapped here to lose answers the way the chaos faults do:
the first ``CreateWorkUnit`` and the first ``BatchRestartWorkUnits`` commit
and then answer UNAVAILABLE (the server died before it replied), the first
``BatchStopWorkUnits`` answers UNAVAILABLE without running (the database was
down). Each must still be carried out exactly once.
"""
from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError

from tests.system.real_client.client_env import python_of
from tests.system.real_client.conftest import Client
from workunits.models import Operation, WorkUnit
from xmc.api import registry

pytestmark = pytest.mark.django_db(transaction=True)

DRIVER = Path(__file__).resolve().parents[3] / "bench" / "chaos_client.py"
PREFIX = "CHAOS: "


@pytest.fixture
def lossy(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """The first call of some RPCs fails with UNAVAILABLE (after its handler ran, or before); calls counted."""
    import xmc.api.handlers  # noqa: F401 - fill the registry before wrapping it

    after = {"CreateWorkUnit", "BatchRestartWorkUnits"}
    before = {"BatchStopWorkUnits"}
    calls: Counter[str] = Counter()
    for key, rpc in list(registry.RPCS.items()):

        def lose(request: Any, caller: registry.Caller, _rpc: registry.Rpc = rpc) -> Any:
            calls[_rpc.method] += 1
            first = calls[_rpc.method] == 1
            if first and _rpc.method in before:
                raise OperationalError("the database is down (test)")
            answer = _rpc.handler(request, caller)
            if first and _rpc.method in after:
                raise OperationalError("the answer was lost (test)")
            return answer

        monkeypatch.setitem(registry.RPCS, key, registry.Rpc(rpc.service, rpc.method, rpc.request, rpc.response, lose))
    return calls


class Driver:
    def __init__(self, client: Client) -> None:
        self.popen = subprocess.Popen(
            [str(python_of(client.venv)), str(DRIVER)], cwd=client.workdir, env=client.env(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.next_id = 0

    def ask(self, op: str, **args: Any) -> dict[str, Any]:
        """One command, its answer (one at a time here: the answers come in order)."""
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.next_id += 1
        self.popen.stdin.write(json.dumps({"id": self.next_id, "op": op, **args}) + "\n")
        self.popen.stdin.flush()
        for line in self.popen.stdout:
            if line.startswith(PREFIX):
                reply = json.loads(line[len(PREFIX):])
                assert reply.pop("id") == self.next_id
                assert "error" not in reply, reply["error"]
                return reply
        raise AssertionError(f"the driver exited: {self.popen.wait()}\n{self.stderr()}")

    def stderr(self) -> str:
        assert self.popen.stderr is not None
        return self.popen.stderr.read()


@pytest.fixture
def driver(alice_client: Client) -> Iterator[Driver]:
    started = Driver(alice_client)
    yield started
    if started.popen.poll() is None:
        started.popen.kill()
        started.popen.wait(timeout=10)


def test_it_carries_out_each_command_once_though_answers_are_lost(driver: Driver, lossy: Counter[str]) -> None:
    xid = driver.ask("create_experiment", title="chaos")["xid"]
    added = [driver.ask("add", script="pull=1s;run=4s;exit=0", cpu=0.1, tags=["chaos-restart"])["wid"],
             driver.ask("add", script="pull=1s;run=4s;exit=0", cpu=0.1, tags=["chaos-restart"])["wid"],
             driver.ask("add", script="pull=1s;run=9s;exit=0", cpu=2, tags=["chaos-preempt"], priority="LOW",
                        queue="demo-queue")["wid"],
             driver.ask("add", script="pull=1s;run=100000s;exit=0", cpu=0.1, tags=["chaos-stop"])["wid"]]
    assert driver.ask("state", wid=1) == {"state": "INITIALIZING", "eid": 1}
    driver.ask("restart", tag="chaos-restart")
    driver.ask("stop", tag="chaos-stop")
    driver.ask("close")
    assert driver.popen.wait(timeout=30) == 0
    log = driver.stderr()

    # The wids the client's predictor reserved, each one work unit; the lost create answer was resent.
    assert added == [1, 2, 3, 4]
    units = {wu.wid: wu for wu in WorkUnit.objects.filter(experiment_id=xid)}
    assert sorted(units) == [1, 2, 3, 4]
    assert lossy["CreateWorkUnit"] == 5 and "CreateWorkUnit: UNAVAILABLE, sending it again" in log
    assert Operation.objects.filter(experiment_id=xid, action_type="CREATE").count() == 4
    # What the client built from the executor and the settings.
    preempt = units[3]
    [job] = preempt.executable["jobset"]["jobs"]
    assert job["annotations"] == {"sim.xmc.dev/script": "pull=1s;run=9s;exit=0"}
    assert job["spec"]["resources"]["cpuResources"]["cpuMillicores"] == "2000"  # int64: a string in JSON
    assert (preempt.priority, preempt.executable["schedulingConstraints"]["queueName"]) == ("LOW", "demo-queue")
    assert units[1].executable["schedulingConstraints"]["queueName"] == "cpu-queue"  # the client's default
    # The restart whose answer was lost was not sent again: one batch, each target on execution 2.
    assert lossy["BatchRestartWorkUnits"] == 1 and "it was (every target on a new execution)" in log
    assert (units[1].current_eid, units[2].current_eid, units[3].current_eid) == (2, 2, 1)
    assert Operation.objects.filter(experiment_id=xid, action_type="RESTART", parent=None).count() == 1
    # The stop refused at first was sent again, and stopped only its tag's unit.
    assert lossy["BatchStopWorkUnits"] == 2
    assert list(Operation.objects.filter(experiment_id=xid, action_type="STOP").exclude(work_unit=None)
                .values_list("work_unit__wid", flat=True)) == [4]
    assert units[4].experiment.launch_state == "COMPLETED"
