"""Client of the MachineLearningRun API (``hypercomputecluster.googleapis.com`` v1alpha, REST).

Only the calls the lifecycle needs: create (with ``machineLearningRunId``),
get, update (``updateMask=*``, the etag carried in the body) and delete
(``force``). Create, update and delete return long-running operations, which
are polled to completion here, so every method returns the finished result.

Errors are :class:`MLRunError` with the canonical ``error.status`` of the
JSON error body: HTTP 409 means ALREADY_EXISTS on create but ABORTED (etag
mismatch) on update, so the status, not the HTTP code, tells them apart.
A transport failure is ``UNAVAILABLE``.

Credentials come from a :class:`TokenProvider`: Google application default
credentials in production (imported lazily), a static token when
``XMC_MLRUN_TOKEN`` is set (tests and the local emulator). The base URL is
``XMC_MLRUN_ENDPOINT`` (default the public endpoint).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Protocol

import requests
from django.conf import settings

DEFAULT_ENDPOINT = "https://hypercomputecluster.googleapis.com"
API_VERSION = "v1alpha"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
#: Output-only fields dropped before an update (the SDK's read-modify-write does the same).
OUTPUT_ONLY = ("createTime", "updateTime", "endTime", "state")


class MLRunError(Exception):
    """A failed call; ``status`` is the canonical code name (NOT_FOUND, ABORTED, ...)."""

    def __init__(self, status: str, message: str, http_status: int = 0) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.http_status = http_status

    @property
    def not_found(self) -> bool:
        return self.status == "NOT_FOUND"

    @property
    def already_exists(self) -> bool:
        return self.status == "ALREADY_EXISTS"

    @property
    def etag_conflict(self) -> bool:
        # AIP-154 today says ABORTED; older services answered FAILED_PRECONDITION.
        return self.status in ("ABORTED", "FAILED_PRECONDITION")


class TokenProvider(Protocol):
    def token(self) -> str: ...


class StaticToken:
    def __init__(self, value: str) -> None:
        self.value = value

    def token(self) -> str:
        return self.value


class GoogleDefaultCredentials:
    """Application default credentials (the server's own service account), refreshed when stale."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._credentials: Any = None

    def token(self) -> str:
        import google.auth  # lazily: only production talks to Google
        import google.auth.transport.requests

        with self._lock:
            if self._credentials is None:
                self._credentials, _ = google.auth.default(scopes=[SCOPE])
            if not self._credentials.valid:
                self._credentials.refresh(google.auth.transport.requests.Request())
            return str(self._credentials.token)


def default_token_provider() -> TokenProvider:
    if settings.XMC_MLRUN_TOKEN:
        return StaticToken(settings.XMC_MLRUN_TOKEN)
    return GoogleDefaultCredentials()


class MLRunClient:
    def __init__(
        self,
        project: str,
        location: str,
        *,
        endpoint: str = "",
        credentials: TokenProvider | None = None,
        timeout_s: float = 15.0,
        operation_timeout_s: float = 45.0,
    ) -> None:
        self.project = project
        self.location = location
        self.base = (endpoint or DEFAULT_ENDPOINT).rstrip("/") + "/" + API_VERSION
        self.credentials = credentials or default_token_provider()
        self.timeout_s = timeout_s
        self.operation_timeout_s = operation_timeout_s
        self._session = requests.Session()

    @classmethod
    def from_settings(cls) -> MLRunClient:
        return cls(settings.XMC_MLRUN_PROJECT, settings.XMC_MLRUN_LOCATION, endpoint=settings.XMC_MLRUN_ENDPOINT)

    # --- names ---------------------------------------------------------------------------------

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.location}"

    def run_name(self, run_id: str) -> str:
        return f"{self.parent}/machineLearningRuns/{run_id}"

    # --- calls ---------------------------------------------------------------------------------

    def create(self, run_id: str, run: dict[str, Any]) -> dict[str, Any]:
        """Create the run ``run_id``; ALREADY_EXISTS raises (the caller decides what that means)."""
        op = self._call("POST", f"{self.parent}/machineLearningRuns", params={"machineLearningRunId": run_id}, body=run)
        return self._wait(op)

    def get(self, run_id: str) -> dict[str, Any]:
        return self._call("GET", self.run_name(run_id))

    def update(self, run: dict[str, Any]) -> dict[str, Any]:
        """Replace the whole run (``updateMask=*``); ``run`` must carry the etag it was read with."""
        body = {k: v for k, v in run.items() if k not in OUTPUT_ONLY}
        op = self._call("PATCH", str(run["name"]), params={"updateMask": "*"}, body=body)
        return self._wait(op)

    def delete(self, run_id: str, *, force: bool = True) -> None:
        op = self._call("DELETE", self.run_name(run_id), params={"force": "true" if force else "false"})
        self._wait(op)

    # --- plumbing ------------------------------------------------------------------------------

    def _call(
        self, method: str, path: str, *, params: dict[str, str] | None = None, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.credentials.token()}", "Content-Type": "application/json"}
        try:
            response = self._session.request(
                method, f"{self.base}/{path}", params=params, json=body, headers=headers, timeout=self.timeout_s
            )
        except requests.RequestException as exc:
            raise MLRunError("UNAVAILABLE", f"{method} {path}: {exc}") from exc
        try:
            data = response.json() if response.content else {}
        except ValueError:
            data = {}
        if response.status_code >= 400:
            error = data.get("error", {}) if isinstance(data, dict) else {}
            raise MLRunError(
                str(error.get("status") or _status_for_http(response.status_code)),
                str(error.get("message") or response.text[:200]),
                response.status_code,
            )
        return data if isinstance(data, dict) else {}

    def _wait(self, op: dict[str, Any]) -> dict[str, Any]:
        deadline = time.monotonic() + self.operation_timeout_s
        delay = 0.05
        while not op.get("done"):
            if time.monotonic() > deadline:
                raise MLRunError("DEADLINE_EXCEEDED", f"operation {op.get('name')} did not finish")
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
            op = self._call("GET", str(op["name"]))
        if "error" in op:
            error = op["error"]
            raise MLRunError(str(error.get("status") or _status_for_code(int(error.get("code", 2)))),
                             str(error.get("message", "")))
        response = dict(op.get("response") or {})
        response.pop("@type", None)
        return response


_HTTP_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                409: "ABORTED", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL",
                501: "UNIMPLEMENTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
_CODE_STATUS = {1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
                6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
                10: "ABORTED", 13: "INTERNAL", 14: "UNAVAILABLE", 16: "UNAUTHENTICATED"}


def _status_for_http(code: int) -> str:
    return _HTTP_STATUS.get(code, "UNKNOWN")


def _status_for_code(code: int) -> str:
    return _CODE_STATUS.get(code, "UNKNOWN")
