"""The researcher's subscription pages: thin views over ``notifications.services``.

``/subscriptions`` lists the signed-in person's subscriptions and creates one
from a form; ``/subscriptions/<id>`` is one subscription's settings and its
delivery log; ``/subscriptions/<id>/actions`` enables, disables, deletes (after
a confirmation), sends a test event, sends a logged message again and rotates
a webhook's secret;
``/experiments/<xid>/notify`` is the experiment page's "Notify me". Every call
goes through the same service functions as ``/v1/subscriptions`` with the
caller's `Identity`, so the rules are the REST API's: a person sees and
changes only their own (someone else's reads as missing, 404), an experiment
must be readable to be subscribed to, and a webhook's signing secret is shown
once, in the answer of the create or rotate POST, never again. A service's
``InvalidArgument`` / ``PermissionDenied`` names the field at fault; the form
comes back with the message next to that field and nothing is written.
"""
from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.errors import NotFound, ServiceError
from notifications import services
from notifications.models import Channel, DeliveryStatus, EventType, Scope, Subscription
from ui import reads
from ui.views import _ids, signed_in
from xmc.auth.identity import Identity

log = logging.getLogger(__name__)

#: The events of the experiment page's "Notify me" (by email to the caller).
NOTIFY_ME_EVENTS = [EventType.WORK_UNIT_FAILED.value, EventType.EXPERIMENT_FINISHED.value]

#: The log re-reads itself every second while a message is due within this long (not for one held back
#: for hours by quiet hours, the rate limit or an open circuit).
LOG_REFRESH_HORIZON = timedelta(seconds=30)
_OPEN = (DeliveryStatus.PENDING, DeliveryStatus.DELIVERING)

#: The service's field names (``ServiceError.field``) -> the form field whose message it is.
_FIELD = {
    "experiment": "experiment", "filter": "filter", "allMyExperiments": "what", "events": "events",
    "webhook": "url", "slack": "url", "webhook.url": "url", "slack.url": "url",
    "email": "channel", "email.address": "channel", "rateLimitPerHour": "rate", "queuedMinutes": "queued",
    "quietHours": "quiet", "quietHours.start": "quiet", "quietHours.end": "quiet", "enabled": "enabled",
    "delivery": "form",
}

_EVENT_WORDS = {
    EventType.WORK_UNIT_FAILED: "a work unit failed",
    EventType.EXPERIMENT_FINISHED: "the experiment finished",
    EventType.WORK_UNIT_QUEUED_TOO_LONG: "a work unit waits in the queue too long",
    EventType.WORK_UNIT_IDLE: "a work unit's GPUs sit idle",
    EventType.SCHEDULING_PAUSED: "scheduling paused (staff)",
    EventType.SCHEDULING_RESUMED: "scheduling resumed (staff)",
    EventType.OPERATOR_DELIVERY_DEGRADED: "work waits for a worker (staff)",
}


def _event_choices(identity: Identity) -> list[tuple[str, str]]:
    staff = {str(e) for e in services.STAFF_EVENTS}
    return [(str(e), _EVENT_WORDS[EventType(e)]) for e in services.SUBSCRIBABLE
            if identity.is_staff or str(e) not in staff]


def _int_or_raw(text: str) -> int | str:
    """An integer field as typed: an int, or the text itself for the service to refuse (naming the field)."""
    text = text.strip()
    return int(text) if (text.isascii() and text.isdigit()) and len(text) <= 9 else text


def _settings_body(post: QueryDict, *, creating: bool, channel: str) -> dict[str, Any]:
    """The fields both forms share (events, URL, rate limit, quiet hours, queue threshold) as the REST body."""
    body: dict[str, Any] = {"events": post.getlist("events")}
    url = post.get("url", "").strip()
    if channel in ("webhook", "slack") and (creating or url):
        body[channel] = {"url": url}
    for key, name in (("rateLimitPerHour", "rate"), ("queuedMinutes", "queued")):
        if post.get(name, "").strip():
            body[key] = _int_or_raw(post.get(name, ""))
    start, end = post.get("quiet_start", "").strip(), post.get("quiet_end", "").strip()
    if start or end:
        body["quietHours"] = {"start": start, "end": end}
    elif not creating:
        body["quietHours"] = None
    return body


def _create_body(post: QueryDict) -> dict[str, Any]:
    """The create form as the body of POST /v1/subscriptions (the service validates every field)."""
    channel = post.get("channel", "email")
    body = _settings_body(post, creating=True, channel=channel)
    what = post.get("what", "experiment")
    if what == "mine":
        body["allMyExperiments"] = True
    elif what == "filter":
        body["filter"] = post.get("filter", "")
    else:
        text = post.get("experiment", "").strip()
        body["experiment"] = text if text.startswith("experiments/") else f"experiments/{text}"
    if channel == "email":
        body["email"] = {}
    elif channel not in ("webhook", "slack"):
        body[channel or "channel"] = {}  # refused by the service, naming the field
    return body


def _errors(exc: ServiceError) -> dict[str, str]:
    return {_FIELD.get(exc.field or "", "form"): exc.message}


def _row(sub: Subscription, last: Any) -> dict[str, Any]:
    if sub.scope == Scope.EXPERIMENT:
        what = f"experiment {sub.experiment_id}"
    elif sub.scope == Scope.MINE:
        what = "all my experiments"
    elif sub.scope == Scope.FILTER:
        what = f"filter: {sub.filter}"
    else:
        what = "scheduling"
    target = sub.email if sub.channel == Channel.EMAIL else sub.url
    quiet = ""
    if sub.quiet_start is not None and sub.quiet_end is not None:
        quiet = f"{sub.quiet_start:%H:%M}–{sub.quiet_end:%H:%M} UTC"
    return {"sub": sub, "what": what, "channel": sub.channel.lower(), "target": target, "quiet": quiet,
            "events": [_EVENT_WORDS.get(EventType(e), e) for e in sub.events], "last": last}


def _list_context(identity: Identity, post: QueryDict | None = None, errors: dict[str, str] | None = None,
                  **extra: Any) -> dict[str, Any]:
    subs = services.list_for(identity)
    last = services.last_deliveries(subs)
    form = post if post is not None else QueryDict(mutable=True)
    return {"rows": [_row(s, last.get(s.id)) for s in subs], "event_choices": _event_choices(identity),
            "form": form, "chosen_events": form.getlist("events") if post is not None else NOTIFY_ME_EVENTS,
            "errors": errors or {}, "me": identity.email, **extra}


@require_http_methods(["GET", "POST"])
@signed_in
def subscriptions(request: HttpRequest, identity: Identity) -> HttpResponse:
    """GET: the caller's subscriptions and the create form; POST: create (the secret is in this answer only)."""
    if request.method == "GET":
        return render(request, "ui/subscriptions.html", _list_context(identity))
    try:
        created = services.create(identity, _create_body(request.POST))
    except ServiceError as exc:
        context = _list_context(identity, request.POST, _errors(exc))
        return render(request, "ui/subscriptions.html", context, status=400)
    log.info("ui.subscription.create", extra={"subscription": created.subscription.id, "by": identity.email})
    context = _list_context(identity, created=created.subscription, secret=created.secret)
    return _no_store(render(request, "ui/subscriptions.html", context))


def _no_store(response: HttpResponse) -> HttpResponse:
    """An answer that carries a secret must not be kept by a cache (or the browser's back button)."""
    response["Cache-Control"] = "no-store"
    return response


def _detail_context(identity: Identity, sub: Subscription, post: QueryDict | None = None,
                    errors: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    """The settings form (as saved, or as posted when the service refused it) and the delivery log."""
    # A Slack URL is a secret stored encrypted: the form starts empty (empty: unchanged).
    saved = {"url": sub.url if sub.channel != Channel.SLACK else "", "rate": str(sub.rate_limit_per_hour), "queued": str(sub.queued_minutes),
             "quiet_start": f"{sub.quiet_start:%H:%M}" if sub.quiet_start is not None else "",
             "quiet_end": f"{sub.quiet_end:%H:%M}" if sub.quiet_end is not None else ""}
    values = {k: post.get(k, "") for k in saved} if post is not None else saved
    log_rows = services.deliveries(identity, sub.id)
    deliveries = [{"d": d, "tries": list(d.attempt_log.all())} for d in log_rows]
    soon = reads.now() + LOG_REFRESH_HORIZON
    in_flight = any(d.status in _OPEN and d.next_attempt_time <= soon for d in log_rows)
    return {"row": _row(sub, None), "sub": sub, "deliveries": deliveries, "in_flight": in_flight,
            "event_choices": _event_choices(identity),
            "chosen_events": post.getlist("events") if post is not None else list(sub.events), "values": values,
            "errors": errors or {}, **extra}


@require_GET
@signed_in
def subscription(request: HttpRequest, identity: Identity, sid: str) -> HttpResponse:
    """One of the caller's subscriptions: settings and the delivery log (``?fragment=log``: the log alone)."""
    (s,) = _ids(sid)
    sub = services.get(identity, s)
    template = "ui/_deliveries.html" if request.GET.get("fragment") == "log" else "ui/subscription.html"
    return render(request, template, _detail_context(identity, sub))


@require_POST
@signed_in
def subscription_act(request: HttpRequest, identity: Identity, sid: str) -> HttpResponse:
    """enable / disable / update / test / resend / rotate / delete (delete and rotate ask first)."""
    (s,) = _ids(sid)
    sub = services.get(identity, s)
    action = request.POST.get("action", "")
    confirmed = request.POST.get("confirm") == "yes"
    if action in ("delete", "rotate") and not confirmed:
        return render(request, "ui/subscription_confirm.html", {"sub": sub, "row": _row(sub, None), "action": action})
    try:
        if action in ("enable", "disable"):
            services.update(identity, s, {"enabled": action == "enable"})
        elif action == "update":
            body = _settings_body(request.POST, creating=False, channel=sub.channel.lower())
            services.update(identity, s, body)
        elif action == "resend":
            services.resend(identity, s, request.POST.get("message", "")[:64])
        elif action == "test":
            delivery = services.send_test(identity, s)
            log.info("ui.subscription.test", extra={"subscription": s, "delivery": delivery.message_id})
        elif action == "rotate":
            rotated = services.rotate_secret(identity, s)
            context = _detail_context(identity, rotated.subscription, secret=rotated.secret,
                                      overlap=services.overlap_note(rotated.subscription))
            return _no_store(render(request, "ui/subscription.html", context))
        elif action == "delete":
            services.delete(identity, s)
            log.info("ui.subscription.delete", extra={"subscription": s, "by": identity.email})
            return redirect("ui-subscriptions")
        else:
            return render(request, "ui/error.html", {"message": "Unknown action."}, status=400)
    except NotFound as exc:
        if exc.field != "delivery":
            raise  # the subscription is missing or someone else's: the 404 page
        context = _detail_context(identity, sub, None, _errors(exc))
        return render(request, "ui/subscription.html", context, status=404)
    except ServiceError as exc:
        post = request.POST if action == "update" else None
        context = _detail_context(identity, services.get(identity, s), post, _errors(exc))
        return render(request, "ui/subscription.html", context, status=400)
    return redirect(reverse("ui-subscription", args=[s]) + ("?sent=1" if action == "test" else ""))


@require_POST
@signed_in
def notify_me(request: HttpRequest, identity: Identity, xid: str) -> HttpResponse:
    """The experiment page's "Notify me": email me when a unit fails or the experiment finishes."""
    (x,) = _ids(xid)
    reads.role(identity, x)  # permission first: an unreadable experiment is the 404 page
    try:
        created = services.create(identity, {"experiment": f"experiments/{x}", "events": NOTIFY_ME_EVENTS,
                                              "email": {}})
    except ServiceError as exc:
        return render(request, "ui/error.html", {"message": str(exc)}, status=400)
    return redirect("ui-subscription", created.subscription.id)
