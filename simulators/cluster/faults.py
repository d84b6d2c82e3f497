"""Fault injection for the simulator's API server: what a real API server and network do on a bad day.

Rules match a request by verb (``get``, ``list``, ``watch``, ``create``,
``update``, ``patch``, ``delete`` or ``*``) and resource (the plural, e.g.
``jobsets``, or ``*``), fire with probability ``rate`` (a seeded random
source, so a run can be replayed) at most ``times`` times (-1: no limit),
and do one ``action``:

| action | what the client sees |
| --- | --- |
| ``error`` | an HTTP error with a Kubernetes Status body: ``status`` 500, 503, 429 (with ``Retry-After: retry_after``) or 409 (Conflict) |
| ``latency`` | the request is served after ``latency_s`` seconds |
| ``drop`` | the connection is closed before the request is served (nothing happened) |
| ``drop_after`` | the request is served, then the connection closed without the response (it happened; the client cannot know) |
| ``watch_close`` | a watch ends cleanly after ``after_events`` events (a server closing a watch mid-stream) |
| ``gone`` | a watch resumed from a ``resourceVersion`` gets 410 Gone (Expired), as after an etcd compaction |

Controlled at run time over HTTP on the simulator itself
(``GET /sim/faults``: the rules and how often each fired; ``POST
/sim/faults``: one rule or a list, or ``{"seed": n, "rules": [...]}``;
``DELETE /sim/faults``: clear), from a file at start (``python -m simulators.cluster
--faults FILE``, JSON or YAML of the same shape), or in-process
(``SimulatorHandle.faults``).
"""
from __future__ import annotations

import json
import random
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

VERBS = frozenset({"get", "list", "watch", "create", "update", "patch", "delete", "*"})
ACTIONS = frozenset({"error", "latency", "drop", "drop_after", "watch_close", "gone"})
ERROR_REASONS = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
                 504: "Timeout"}


@dataclass
class FaultRule:
    action: str = "error"
    verb: str = "*"
    resource: str = "*"
    rate: float = 1.0
    times: int = -1
    status: int = 500
    retry_after: int = 1
    latency_s: float = 0.0
    after_events: int = 0
    fired: int = 0

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"fault action must be one of {sorted(ACTIONS)}, not {self.action!r}")
        if self.verb not in VERBS:
            raise ValueError(f"fault verb must be one of {sorted(VERBS)}, not {self.verb!r}")
        if not 0.0 <= float(self.rate) <= 1.0:
            raise ValueError(f"fault rate must be within [0, 1], not {self.rate!r}")
        if self.action == "error" and self.status not in ERROR_REASONS:
            raise ValueError(f"fault status must be one of {sorted(ERROR_REASONS)}, not {self.status!r}")

    def matches(self, verb: str, resource: str) -> bool:
        if self.times == 0:
            return False
        if self.verb != "*" and self.verb != verb:
            return False
        return self.resource in ("*", resource)


@dataclass
class Decision:
    """What to do with one request (None fields: nothing of that kind)."""

    error: FaultRule | None = None
    latency_s: float = 0.0
    drop: bool = False
    drop_after: bool = False
    watch_close_after: int | None = None
    gone: bool = False


@dataclass
class Faults:
    rules: list[FaultRule] = field(default_factory=list)
    seed: int | None = None

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._random = random.Random(self.seed)

    # -- control ----------------------------------------------------------------------------

    def set(self, spec: Any) -> list[FaultRule]:
        """Add rules: one rule (a dict), a list, or {"seed": n, "rules": [...]} (which also reseeds)."""
        if isinstance(spec, dict) and "rules" in spec:
            if spec.get("seed") is not None:
                with self._lock:
                    self.seed = int(spec["seed"])
                    self._random = random.Random(self.seed)
            spec = spec["rules"]
        items = spec if isinstance(spec, list) else [spec]
        new = [r if isinstance(r, FaultRule) else FaultRule(**{k: v for k, v in dict(r).items() if k != "fired"})
               for r in items]
        with self._lock:
            self.rules.extend(new)
        return new

    def add(self, **rule: Any) -> FaultRule:
        return self.set(rule)[0]

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def load(self, path: str) -> None:
        text = Path(path).read_text()
        if path.endswith((".yaml", ".yml")):
            import yaml

            self.set(yaml.safe_load(text) or [])
        else:
            self.set(json.loads(text))

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"seed": self.seed, "rules": [asdict(r) for r in self.rules]}

    # -- the request path ---------------------------------------------------------------------

    def decide(self, verb: str, resource: str) -> Decision | None:
        if not self.rules:
            return None
        out = Decision()
        hit = False
        with self._lock:
            for rule in self.rules:
                if not rule.matches(verb, resource) or self._random.random() >= rule.rate:
                    continue
                if rule.times > 0:
                    rule.times -= 1
                rule.fired += 1
                hit = True
                if rule.action == "latency":
                    out.latency_s += rule.latency_s
                elif rule.action == "error" and out.error is None:
                    out.error = rule
                elif rule.action == "drop":
                    out.drop = True
                elif rule.action == "drop_after":
                    out.drop_after = True
                elif rule.action == "watch_close" and verb == "watch":
                    out.watch_close_after = rule.after_events
                elif rule.action == "gone" and verb == "watch":
                    out.gone = True
        return out if hit else None


def classify_request(method: str, path: str, query: dict[str, str]) -> tuple[str, str]:
    """(verb, resource plural) of an API request path; ("", "") for discovery and the like."""
    parts = [p for p in path.split("/") if p]
    if not parts or parts[0] not in ("api", "apis"):
        return "", ""
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    if not rest:
        return "", ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    resource = rest[0]
    named = len(rest) >= 2
    method = method.upper()
    if method == "GET":
        if query.get("watch", "").lower() in ("true", "1"):
            return "watch", resource
        return ("get" if named else "list"), resource
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, "")
    return verb, resource
