"""What a researcher does with the real client after a launch (client contract 2.6, 5.3, 8 steps 5-8).

Each test is one client script: it launches a small experiment (two work
units, tagged so the client's ``wu.add_tags`` works), then reads it back,
changes it, attaches artifacts, or stops and restarts it, and reports what
the client saw. The tests compare that with what XMC stored.
"""
from __future__ import annotations

from collections.abc import Callable

import pytest

from artifacts.models import Artifact
from artifacts.wire import artifact_to_proto
from core import pb
from experiments.models import Experiment
from experiments.wire import experiment_to_proto
from tests.system.real_client.conftest import ALICE, Call, Client
from workunits.models import Operation, WorkUnit

pytestmark = pytest.mark.django_db(transaction=True)

#: Prepended to each script: ``launch(title, tags)`` -> experiment with work units 1 and 2.
LAUNCH = """
from xmanager import xm, xm_cloud
from xmanager.xm_local import executables
from xmanager_cloud.experiment_state_server import experiment_state_api

stub = experiment_state_api.get_experiment_state_api()


def launch(title, tags=()):
    experiment = xm_cloud.create_experiment(experiment_title=title, tags=list(tags))
    job = xm.Job(
        executable=executables.GoogleContainerRegistryImage(name="t", image_path="gcr.io/proj/t:v1"),
        executor=xm_cloud.KubernetesJobExecutor(requirements=xm.JobRequirements(cpu=1, memory=xm.GiB)),
        name="t",
    )
    with experiment:
        for i in (1, 2):
            experiment.add(job, settings=xm_cloud.WorkUnitSettings(tags=[f"wu{i}"], notes=""))
    return experiment
"""


def test_it_reads_experiments_work_units_and_status_messages_back(alice_client: Client) -> None:
    run = alice_client.python(
        LAUNCH,
        """
        edge = launch("edge of chaos", ["ckpt"])
        launch("plain", ["other"])

        again = xm_cloud.get_experiment(edge.id)
        wu = xm_cloud.get_work_unit(edge.id, 1)
        searched, _ = xm_cloud.list_experiments(stub, filter_query="tags:ckpt")
        listed, _ = xm_cloud.list_experiments(stub, filter_query='title:"edge"', strongly_consistent=True)
        mine, _ = xm_cloud.list_experiments(stub, filter_query='creator="alice@example.com"')
        exp_messages, _ = again.list_status_messages()
        wu_messages, _ = wu.list_status_messages(strongly_consistent=True)
        report({
            "id": edge.id,
            "title": again.title,
            "author": again.author,
            "launch_state": again.status.launch_state,
            "wu_name": wu.experiment_unit_name,
            "wu_id": wu.work_unit_id,
            "wu_tags": list(wu.work_unit_proto.tags),
            "wu_image": wu.work_unit_proto.executable.jobset.jobs[0].spec.docker_image,
            "work_units": sorted(again.work_units),
            "searched": [e.id for e in searched],
            "listed": [e.id for e in listed],
            "mine": sorted(e.id for e in mine),
            "messages": [len(exp_messages), len(wu_messages)],
        })
        """
    ).ok()

    seen = run.result
    xid = seen["id"]
    assert seen["title"] == "edge of chaos" and seen["author"] == ALICE
    assert seen["launch_state"] == pb.status.ExperimentStatus.LaunchState.COMPLETED
    assert (seen["wu_name"], seen["wu_id"], seen["wu_tags"]) == (f"experiments/{xid}/workUnits/1", 1, ["wu1"])
    assert seen["wu_image"] == "gcr.io/proj/t:v1"
    assert seen["work_units"] == [1, 2]
    assert seen["searched"] == [xid] and seen["listed"] == [xid]
    assert seen["mine"] == sorted(Experiment.objects.filter(creator=ALICE).values_list("id", flat=True))
    assert len(seen["mine"]) == 2
    assert seen["messages"] == [0, 0]  # nothing has run: no status messages yet, and no error


def test_it_applies_the_clients_updates_with_their_masks(alice_client: Client) -> None:
    run = alice_client.python(
        LAUNCH,
        """
        exp = launch("draft", ["a"])
        exp.set_title("final")
        exp.add_tags(["b", "c"])
        exp.set_notes("notes for the record")
        exp.set_priority(xm_cloud.Priority.HIGH)
        exp.set_acls(xm_cloud.Acls(
            owners=[xm_cloud.Acls.Role(user="alice@example.com")],
            readers=[xm_cloud.Acls.Role(user="bob@example.com"), xm_cloud.Acls.Role(domain="example.org")],
        ))
        wu = xm_cloud.get_work_unit(exp.id, 2)
        wu.set_notes("second thoughts")
        wu.add_tags(["retry"])
        wu.set_priority(xm_cloud.Priority.LOW)
        report({"id": exp.id, "title": exp.title, "tags": list(exp._experiment_proto.tags),
                "wu_tags": list(wu.work_unit_proto.tags), "wu_notes": wu.work_unit_proto.notes})
        """
    ).ok()

    seen = run.result
    stored = Experiment.objects.get(id=seen["id"])
    assert (stored.title, stored.tags, stored.notes, stored.priority) == (
        "final", ["a", "b", "c"], "notes for the record", "HIGH"
    )
    acls = experiment_to_proto(stored).acls
    assert [r.user for r in acls.owners] == [ALICE]
    assert [(r.user, r.domain) for r in acls.readers] == [("bob@example.com", ""), ("", "example.org")]
    # The client keeps the server's replies.
    assert (seen["title"], seen["tags"]) == ("final", ["a", "b", "c"])
    wu = WorkUnit.objects.get(experiment_id=seen["id"], wid=2)
    assert (wu.notes, wu.tags, wu.priority) == ("second thoughts", ["wu2", "retry"], "LOW")
    assert (seen["wu_tags"], seen["wu_notes"]) == (["wu2", "retry"], "second thoughts")


def test_it_round_trips_every_artifact_payload_on_experiments_and_work_units(alice_client: Client) -> None:
    run = alice_client.python(
        LAUNCH,
        """
        exp = launch("artifacts")
        wu = xm_cloud.get_work_unit(exp.id, 1)
        made = {}
        for owner_name, owner in (("exp", exp), ("wu", wu)):
            made[owner_name] = [
                owner.create_artifact(text="loss went down", title="Summary"),
                owner.create_artifact(url=xm_cloud.Url(url="https://tb.example.com/run/1"), display_name="TensorBoard",
                                      lifecycle_phase="OUTPUT", tags=["board", "ckpt"]),
                owner.create_artifact(code_source={"code_block": "print(1)", "code_url": "https://git.example.com/c/1"},
                                      title="snippet"),
                owner.create_artifact(managed_xprof={"display_name": "profile", "run_group": "gs://bucket/xprof"}),
                owner.create_artifact(chart={"metric_names": ["loss", "accuracy"]}, title="curves"),
            ]
        tagged, _ = exp.list_artifacts(filter_query="tags:ckpt")
        wu_all, _ = wu.list_artifacts(strongly_consistent=True)
        text_artifact = made["exp"][0]
        updated = xm_cloud.update_artifact(stub, text_artifact.name, notes="reviewed", tags=["final"])
        deleted = made["wu"][0]
        xm_cloud.delete_artifact(stub, deleted.name)
        left, _ = wu.list_artifacts()
        report({
            "id": exp.id,
            "made": {k: [[a.name, a.id, a.type, a.lifecycle_phase] for a in v] for k, v in made.items()},
            "xprof_url": made["exp"][3].payload_value.xprof.xprof_url,
            "tagged": [a.name for a in tagged],
            "wu_all": len(wu_all),
            "updated": [updated.name, updated._proto.notes, list(updated._proto.tags)],
            "deleted": deleted.name,
            "left": sorted(a.name for a in left),
        })
        """
    ).ok()

    seen = run.result
    xid = seen["id"]
    for owner, made in seen["made"].items():
        assert [kind for _, _, kind, _ in made] == ["text", "url", "code_source", "managed_xprof", "chart"], owner
        for name, aid, _, _ in made:
            assert name == f"artifacts/{aid}"
        assert [phase for *_, phase in made] == ["INPUT", "OUTPUT", "INPUT", "INPUT", "INPUT"]

    exp_rows = {a.id: artifact_to_proto(a) for a in Artifact.objects.filter(experiment_id=xid, work_unit=None)}
    text, url, code, xprof, chart = (exp_rows[aid] for _, aid, _, _ in seen["made"]["exp"])
    assert (text.payload.text.title, text.payload.text.text) == ("Summary", "loss went down")
    assert (text.notes, list(text.tags)) == ("reviewed", ["final"])
    assert url.payload.url.url == "https://tb.example.com/run/1" and list(url.tags) == ["board", "ckpt"]
    assert url.url.display_name == "TensorBoard"
    assert (code.payload.code_source.code_block, code.payload.code_source.code_url) == (
        "print(1)", "https://git.example.com/c/1"
    )
    assert (xprof.payload.managed_xprof.display_name, xprof.payload.managed_xprof.run_group) == (
        "profile", "gs://bucket/xprof"
    )
    assert list(chart.payload.chart.metric_names) == ["loss", "accuracy"]
    assert text.parent == f"experiments/{xid}"

    wu_names = [name for name, *_ in seen["made"]["wu"]]
    assert all(
        artifact_to_proto(a).parent == f"experiments/{xid}/workUnits/1"
        for a in Artifact.objects.filter(experiment_id=xid).exclude(work_unit=None)
    )
    # tags:ckpt under the experiment: its own url artifact, nothing untagged. (Whether the
    # work unit's ckpt artifact belongs in this list too is the server's choice: it does now.)
    assert seen["made"]["exp"][1][0] in seen["tagged"]
    assert set(seen["tagged"]) <= {seen["made"]["exp"][1][0], seen["made"]["wu"][1][0]}
    assert seen["wu_all"] == 5
    assert seen["updated"] == [seen["made"]["exp"][0][0], "reviewed", ["final"]]
    assert seen["deleted"] == wu_names[0]
    assert seen["left"] == sorted(wu_names[1:])
    assert not Artifact.objects.filter(id=seen["made"]["wu"][0][1]).exists()


def test_it_stops_and_restarts_every_work_unit_with_the_clients_command_functions(
    alice_client: Client, rpc_log: list[Call]
) -> None:
    run = alice_client.python(
        LAUNCH,
        """
        from xmanager.xm_cloud.cli import restart_command, stop_command
        exp = launch("stop me")
        stopped = stop_command._stop_experiment(str(exp.id))
        stop_command.stop_command(["xmanager", "stop", str(exp.id)])
        restarted = restart_command._restart_experiment(str(exp.id))
        report({"id": exp.id, "stopped": stopped.name, "restarted": restarted.name})
        """
    ).ok()

    xid = run.result["id"]
    assert f"Stopping experiment {xid}." in run.stdout
    # Contract 2.6: the parent only, no filter, meaning every work unit.
    batches = [call for call in rpc_log if "/Batch" in call.method]
    assert [call.method.rsplit("/", 1)[1] for call in batches] == [
        "BatchStopWorkUnits", "BatchStopWorkUnits", "BatchRestartWorkUnits"
    ]
    assert {(call.request.parent, call.request.filter) for call in batches} == {(f"experiments/{xid}", "")}
    for key, action in (("stopped", "STOP"), ("restarted", "RESTART")):
        name = run.result[key]
        assert name.startswith(f"experiments/{xid}/operations/"), name
        op = Operation.objects.get(id=int(name.rsplit("/", 1)[1]))
        assert op.action_type == action
        assert op.original_requester == ALICE


def test_it_lets_a_reader_read_but_not_write_and_keeps_others_out(make_client: Callable[..., Client]) -> None:
    alice, bob, carol = make_client(ALICE), make_client("bob@example.com"), make_client("carol@example.com")
    xid = alice.python(
        """
        from xmanager import xm_cloud
        exp = xm_cloud.create_experiment(experiment_title="alice's")
        exp.set_acls(xm_cloud.Acls(owners=[xm_cloud.Acls.Role(user="alice@example.com")],
                                   readers=[xm_cloud.Acls.Role(user="bob@example.com")]))
        report({"id": exp.id})
        """
    ).ok().result["id"]
    attempt = """
        import grpc
        from xmanager import xm_cloud
        seen = {}
        try:
            exp = xm_cloud.get_experiment(XID)
            seen["read"] = exp.title
            exp.set_title("bob was here")
            seen["write"] = "OK"
        except grpc.RpcError as exc:
            seen["refused"] = exc.code().name
        report(seen)
        """.replace("XID", str(xid))

    assert bob.python(attempt).ok().result == {"read": "alice's", "refused": "PERMISSION_DENIED"}
    assert carol.python(attempt).ok().result["refused"] in {"PERMISSION_DENIED", "NOT_FOUND"}
    assert Experiment.objects.get(id=xid).title == "alice's"
