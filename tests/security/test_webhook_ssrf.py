"""Issue 40, item 1, written as the attack: a subscriber points a webhook or Slack URL at an
address inside the platform (the cloud metadata service, shared address space, loopback behind
an IPv6 form, a name that resolves inward, a name that re-resolves inward between the check and
the connection) and must get a refusal naming the field, never a POST to that address.

The receivers are real HTTP(S) servers on loopback; DNS answers are given at the resolver
(``socket.getaddrinfo``), which is where an attacker who controls a zone acts."""
from __future__ import annotations

import datetime
import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.test import Client

from notifications import channels, ssrf
from notifications.models import Subscription
from tests import factories
from tests.notifications.conftest import Receiver
from xmc.auth.tokens import issue_token

pytestmark = pytest.mark.django_db

METADATA = "100.100.100.200"  # a cloud metadata address, in 100.64.0.0/10


def subscribe(kind: str, url: str) -> tuple[int, Any]:
    r = Client().post("/v1/subscriptions", json.dumps({"allMyExperiments": True, "events": ["WORK_UNIT_FAILED"],
                                                        kind: {"url": url}}),
                      content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {issue_token(factories.ALICE)}")
    return r.status_code, json.loads(r.content)


def fake_dns(monkeypatch: pytest.MonkeyPatch, answers: dict[str, Callable[[], list[str]]]) -> list[str]:
    """Answer the names in ``answers`` (each call may answer differently); the names asked, in order."""
    real = socket.getaddrinfo
    asked: list[str] = []

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name not in answers:
            return real(host, port, *args, **kwargs)
        asked.append(name)
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, int(port or 0), 0, 0) if ":" in a else (a, int(port or 0))) for a in answers[name]()]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


@pytest.mark.parametrize("url,why", [
    (f"http://{METADATA}/latest/meta-data", "shared address space"),
    ("http://100.64.0.1/", "shared address space"),
    ("http://100.127.255.254:8080/", "shared address space"),
    ("http://[2002:a9fe:a9fe::]/latest/meta-data", "6to4 form of 169.254.169.254"),
    ("http://[2002:7f00:1::1]:8000/", "6to4 form of 127.0.0.1"),
    ("http://[::ffff:127.0.0.1]:8000/", "IPv4-mapped form of 127.0.0.1, loopback"),
    ("http://[::ffff:a9fe:a9fe]/", "link-local"),
    ("http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/", "Teredo client form of 192.0.2.45"),
    ("http://[64:ff9b::a9fe:a9fe]/", "NAT64 form of 169.254.169.254"),
    ("http://[::7f00:1]/", "IPv4-compatible form of 127.0.0.1"),
    ("http://0.0.0.0:8000/", "unspecified"),
    ("http://224.0.1.1/", "multicast"),
    ("http://[ff0e::1]/", "multicast"),
    ("http://192.0.2.10/", "private"),  # documentation range: not routable
])
@pytest.mark.parametrize("kind", ["webhook", "slack"])
def test_it_refuses_a_subscription_to_an_internal_address_in_any_form(kind: str, url: str, why: str) -> None:
    status, body = subscribe(kind, url)
    assert status == 400, body
    assert body["error"]["status"] == "INVALID_ARGUMENT"
    assert body["error"]["details"][0]["fieldViolations"][0]["field"] == f"{kind}.url"
    assert why in body["error"]["message"], body["error"]["message"]
    assert Subscription.objects.count() == 0


def test_it_refuses_a_host_name_that_resolves_to_the_metadata_address(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dns(monkeypatch, {"metadata.attacker.example": lambda: ["1.0.0.1", METADATA]})
    status, body = subscribe("slack", "https://metadata.attacker.example/services/T/B/x")
    assert status == 400 and body["error"]["details"][0]["fieldViolations"][0]["field"] == "slack.url"
    assert f"resolves to {METADATA}" in body["error"]["message"]


def test_it_accepts_a_globally_routable_address() -> None:
    assert ssrf.refusal("8.8.8.8") is None and ssrf.refusal("2606:4700:4700::1111") is None
    assert ssrf.refusal("2002:0808:0808::1") is None  # 6to4 of a global address


def test_it_never_connects_to_an_address_a_rebinding_name_turns_to_after_the_check(
        monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """The name answers a public address to the check and loopback (an internal service) after;
    a second lookup at connection time would POST to the internal service."""
    settings.XMC_WEBHOOK_ALLOWED_HOSTS = []
    settings.XMC_WEBHOOK_TIMEOUT_S = 0.5
    internal = Receiver().start()
    try:
        answers = iter([["1.0.0.1"]])  # the first answer: public
        asked = fake_dns(monkeypatch, {"rebind.attacker.example": lambda: next(answers, ["127.0.0.1"])})
        result = channels._post(f"http://rebind.attacker.example:{internal.port}/hook", b"{}", {})
        assert internal.requests == []
        assert asked == ["rebind.attacker.example"]  # looked up once: the connection went to 1.0.0.1
        assert not result.ok
    finally:
        internal.stop()


def test_it_sends_to_the_checked_address_with_the_url_host_in_the_host_header(
        monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """The loopback receiver is reachable only through the documented local setting; the name
    re-resolves elsewhere after the first lookup, and the request still reaches the receiver."""
    settings.XMC_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    receiver = Receiver().start()
    try:
        answers = iter([["127.0.0.1"]])
        asked = fake_dns(monkeypatch, {"hooks.example": lambda: next(answers, ["10.9.9.9"])})
        result = channels._post(f"http://hooks.example:{receiver.port}/hook?x=1", b"{}", {"x-test": "1"})
        assert result.ok, result
        assert asked == ["hooks.example"]
        assert receiver.requests[0].headers["host"] == f"hooks.example:{receiver.port}"
    finally:
        receiver.stop()


def test_it_refuses_loopback_without_the_local_setting(settings: Any) -> None:
    settings.XMC_WEBHOOK_ALLOWED_HOSTS = []
    receiver = Receiver().start()
    try:
        result = channels._post(receiver.url, b"{}", {})
        assert not result.ok and not result.retryable and "loopback" in result.error
        assert receiver.requests == []
    finally:
        receiver.stop()


# --- HTTPS: the SNI and the certificate are the URL's host's, the connection the checked address's ---


def _certificate(tmp: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class TlsReceiver:
    def __init__(self, cert: Path, key: Path) -> None:
        self.sni: list[str | None] = []
        self.hosts: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length", "0")))
                receiver.hosts.append(self.headers.get("host", ""))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        context.sni_callback = lambda sock, name, ctx: receiver.sni.append(name)  # type: ignore[assignment,func-returns-value]
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[TlsReceiver]:
    cert, key = _certificate(tmp_path, "hooks.example")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
    settings.XMC_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    fake_dns(monkeypatch, {"hooks.example": lambda: ["127.0.0.1"], "other.example": lambda: ["127.0.0.1"]})
    server = TlsReceiver(cert, key)
    yield server
    server.stop()


def test_it_sends_https_with_the_url_host_as_sni_and_checks_its_certificate(tls: TlsReceiver) -> None:
    result = channels._post(f"https://hooks.example:{tls.port}/hook", b"{}", {})
    assert result.ok, result
    assert tls.sni == ["hooks.example"] and tls.hosts == [f"hooks.example:{tls.port}"]


def test_it_refuses_a_certificate_for_another_name(tls: TlsReceiver) -> None:
    result = channels._post(f"https://other.example:{tls.port}/hook", b"{}", {})
    assert not result.ok and "SSL" in result.error and tls.hosts == []
