"""Creating and launching experiments with the real client (client contract 2, 5 and 8 steps 2-4).

Alice runs what a researcher runs: ``xm_cloud.create_experiment()`` and a
launch script under ``xmanager launch``. The executables are
``GoogleContainerRegistryImage`` objects built directly (no docker, no Google
credentials), exactly what xm_cloud packaging would hand to ``add()``. The
tests then look at what XMC stored.
"""
from __future__ import annotations

import pytest
from google.protobuf import json_format

from artifacts.models import Artifact
from artifacts.wire import artifact_to_proto
from core import pb
from experiments.models import Experiment
from experiments.wire import experiment_to_proto
from tests.system.real_client.conftest import ALICE, Client
from workunits.models import Operation, WorkUnit

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_creates_an_experiment_with_server_defaults_from_an_empty_request(alice_client: Client) -> None:
    run = alice_client.python(
        """
        from xmanager import xm_cloud
        exp = xm_cloud.create_experiment()
        report({"id": exp.id, "name": exp.resource_name, "author": exp.author, "priority": exp.priority,
                "launch_state": exp.status.launch_state, "active_state": exp.status.active_state,
                "created": exp.creation_time.isoformat()})
        """
    ).ok()

    seen = run.result
    assert seen["name"] == f"experiments/{seen['id']}"
    assert seen["author"] == ALICE  # from the verified token
    assert seen["priority"] == pb.priority.Priority.NORMAL
    assert seen["launch_state"] == pb.status.ExperimentStatus.LaunchState.LAUNCHING
    assert seen["active_state"] == pb.status.ExperimentStatus.ActiveState.ACTIVE
    stored = Experiment.objects.get(id=seen["id"])
    assert stored.creator == ALICE
    assert stored.launch_state == "LAUNCHING"
    # The request carried no ACLs (contract 2.1): the creator owns it.
    assert [role.user for role in experiment_to_proto(stored).acls.owners] == [ALICE]


def test_it_creates_an_experiment_with_title_tags_and_notes_and_keeps_the_script_as_an_artifact(
    alice_client: Client,
) -> None:
    run = alice_client.python(
        """
        from xmanager import xm_cloud
        exp = xm_cloud.create_experiment(experiment_title="edge of chaos", tags=["ckpt", "sweep"], notes="lr 0.1")
        report({"id": exp.id, "title": exp.title})
        """
    ).ok()

    stored = Experiment.objects.get(id=run.result["id"])
    assert (stored.title, stored.tags, stored.notes) == ("edge of chaos", ["ckpt", "sweep"], "lr 0.1")
    assert run.result["title"] == "edge of chaos"
    # Contract 2.2 B: no git repo here, so the launch script itself becomes the code artifact.
    [snapshot] = Artifact.objects.filter(experiment_id=stored.id)
    proto = _artifact_proto(snapshot)
    assert proto.data_type == pb.artifact.Artifact.DataType.CODE_SOURCE
    assert proto.lifecycle_phase == pb.artifact.Artifact.LifecyclePhase.INPUT
    assert proto.payload.code_source.code_block.startswith("\nimport json as _json")  # the script text
    assert proto.payload.code_source.title.endswith(".py")


LAUNCH_SCRIPT = """
from absl import app
from xmanager import xm, xm_cloud
from xmanager.xm_cloud import executor as xm_cloud_executor
from xmanager.xm_local import executables


def image(name, path):
    return executables.GoogleContainerRegistryImage(name=name, image_path=path)


def main(_):
    experiment = xm_cloud.create_experiment(experiment_title="launch story")
    with experiment:
        trainer = xm.Job(
            executable=image("trainer", "gcr.io/proj/trainer:v1"),
            executor=xm_cloud.KubernetesJobExecutor(
                requirements=xm.JobRequirements(cpu=2, memory=4 * xm.GiB, replicas=2),
                replica_retry_limit=3,
                active_deadline_seconds=600,
                annotations={"team": "ml"},
                service_account="trainer-ksa",
            ),
            args={"learning_rate": "0.1", "flag_only": "true"},
            env_vars={"FOO": "bar"},
            name="trainer",
        )
        experiment.add(trainer, settings=xm_cloud.WorkUnitSettings(tags=["cpu"], notes="first"))

        group = xm.JobGroup(
            server=xm.Job(
                executable=image("server", "gcr.io/proj/server:v2"),
                executor=xm_cloud.KubernetesJobExecutor(requirements=xm.JobRequirements(a100=2)),
            ),
            worker=xm.Job(
                executable=image("worker", "gcr.io/proj/worker:v3"),
                executor=xm_cloud.KubernetesJobExecutor(
                    requirements=xm.JobRequirements(tpu_v5e="2x4"),
                    dependency=xm_cloud_executor.Dependency(job_name="server"),
                ),
            ),
        )
        experiment.add(
            group,
            settings=xm_cloud.WorkUnitSettings(
                priority=xm_cloud.Priority.HIGH,
                scheduling_constraints=xm_cloud.SchedulingConstraints(queue_name="my-lq"),
            ),
        )
    report({"id": experiment.id})

if __name__ == "__main__":
    app.run(main)
"""

FAILING_SCRIPT = """
from absl import app
from xmanager import xm, xm_cloud
from xmanager.xm_local import executables


def main(_):
    experiment = xm_cloud.create_experiment(experiment_title="doomed")
    report({"id": experiment.id})
    with experiment:
        experiment.add(
            xm.Job(
                executable=executables.GoogleContainerRegistryImage(name="t", image_path="gcr.io/proj/t:v1"),
                executor=xm_cloud.KubernetesJobExecutor(requirements=xm.JobRequirements(cpu=1, memory=xm.GiB)),
                name="t",
            ),
            settings=xm_cloud.WorkUnitSettings(),
        )
        raise RuntimeError("the launch script gave up")
"""


def _artifact_proto(row: Artifact) -> pb.artifact.Artifact:
    return artifact_to_proto(row)


def _executable(wu: WorkUnit) -> pb.work_unit.Executable:
    return json_format.ParseDict(wu.executable, pb.work_unit.Executable(), ignore_unknown_fields=False)


def test_it_launches_a_cpu_job_and_a_gpu_tpu_group_with_xmanager_launch(alice_client: Client) -> None:
    script = alice_client.write("launch_story.py", LAUNCH_SCRIPT)
    run = alice_client.xmanager("launch", str(script)).ok()

    xid = run.result["id"]
    stored = Experiment.objects.get(id=xid)
    assert stored.launch_state == "COMPLETED"
    assert f"Launched experiment {xid} 'launch story'" in run.stdout
    cpu, group = WorkUnit.objects.filter(experiment_id=xid).order_by("wid")
    assert (cpu.wid, group.wid) == (1, 2)

    # (a) the CPU job, every field the client sends (contract 5.2).
    [trainer] = _executable(cpu).jobset.jobs
    assert trainer.name == "trainer"
    assert trainer.spec.docker_image == "gcr.io/proj/trainer:v1"
    assert trainer.spec.resources.cpu_resources.cpu_millicores == 2000
    assert trainer.spec.resources.cpu_resources.memory_bytes == 4 * 1024**3
    assert dict(trainer.spec.args) == {"learning_rate": "0.1", "flag_only": "true"}
    assert dict(trainer.spec.env_vars) == {"FOO": "bar"}
    assert dict(trainer.annotations) == {"team": "ml"}
    assert (trainer.replicas, trainer.retry_limit, trainer.active_deadline_seconds) == (2, 3, 600)
    assert trainer.service_account == "trainer-ksa"
    assert _executable(cpu).scheduling_constraints.queue_name == "cpu-queue"  # the client's default
    assert (cpu.tags, cpu.notes, cpu.priority) == (["cpu"], "first", "NORMAL")  # priority: the experiment's

    # (b) the group: GPU server, TPU worker waiting for it, HIGH priority, own queue.
    server, worker = _executable(group).jobset.jobs
    assert server.name == "server" and worker.name == "worker"
    assert server.spec.resources.gpu_resources.type == "A100"
    assert server.spec.resources.gpu_resources.count == 2
    assert worker.spec.resources.tpu_resources.type == "tpu-v5-lite-podslice"
    assert worker.spec.resources.tpu_resources.topology == "2x4"
    assert worker.dependency_order.job_name == "server"
    assert worker.dependency_order.job_dependency_state == pb.work_unit.KubernetesJob.DependencyOrder.READY
    assert _executable(group).scheduling_constraints.queue_name == "my-lq"
    assert group.priority == "HIGH"

    # The client parsed the WIDs out of these names (contract 2.4).
    names = sorted(op.name for op in Operation.objects.filter(experiment_id=xid, action_type="CREATE"))
    assert [n.split("/operations/")[0] for n in names] == [f"experiments/{xid}/workUnits/1", f"experiments/{xid}/workUnits/2"]


def test_it_records_a_failed_launch_and_still_accepts_the_work_unit_added_before_the_failure(
    alice_client: Client,
) -> None:
    script = alice_client.write("doomed.py", FAILING_SCRIPT + "\nif __name__ == '__main__':\n    from absl import app\n    app.run(main)\n")
    run = alice_client.xmanager("launch", str(script))

    assert run.returncode != 0
    assert "the launch script gave up" in run.stderr
    xid = run.result["id"]
    assert Experiment.objects.get(id=xid).launch_state == "FAILED"
    [wu] = WorkUnit.objects.filter(experiment_id=xid)
    assert wu.wid == 1


def test_it_lets_a_reloaded_experiment_add_work_units_and_allocates_their_ids(alice_client: Client) -> None:
    # Contract 2.4: an experiment loaded with get_experiment() has no id predictor;
    # CreateWorkUnit arrives with work_unit_id 0 and the server picks the WID.
    run = alice_client.python(
        """
        from xmanager import xm, xm_cloud
        from xmanager.xm_local import executables
        first = xm_cloud.create_experiment(experiment_title="again")
        job = xm.Job(
            executable=executables.GoogleContainerRegistryImage(name="t", image_path="gcr.io/proj/t:v1"),
            executor=xm_cloud.KubernetesJobExecutor(requirements=xm.JobRequirements(cpu=1, memory=xm.GiB)),
            name="t",
        )
        with first:
            first.add(job, settings=xm_cloud.WorkUnitSettings())
        again = xm_cloud.get_experiment(first.id)
        with again:
            again.add(job, settings=xm_cloud.WorkUnitSettings())
        report({"id": first.id, "wids": sorted(xm_cloud.get_experiment(first.id).work_units)})
        """
    ).ok()

    assert run.result["wids"] == [1, 2]
    assert list(WorkUnit.objects.filter(experiment_id=run.result["id"]).order_by("wid").values_list("wid", flat=True)) == [1, 2]
