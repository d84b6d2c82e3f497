"""API enums shared by several apps, stored by their ``cloud.xmanager.v1`` names.

Enum columns hold the proto value *name* (``"NORMAL"``), never the number, so
rows read well in SQL and the admin and filters compare names. The
conversion module (``xmc.convert``) maps names to numbers and back.
"""
from __future__ import annotations

from django.db import models


class Priority(models.TextChoices):
    LOW = "LOW"
    NORMAL = "NORMAL"
    HIGH = "HIGH"


class Severity(models.TextChoices):
    UNSPECIFIED = "SEVERITY_UNSPECIFIED"
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    FATAL = "FATAL"


# Numeric order of severities, as in StructuredMessage.Severity.
SEVERITY_RANK = {"SEVERITY_UNSPECIFIED": 0, "DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "FATAL": 50}


class MessageSource(models.TextChoices):
    UNSPECIFIED = "SOURCE_UNSPECIFIED"
    XMANAGER_CLIENT = "XMANAGER_CLIENT"
    XMANAGER_BACKEND = "XMANAGER_BACKEND"
    ADAPTER = "ADAPTER"
    KUBERNETES = "KUBERNETES"
    SCHEDULER = "SCHEDULER"
    APPLICATION = "APPLICATION"
    USER_DEFINED = "USER_DEFINED"
