"""The one place that decides whether an actuator failure is worth a retry.

STATES.md ("Actuator preconditions"): NotFound, InvalidArgument,
FailedPrecondition and PermissionDenied, and the API server's 422 Invalid,
are permanent: the task is not retried, its operation is marked done with
the error and the task goes to the dead-letter store. Every other failure
(connection errors, 409 Conflict, 429, 5xx, timeouts) is retried with
exponential backoff and jitter up to a limit, then dead-lettered.

A bad signature (``core.task_wire.InvalidTask``) is permanent too: it never
reaches the cluster. The API server's status codes follow
https://github.com/kubernetes/apimachinery/blob/master/pkg/api/errors/errors.go
(404 NotFound, 403 Forbidden, 422 Invalid, 400 BadRequest).
"""
from __future__ import annotations

from dataclasses import dataclass

from core import errors as service_errors
from core import pb
from core.task_wire import InvalidTask
from k8s_bridge.client import ApiException

#: google.rpc.Code numbers by name (google/rpc/code.proto), as Operation.error carries them.
CODES: dict[str, int] = {str(name): int(number) for name, number in pb.rpc_code.Code.items()}

PERMANENT_CODES: frozenset[str] = frozenset(
    {"NOT_FOUND", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "PERMISSION_DENIED"}
)

#: HTTP status of the API server -> canonical code.
_HTTP_CODES: dict[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "PERMISSION_DENIED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    410: "ABORTED",
    422: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


@dataclass(frozen=True)
class Classified:
    code: str
    message: str
    permanent: bool

    def as_status(self) -> dict[str, object]:
        """The google.rpc.Status stored in ``Operation.error``."""
        return {"code": CODES.get(self.code, 2), "message": self.message}


class ActuatorError(Exception):
    """A failure a handler raises on purpose, with its canonical code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def classify(exc: BaseException) -> Classified:
    """Map any exception from a handler to a code and the retry decision."""
    if isinstance(exc, InvalidTask):
        return Classified("INVALID_ARGUMENT", f"invalid task: {exc}", True)
    if isinstance(exc, ActuatorError):
        return Classified(exc.code, exc.message, exc.code in PERMANENT_CODES)
    if isinstance(exc, service_errors.ServiceError):
        return Classified(exc.code, exc.message, exc.code in PERMANENT_CODES)
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        code = _HTTP_CODES.get(status, "UNAVAILABLE" if status == 0 or status >= 500 else "UNKNOWN")
        reason = exc.reason or ""
        return Classified(code, f"Kubernetes API {status} {reason}: {_body_message(exc)}".strip(),
                          code in PERMANENT_CODES)
    return Classified("UNAVAILABLE", f"{type(exc).__name__}: {exc}", False)


def is_permanent(exc: BaseException) -> bool:
    return classify(exc).permanent


def _body_message(exc: ApiException) -> str:
    import json

    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return str(exc.body or "")[:500]
    return str(body.get("message", ""))[:500] if isinstance(body, dict) else ""


def retry_after_seconds(exc: BaseException) -> float | None:
    """The API server's ``Retry-After`` (seconds) on a 429/503 answer, when it sent one."""
    if not isinstance(exc, ApiException) or int(exc.status or 0) not in (429, 503):
        return None
    headers = exc.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except (TypeError, ValueError):
        return None
