"""Issue 38, item 3: notifications a researcher can act on, through the real receivers (the
webhook receiver, aiosmtpd). The links open the pages, a failure says which job, with which
arguments, why and its last log line; one message per recipient and event; "finished" never
arrives before the failures it sums up; no message about what happened before subscribing;
bodies fit a phone."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from core import pb
from experiments.models import Experiment
from k8s_bridge.models import PodLogArchive
from notifications import payloads, services, sources
from notifications.models import Delivery, DeliveryStatus, Event
from tests import factories
from tests.fixtures.people import new_user
from tests.notifications.helpers import fail, set_state
from workunits import services as wu_services
from workunits.choices import WorkUnitState
from workunits.models import WorkUnit, WorkUnitExecution
from xmc.auth.identity import Identity

pytestmark = pytest.mark.django_db
ALICE = factories.ALICE
UI = "https://xmc.example.org"


@pytest.fixture(autouse=True)
def _pages_elsewhere(settings: Any) -> None:
    settings.XMC_UI_URL = UI  # XMANAGER_UI_URL


def subject(mail: Any) -> str:
    return " ".join(str(mail["Subject"]).split())  # unfolded


def text(mail: Any) -> str:
    return mail.get_payload(decode=True).decode().replace("\r\n", "\n")


def launched(**kw: Any) -> Experiment:
    exp = factories.experiment(**kw)
    Experiment.objects.filter(id=exp.id).update(launch_state="COMPLETED")
    return exp


def unit(exp: Experiment, **args: str) -> WorkUnit:
    executable = factories.executable(name="train")
    executable.jobset.jobs[0].spec.args.update({"data": "imagenet", **args})
    op = wu_services.create_work_unit(exp.id, pb.work_unit.WorkUnit(executable=executable), work_unit_id=0)
    return WorkUnit.objects.get(id=op.work_unit_id)


def ended(wu: WorkUnit, *, exit_code: int, reason: str, tail: str) -> None:
    """The log archive's row for the unit's container, as the archiver writes it when the pod ends."""
    PodLogArchive.objects.create(
        xid=wu.experiment_id, wid=wu.wid, eid=wu.current_eid, namespace="default", pod_name=f"pod-{wu.wid}",
        pod_uid=f"uid-{wu.wid}", container="train", replica="train-0", exit_code=exit_code, reason=reason,
        status=PodLogArchive.Status.ARCHIVED, tail=tail, archived_at=timezone.now())


def notify_me(exp: Experiment, **channel: Any) -> int:
    """The experiment page's "Notify me": failures and the end, by email unless told otherwise."""
    return services.create(Identity(ALICE), {"experiment": f"experiments/{exp.id}",
                                             "events": ["WORK_UNIT_FAILED", "EXPERIMENT_FINISHED"],
                                             **(channel or {"email": {}})}).subscription.id


def all_mine(**channel: Any) -> int:
    return services.create(Identity(ALICE), {"allMyExperiments": True, "events": ["WORK_UNIT_FAILED"],
                                             **(channel or {"email": {}})}).subscription.id


def test_it_says_which_job_failed_with_which_args_why_and_its_last_line(receiver, smtp, outbox) -> None:
    exp = launched(title="resnet sweep")
    bad, _ok = unit(exp, lr="0.1", seed="1"), unit(exp, lr="0.01", seed="1")
    ended(bad, exit_code=137, reason="OOMKilled", tail="epoch 3/10\nloading batch 812\nKilled\n\n")
    notify_me(exp, webhook={"url": receiver.url})
    notify_me(exp)
    fail(bad)
    outbox.pump()

    [request] = receiver.requests
    data = request.json["data"]
    assert data["experiment"]["url"] == f"{UI}/experiments/{exp.id}"  # the page, not /v1/experiments/...
    [wu] = data["workUnits"]
    assert wu["url"] == f"{UI}/experiments/{exp.id}/workUnits/{bad.wid}"
    assert (wu["jobName"], wu["args"]) == ("train", {"lr": "0.1"})  # only what sets it apart
    assert wu["reason"] == "out of memory (OOMKilled) in train"
    assert wu["lastLogLine"] == "Killed"

    [mail] = smtp.messages
    assert subject(mail) == "[XMC] 1 work unit failed in resnet sweep: out of memory (OOMKilled) in train"
    body = text(mail)
    for words in (f"train (work unit {bad.wid})", "lr=0.1", "out of memory (OOMKilled) in train",
                  "last line: Killed", f"{UI}/experiments/{exp.id}/workUnits/{bad.wid}",
                  f"{UI}/experiments/{exp.id}\n"):
        assert words in body, body
    assert "/v1/" not in body and "seed=" not in body


def test_it_gives_the_system_message_as_the_reason_when_no_container_log_is_known(receiver, outbox) -> None:
    exp = launched()
    wu, _running = unit(exp), unit(exp)
    notify_me(exp, webhook={"url": receiver.url})
    # The reason a writer recorded: the execution's system message (its first line).
    WorkUnitExecution.objects.filter(work_unit=wu).update(system_message={
        "userFacingText": "The create operation finished but no JobSet exists: Kubernetes API 500\nmore text"})
    fail(wu)
    outbox.pump()
    [request] = receiver.requests
    assert request.json["data"]["workUnits"][0]["reason"] == (
        "The create operation finished but no JobSet exists: Kubernetes API 500")


def test_it_sends_one_message_per_recipient_however_many_subscriptions_match(receiver, smtp, outbox) -> None:
    exp = launched()
    wu, _running = unit(exp), unit(exp)
    all_mine()
    notify_me(exp)  # "Notify me" on top of "all my experiments", both by email
    all_mine(slack={"url": f"{receiver.url}/slack"})
    notify_me(exp, slack={"url": f"{receiver.url}/slack"})  # and twice the same Slack channel
    fail(wu)
    outbox.pump()
    assert len(smtp.messages) == 1 and smtp.recipients == [[ALICE]]
    assert len(receiver.requests) == 1


def test_it_makes_two_webhook_subscriptions_on_one_url_two_endpoints_each_verifying_its_own_secret(receiver, outbox) -> None:
    """A webhook's recipient is the subscription (its URL and the secret made for it): one message
    signed for the other subscription would fail the check of a receiver holding only its own."""
    exp = launched()
    wu, _running = unit(exp), unit(exp)
    secrets = [services.create(Identity(ALICE), {"experiment": f"experiments/{exp.id}", "events": ["WORK_UNIT_FAILED"],
                                                 "webhook": {"url": receiver.url}}).secret for _ in range(2)]
    fail(wu)
    outbox.pump()
    assert len(receiver.requests) == 2
    for secret in secrets:  # each receiver (secret) gets one message it can verify
        assert sum(webhook_verifies(secret, r) for r in receiver.requests) == 1


def webhook_verifies(secret: str | None, request: Any) -> bool:
    from standardwebhooks.webhooks import Webhook, WebhookVerificationError

    try:
        Webhook(str(secret)).verify(request.body, request.headers)
    except WebhookVerificationError:
        return False
    return True


def two_teams_sharing(member: str, exp: Experiment) -> None:
    """Groups ml-team (ann, ben) and vision (ann, cat), both readers of ``exp``, both subscribed by staff."""
    from django.contrib.auth.models import Group, User

    teams = {"ml-team": ("ann", "ben"), "vision": (member, "cat")}
    for team, names in teams.items():
        group = Group.objects.create(name=team)
        for name in names:
            User.objects.get_or_create(username=name, defaults={"email": f"{name}@example.com"})[0].groups.add(group)
    new_user("olivia", is_staff=True)
    Experiment.objects.filter(id=exp.id).update(acls={"readers": [{"group": t} for t in teams]})
    for team in teams:
        services.create(Identity("olivia@example.com", is_staff=True),
                        {"group": team, "experiment": f"experiments/{exp.id}", "events": ["WORK_UNIT_FAILED"],
                         "email": {}})


def emails_to(smtp: Any, address: str) -> int:
    return sum(address in envelope for envelope in smtp.recipients)


def test_it_sends_one_email_per_event_to_a_member_of_two_subscribed_groups(smtp, outbox) -> None:
    exp = launched()
    first, second, _running = unit(exp, seed="1"), unit(exp, seed="2"), unit(exp, seed="3")
    two_teams_sharing("ann", exp)
    fail(first)
    outbox.pump()
    # Ann is in both groups: the first group's email reaches her, the second's leaves her out.
    assert sorted(smtp.recipients) == [["ann@example.com", "ben@example.com"], ["cat@example.com"]]
    fail(second)
    outbox.pump()
    assert {who: emails_to(smtp, f"{who}@example.com") for who in ("ann", "ben", "cat")} == {
        "ann": 2, "ben": 2, "cat": 2}  # one email per person and event
    # A fan-out run again (a redelivered task, the sweep) decides the same and creates nothing new.
    before = (Delivery.objects.count(), len(smtp.messages))
    Event.objects.update(done=False)
    services.fan_out_many(list(Event.objects.values_list("id", flat=True)))
    outbox.pump()
    assert (Delivery.objects.count(), len(smtp.messages)) == before


def test_it_sends_failures_coalesced_for_two_groups_to_their_shared_member_once(smtp, outbox, settings) -> None:
    settings.XMC_NOTIFY_COALESCE_S = 60
    exp = launched()
    units = [unit(exp, seed=str(i)) for i in range(3)]
    two_teams_sharing("ann", exp)
    fail(units[0])
    fail(units[1])
    outbox.pump()
    later = timezone.now() + timedelta(seconds=61)
    for d in Delivery.objects.exclude(status=DeliveryStatus.DELIVERED):
        services.deliver(d.id, now=later)
    assert sorted(smtp.recipients) == [["ann@example.com", "ben@example.com"], ["cat@example.com"]]
    assert all(subject(m).startswith("[XMC] 2 work units failed") for m in smtp.messages)


def test_it_sends_finished_after_the_failures_it_sums_up(smtp, outbox, settings) -> None:
    settings.XMC_NOTIFY_COALESCE_S = 60  # failures wait out the window; "finished" would not
    exp = launched(title="sweep")
    units = [unit(exp, seed=str(i)) for i in range(5)]
    notify_me(exp)
    fail(*units[:2])
    outbox.pump()
    assert smtp.messages == []  # the failures' window is open
    fail(*units[2:4])
    set_state(units[4:], WorkUnitState.COMPLETED)  # the last unit ends: the experiment has finished
    outbox.pump()
    later = timezone.now() + timedelta(seconds=61)
    for d in Delivery.objects.exclude(status=DeliveryStatus.DELIVERED):
        services.deliver(d.id, now=later)
    # The summary folded in the waiting failures: one message, "finished", listing the four.
    [mail] = smtp.messages
    assert subject(mail) == "[XMC] sweep finished, 4 work units failed"
    body = text(mail)
    assert body.count("• train (work unit") == 4 and "completed: 1" in body and "failed: 4" in body
    assert Delivery.objects.count() == 1


def test_it_sends_the_failures_before_finished_when_they_already_went(smtp, outbox) -> None:
    exp = launched(title="sweep")
    a, b = unit(exp, seed="1"), unit(exp, seed="2")
    notify_me(exp)
    fail(a)
    outbox.pump()
    set_state([b], WorkUnitState.COMPLETED)
    outbox.pump()
    assert [subject(m) for m in smtp.messages] == [
        "[XMC] 1 work unit failed in sweep", "[XMC] sweep finished, 1 work unit failed"]


def test_it_never_tells_a_subscription_about_what_happened_before_it_existed(receiver, smtp, outbox) -> None:
    done = launched(title="done before")
    ended_unit = unit(done)
    set_state([ended_unit], WorkUnitState.FAILED)  # nobody listens yet: no event
    running = launched(title="running")
    still, _other = unit(running), unit(running)
    notify_me(done)
    notify_me(running, webhook={"url": receiver.url})
    assert sources.scan_finished() != []  # the sweep records "done before" finished (it ended minutes ago)
    outbox.fan_outs.extend(Event.objects.filter(done=False).values_list("id", flat=True))
    outbox.pump()
    assert smtp.messages == []  # it ended before the subscription existed
    fail(still)
    outbox.pump()
    assert len(receiver.requests) == 1  # what happens after subscribing does arrive


def test_it_keeps_email_and_slack_bodies_readable_on_a_phone(receiver, smtp, outbox) -> None:
    exp = launched(title="a rather long experiment title that goes on and on about what it trains")
    wu = unit(exp, learning_rate="0.000123456789", optimizer="adamw-with-a-very-long-schedule-name")
    unit(exp, learning_rate="0.1", optimizer="sgd")
    ended(wu, exit_code=1, reason="Error", tail="Traceback (most recent call last): " + "x" * 400)
    notify_me(exp)
    notify_me(exp, slack={"url": receiver.url})
    fail(wu)
    outbox.pump()
    body = text(smtp.messages[0])
    for line in body.splitlines():
        assert len(line) <= payloads.WRAP or line.strip().startswith("http"), line
    message = receiver.requests[0].json
    for block in message["blocks"]:
        if block["type"] == "section" and "text" in block:
            assert all(len(line) <= 300 for line in block["text"]["text"].splitlines())
    section = next(b["text"]["text"] for b in message["blocks"]
                   if b["type"] == "section" and "work unit" in b.get("text", {}).get("text", ""))
    assert section.startswith(f"*<{UI}/experiments/{exp.id}/workUnits/{wu.wid}|train (work unit {wu.wid})>*")
    assert "exited with code 1 in train" in section


def test_it_links_a_message_retried_after_the_system_moved_to_where_it_is_now(receiver, smtp, outbox, settings) -> None:
    """The body is stored at the first try; its links are paths, made URLs on the origin of each send (issue 39)."""
    exp = launched(title="moved")
    bad = unit(exp, lr="0.1")
    receiver.secret = services.create(Identity(ALICE), {
        "experiment": f"experiments/{exp.id}", "events": ["WORK_UNIT_FAILED"],
        "webhook": {"url": receiver.url}}).secret
    receiver.statuses = [500]
    fail(bad)
    outbox.pump()
    d = Delivery.objects.get()
    assert d.status == DeliveryStatus.PENDING and d.attempts == 1
    stored = payloads.json.loads(d.body)["data"]
    assert stored["experiment"] == {"name": f"experiments/{exp.id}", "title": "moved", "path": f"/experiments/{exp.id}"}
    assert "url" not in stored["workUnits"][0]
    settings.XMC_UI_URL = "http://127.0.0.1:8001"  # restarted where 8000 was taken
    services.deliver(d.id, now=d.next_attempt_time + timedelta(seconds=1))
    first, second = receiver.requests
    assert first.json["data"]["experiment"]["url"] == f"{UI}/experiments/{exp.id}"
    assert second.json["data"]["experiment"]["url"] == f"http://127.0.0.1:8001/experiments/{exp.id}"
    assert second.json["data"]["workUnits"][0]["url"] == f"http://127.0.0.1:8001/experiments/{exp.id}/workUnits/{bad.wid}"
    assert "path" not in second.json["data"]["experiment"] and second.verified  # signed as sent


def ended_in_cluster(cluster: Any, wu: WorkUnit, script: str) -> tuple[dict[str, Any], str]:
    """Run ``wu``'s JobSet with the pod ``script`` until its container ends: (its status, its log's last line)."""
    from k8s_bridge import client
    from tests.waiting import eventually

    cluster.create_jobset(wu, script=script)

    def terminated() -> Any:
        pods = client.core().list_namespaced_pod("default").to_dict()["items"]
        mine = [p for p in pods if p["metadata"]["name"].startswith(f"xmc-{wu.experiment_id}-{wu.wid}-")]
        states = [s["state"] for p in mine for s in (p["status"].get("container_statuses") or [])]
        return mine[0] if states and states[0].get("terminated") else None

    pod = eventually(terminated, timeout=60, what="the container ended")
    log = client.core().read_namespaced_pod_log(pod["metadata"]["name"], "default", container="main")
    return pod["status"]["container_statuses"][0]["state"]["terminated"], log.rstrip("\n").splitlines()[-1]


def test_it_carries_in_a_failure_message_the_last_line_of_a_log_not_archived_yet(cluster, receiver, outbox) -> None:
    """The archiver works on its own (and may be behind, or its store down): a message built before
    the log is archived reads the container's ending and last line from the cluster."""
    exp = launched()
    wu, _running = unit(exp), unit(exp)
    notify_me(exp, webhook={"url": receiver.url})
    ending, last_line = ended_in_cluster(cluster, wu, "pull=0s;print=loading batch 812;run=1s;"
                                                      "stderr=CUDA error: out of memory;exit=3")
    fail(wu)
    outbox.pump()
    assert not PodLogArchive.objects.exists()  # nothing archived
    [request] = receiver.requests
    [failed] = request.json["data"]["workUnits"]
    assert failed["lastLogLine"] == last_line and f"code {ending['exit_code']}" in last_line
    assert failed["reason"] == f"exited with code {ending['exit_code']} in main"


def test_it_delays_a_failure_message_once_when_the_cluster_does_not_answer_and_never_loses_it(cluster, receiver,
                                                                                          outbox) -> None:
    """The cluster hangs: the messages go (the reason from the system message, no last line) after
    one bounded wait; the next unit does not ask the hanging cluster again."""
    exp = launched()
    units = [unit(exp, seed=str(i)) for i in range(3)]
    notify_me(exp, webhook={"url": receiver.url})
    WorkUnitExecution.objects.filter(work_unit__in=units[:2]).update(system_message={
        "userFacingText": "JobSet failed (FailedJobs)"})
    hang = cluster.handle.faults.add(action="latency", verb="get", resource="jobsets", latency_s=5)
    fail(units[0])
    outbox.pump()
    asked = hang.fired  # the client's tries of one read
    fail(units[1])
    outbox.pump()
    listed = [u for r in receiver.requests for u in r.json["data"]["workUnits"]]
    assert [u["reason"] for u in listed] == ["JobSet failed (FailedJobs)"] * 2
    assert not any(u.get("lastLogLine") for u in listed)
    assert asked >= 1 and hang.fired == asked  # the second message did not wait on it again
