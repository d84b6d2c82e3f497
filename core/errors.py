"""Errors raised by service functions, classified once by canonical code.

Services raise these; the gRPC layer turns them into a status code, REST into
the error body of ``docs/architecture/rest.md``, the admin into a message. ``field`` names the
request field at fault so every adapter can say it.
"""
from __future__ import annotations


class ServiceError(Exception):
    """Base: a canonical gRPC code name, a message, and the field at fault."""

    code = "INTERNAL"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def __str__(self) -> str:
        return self.message


class InvalidArgument(ServiceError):
    code = "INVALID_ARGUMENT"


class NotFound(ServiceError):
    code = "NOT_FOUND"


class AlreadyExists(ServiceError):
    code = "ALREADY_EXISTS"


class FailedPrecondition(ServiceError):
    code = "FAILED_PRECONDITION"


class PermissionDenied(ServiceError):
    code = "PERMISSION_DENIED"


class Unauthenticated(ServiceError):
    code = "UNAUTHENTICATED"


class ResourceExhausted(ServiceError):
    code = "RESOURCE_EXHAUSTED"


class Aborted(ServiceError):
    code = "ABORTED"
