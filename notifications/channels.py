"""Channels: one small adapter per way out, behind one interface (:class:`ChannelAdapter`).

Each ``send`` gets the subscription, the frozen payload and the message id and
returns a :class:`SendResult`; it never raises for a failure of the receiver.
Every HTTP call has a timeout and follows no redirect; the URL's host is
resolved once right before the call, every address checked
(``notifications.ssrf.resolve``), and the connection made to the checked
address itself, with the URL's host as ``Host`` header and TLS SNI.
"""
from __future__ import annotations

import json
import os
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import certifi
import urllib3
from django.conf import settings
from django.core import mail

from notifications import crypto, payloads, signing, ssrf
from notifications.models import Channel, Subscription
from core.errors import InvalidArgument


@dataclass(frozen=True)
class SendResult:
    ok: bool
    status_code: int | None = None
    error: str = ""
    #: False: trying again cannot help (an SSRF target); the delivery is dead at once.
    retryable: bool = True


class ChannelAdapter(Protocol):
    def send(self, subscription: Subscription, message_id: str, body: str, *,
             left_out: Sequence[str] = ()) -> SendResult: ...


def breaker_key(subscription: Subscription) -> str:
    """What a circuit breaker counts failures by: the subscription. One subscriber's failing
    receiver (or a message their own data breaks) never holds back anyone else's, even on the
    same host, the same Slack or the same mail server."""
    return f"subscriptions/{subscription.id}"


def _ca_bundle() -> str:
    """The CA certificates HTTPS sends trust: ``REQUESTS_CA_BUNDLE`` / ``SSL_CERT_FILE`` when set
    (as the requests library honoured them), else certifi's bundle."""
    return os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("SSL_CERT_FILE") or certifi.where()


def _pool(target: ssrf.Target) -> urllib3.HTTPConnectionPool:
    """A connection pool to the checked address itself (never the name: no second DNS lookup);
    for HTTPS the URL's host is the SNI and the name the certificate must carry."""
    timeout = urllib3.Timeout(connect=settings.XMC_WEBHOOK_TIMEOUT_S, read=settings.XMC_WEBHOOK_TIMEOUT_S)
    if target.scheme == "https":
        return urllib3.HTTPSConnectionPool(
            target.address, target.port, timeout=timeout, retries=False, maxsize=1,
            server_hostname=target.host, assert_hostname=target.host, cert_reqs="CERT_REQUIRED",
            ca_certs=_ca_bundle())
    return urllib3.HTTPConnectionPool(target.address, target.port, timeout=timeout, retries=False, maxsize=1)


def _post(url: str, data: bytes, headers: dict[str, str]) -> SendResult:
    """POST ``data`` to ``url``: resolved once, checked (notifications.ssrf), connected to that
    address; no redirect followed, at most 500 characters of a failure's answer kept."""
    try:
        target = ssrf.resolve(url, field="url")
    except InvalidArgument as exc:
        return SendResult(False, None, exc.message, retryable=False)
    pool = _pool(target)
    try:
        response = pool.urlopen("POST", target.path, body=data, headers={**headers, "host": target.host_header},
                                redirect=False, retries=False, assert_same_host=False, preload_content=False)
        try:
            status, answer = response.status, response.read(2000, decode_content=True)
        finally:
            response.release_conn()
    except urllib3.exceptions.HTTPError as exc:
        return SendResult(False, None, f"{type(exc).__name__}: {exc}"[:1000])
    finally:
        pool.close()
    if 200 <= status < 300:
        return SendResult(True, status)
    if 300 <= status < 400:
        return SendResult(False, status, "redirect not followed")
    return SendResult(False, status, answer.decode("utf-8", "replace")[:500])


def subscription_secrets(subscription: Subscription, now_ts: float | None = None) -> list[str]:
    """The secrets that sign now: the current one, and the previous while its overlap lasts."""
    result = [crypto.decrypt(subscription.secret_encrypted)]
    expires = subscription.previous_secret_expires
    if subscription.previous_secret_encrypted and expires and expires.timestamp() > (now_ts or time.time()):
        result.append(crypto.decrypt(subscription.previous_secret_encrypted))
    return result


class Webhook:
    def send(self, subscription: Subscription, message_id: str, body: str, *,
             left_out: Sequence[str] = ()) -> SendResult:
        timestamp = int(time.time())
        body = payloads.linked(body)
        headers = {"content-type": "application/json", "user-agent": "xmc-notifications/1",
                   **signing.headers(subscription_secrets(subscription), message_id, timestamp, body)}
        return _post(subscription.url, body.encode(), headers)


class Slack:
    def send(self, subscription: Subscription, message_id: str, body: str, *,
             left_out: Sequence[str] = ()) -> SendResult:
        message = payloads.slack(json.loads(payloads.linked(body)))
        return _post(slack_url(subscription), json.dumps(message).encode(), {"content-type": "application/json"})


def slack_url(subscription: Subscription) -> str:
    """The Slack incoming-webhook URL, decrypted (stored encrypted: it is the channel's secret)."""
    return crypto.decrypt(subscription.url_encrypted) if subscription.url_encrypted else subscription.url


def group_members(group: str) -> list[str]:
    """Emails of the active members of a Django group, sorted."""
    from django.contrib.auth.models import User

    return sorted({e for e in User.objects.filter(groups__name=group, is_active=True).exclude(email="")
                   .values_list("email", flat=True)})


#: Longest subject line (RFC 5322 recommends 78 characters a line; folding handles the rest).
SUBJECT_MAX = 200


def header_text(value: str, limit: int = SUBJECT_MAX) -> str:
    """``value`` as one header line: every line break and control character (CR, LF, the Unicode
    line and paragraph separators, NUL, ...) becomes a space, runs of spaces one, at most
    ``limit`` characters. A title with a line break can neither add a header nor fail the send
    (Django refuses headers with a newline)."""
    text = "".join(" " if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c for c in value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


class Email:
    def send(self, subscription: Subscription, message_id: str, body: str, *,
             left_out: Sequence[str] = ()) -> SendResult:
        """To the address, or to a group's active members but those in ``left_out`` (they hear of
        the same events through another subscription's message: ``Delivery.left_out``)."""
        payload = json.loads(payloads.linked(body))
        if subscription.group:
            members = group_members(subscription.group)
            recipients = [m for m in members if m.lower() not in {a.lower() for a in left_out}]
            if not recipients:
                return SendResult(True, 250, "every active member hears of it through another message"
                                  if members else "the group has no active member with an email")
        else:
            recipients = [subscription.email or subscription.owner]
        message = mail.EmailMessage(
            subject=header_text(f"[XMC] {payloads.title(payload)}"), body=payloads.text(payload),
            to=recipients[:1], bcc=recipients[1:],
            headers={"Message-ID": f"<{message_id}@xmc>", "X-XMC-Event-Type": str(payload["type"])})
        try:
            message.connection = mail.get_connection(timeout=settings.EMAIL_TIMEOUT)
        except TypeError:  # a backend without a timeout (file, locmem)
            message.connection = mail.get_connection()
        try:
            message.send(fail_silently=False)
        except Exception as exc:  # SMTP errors, refused connections, timeouts
            return SendResult(False, None, f"{type(exc).__name__}: {exc}"[:1000])
        return SendResult(True, 250)


ADAPTERS: dict[str, Any] = {Channel.WEBHOOK: Webhook(), Channel.SLACK: Slack(), Channel.EMAIL: Email()}


def adapter(subscription: Subscription) -> ChannelAdapter:
    return ADAPTERS[subscription.channel]
