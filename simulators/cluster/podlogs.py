"""``GET /api/v1/namespaces/{ns}/pods/{name}/log`` of the simulated API server.

`simulators.cluster.apiserver.Api` hands the request here once it has the pod.
Behaviour follows the real API server and kubelet (kubernetes
``pkg/apis/core/validation.ValidatePodLogOptions``,
``pkg/kubelet/kuberuntime/logs``):

* query ``container``, ``follow``, ``previous``, ``timestamps``,
  ``tailLines``, ``sinceSeconds``, ``sinceTime``, ``limitBytes`` and
  ``stream`` (``All`` | ``Stdout`` | ``Stderr``, alpha upstream);
* an unparseable value is 400 BadRequest naming the parameter; a value the
  validation refuses is 422 Invalid ``PodLogOptions "<pod>" is invalid:
  <field>: Invalid value: ...`` (negative ``tailLines``, ``limitBytes`` or
  ``sinceSeconds`` below 1, both ``sinceSeconds`` and ``sinceTime``,
  ``tailLines`` with a single stream);
* ``timestamps`` prefixes each line with its RFC 3339 time with nanoseconds,
  trailing zeros trimmed (Go's ``time.RFC3339Nano``), then a space;
* ``sinceTime`` / ``sinceSeconds`` keep lines written at or after that time
  (simulated time: the store's clock), then ``tailLines`` keeps the last N,
  then ``limitBytes`` cuts the bytes;
* ``follow`` sends what is there and keeps the chunked response open,
  pushing each new line as the kubelet stand-in writes it, until the
  container stops running (exit, restart, pod deleted) or the client goes.

Lines come from `LogSource`: ``(sim_time, text)`` or ``(sim_time, text,
stream)`` tuples for one container attempt (the current one, or the previous
with ``previous``).
"""
from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from simulators.cluster.store import ApiError, bad_request

#: (sim time, text, stream) of one container log line
Line = tuple[float, str, str]
#: lines of (container, previous) for the pod being read
LogSource = Callable[[bool], Sequence[Line]]
#: the pod as stored now (raises ApiError 404 when gone)
PodSource = Callable[[], dict[str, Any]]

STREAMS = ("All", "Stderr", "Stdout")
#: wall seconds between two looks at the log while following
FOLLOW_POLL_S = 0.1

_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def format_rfc3339_nano(ts: float) -> str:
    """Go's ``time.RFC3339Nano`` in UTC: nanoseconds with trailing zeros trimmed."""
    whole = int(ts // 1)
    nanos = int(round((ts - whole) * 1e9))
    if nanos >= 1_000_000_000:
        whole, nanos = whole + 1, nanos - 1_000_000_000
    base = dt.datetime.fromtimestamp(whole, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    frac = f"{nanos:09d}".rstrip("0")
    return f"{base}.{frac}Z" if frac else f"{base}Z"


def parse_rfc3339(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 time; ValueError when it is not one."""
    if not _RFC3339.match(text):
        raise ValueError(text)
    value = text.replace("Z", "+00:00")
    frac = re.search(r"\.(\d+)", value)
    if frac and len(frac.group(1)) > 6:  # Python parses at most microseconds
        value = value.replace(frac.group(0), "." + frac.group(1)[:6])
    return dt.datetime.fromisoformat(value).timestamp()


@dataclass(frozen=True)
class LogOptions:
    container: str
    follow: bool = False
    previous: bool = False
    timestamps: bool = False
    tail_lines: int | None = None
    since: float | None = None  # absolute sim time
    limit_bytes: int | None = None
    stream: str = "All"


def _invalid(pod: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """422 Invalid of PodLogOptions; causes are (reason, field, message)."""
    texts = [f"{f}: {m}" if f else m for _, f, m in causes]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    return ApiError(422, "Invalid", f'PodLogOptions "{pod}" is invalid: {joined}',
                    {"name": pod, "kind": "PodLogOptions",
                     "causes": [{"reason": r, "message": m, "field": f} for r, f, m in causes]})


def _int(query: dict[str, str], name: str) -> int | None:
    value = query.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)  # type: ignore[arg-type]
    except ValueError:
        raise bad_request(f'invalid value for {name}: strconv.ParseInt: parsing "{value}": invalid syntax') from None


def _bool(query: dict[str, str], name: str) -> bool:
    value = query.get(name)
    if value in (None, ""):
        return False
    lowered = str(value).lower()
    if lowered in ("true", "1", "t"):
        return True
    if lowered in ("false", "0", "f"):
        return False
    raise bad_request(f'invalid value for {name}: strconv.ParseBool: parsing "{value}": invalid syntax')


def parse_options(query: dict[str, str], pod: str, container: str, now: float) -> LogOptions:
    """The validated options of one request (400 unparseable, 422 refused)."""
    tail = _int(query, "tailLines")
    limit = _int(query, "limitBytes")
    since_seconds = _int(query, "sinceSeconds")
    since_time: float | None = None
    raw_time = query.get("sinceTime")
    if raw_time:
        try:
            since_time = parse_rfc3339(raw_time)
        except ValueError:
            raise bad_request(f'invalid value for sinceTime: parsing time "{raw_time}" as '
                              f'"2006-01-02T15:04:05Z07:00": cannot parse "{raw_time}"') from None
    stream = query.get("stream") or "All"
    causes: list[tuple[str, str, str]] = []
    if tail is not None and tail < 0:
        causes.append(("FieldValueInvalid", "tailLines", f"Invalid value: {tail}: must be greater than or equal to 0"))
    if limit is not None and limit < 1:
        causes.append(("FieldValueInvalid", "limitBytes", f"Invalid value: {limit}: must be greater than 0"))
    if since_seconds is not None and since_time is not None:
        causes.append(("FieldValueForbidden", "", "Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified"))
    elif since_seconds is not None and since_seconds < 1:
        causes.append(("FieldValueInvalid", "sinceSeconds", f"Invalid value: {since_seconds}: must be greater than 0"))
    if stream not in STREAMS:
        causes.append(("FieldValueNotSupported", "stream",
                       f'Unsupported value: "{stream}": supported values: ' + ", ".join(f'"{s}"' for s in STREAMS)))
    elif stream != "All" and tail is not None:
        causes.append(("FieldValueForbidden", "",
                       "Forbidden: `tailLines` and specific `stream` are mutually exclusive for now"))
    if causes:
        raise _invalid(pod, causes)
    since = since_time if since_time is not None else (now - since_seconds if since_seconds is not None else None)
    return LogOptions(container=container, follow=_bool(query, "follow"), previous=_bool(query, "previous"),
                      timestamps=_bool(query, "timestamps"), tail_lines=tail, since=since, limit_bytes=limit,
                      stream=stream)


def normalise(lines: Sequence[Any]) -> list[Line]:
    """Provider output ((t, text) or (t, text, stream) tuples, or a string) as `Line` triples."""
    if isinstance(lines, str):
        return [(0.0, line, "stdout") for line in lines.splitlines()]
    out: list[Line] = []
    for item in lines:
        if len(item) >= 3:
            out.append((float(item[0]), str(item[1]), str(item[2])))
        else:
            out.append((float(item[0]), str(item[1]), "stdout"))
    return out


def select_lines(lines: Sequence[Line], opts: LogOptions) -> list[Line]:
    """Stream and since filters, then the tail."""
    wanted = {"All": None, "Stdout": "stdout", "Stderr": "stderr"}[opts.stream]
    out = [ln for ln in lines if (wanted is None or ln[2] == wanted) and (opts.since is None or ln[0] >= opts.since)]
    if opts.tail_lines is not None:
        out = out[-opts.tail_lines:] if opts.tail_lines > 0 else []
    return out


def render(lines: Sequence[Line], timestamps: bool) -> bytes:
    if timestamps:
        return "".join(f"{format_rfc3339_nano(t)} {text}\n" for t, text, _ in lines).encode()
    return "".join(f"{text}\n" for _, text, _ in lines).encode()


def _status(pod: dict[str, Any], container: str) -> dict[str, Any]:
    statuses = list((pod.get("status") or {}).get("containerStatuses") or [])
    statuses += (pod.get("status") or {}).get("initContainerStatuses") or []
    return next((cs for cs in statuses if cs.get("name") == container), {})


def _running(pod: dict[str, Any], container: str) -> tuple[bool, int]:
    """(may the container still write, its restartCount).

    It has stopped when the pod's phase is terminal, or its state is
    terminated or a crash-loop wait. A pod without container statuses (a
    plain API server without the kubelet stand-in) counts as running.
    """
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False, 0
    cs = _status(pod, container)
    state = cs.get("state") or {}
    stopped = "terminated" in state or (state.get("waiting") or {}).get("reason") == "CrashLoopBackOff"
    return not stopped, int(cs.get("restartCount") or 0)


def body(opts: LogOptions, fetch: LogSource) -> bytes:
    """The response of a request without ``follow``."""
    data = render(select_lines(normalise(fetch(opts.previous)), opts), opts.timestamps)
    if opts.limit_bytes:
        data = data[:opts.limit_bytes]
    return data


def follow(opts: LogOptions, fetch: LogSource, pod_now: PodSource) -> Iterator[bytes | None]:
    """The chunks of a ``follow`` response: what is there, then every new line until the container stops.

    ``None`` chunks are heartbeats (the HTTP layer checks whether the client
    left). A restart ends the stream with the rest of the container that was
    followed (now the *previous* one), as the kubelet's follow of one
    container's log file ends when that container exits.
    """
    # Every line of the followed attempt (filters but no tail): new lines are appended to it.
    unfiltered = LogOptions(opts.container, stream=opts.stream, since=opts.since)
    seen = select_lines(normalise(fetch(opts.previous)), unfiltered)
    first = select_lines(seen, LogOptions(opts.container, tail_lines=opts.tail_lines))
    budget = opts.limit_bytes
    sent_bytes = 0

    def cut(data: bytes) -> tuple[bytes, bool]:
        nonlocal sent_bytes
        if budget is None:
            return data, False
        data = data[:budget - sent_bytes]
        sent_bytes += len(data)
        return data, sent_bytes >= budget

    data, done = cut(render(first, opts.timestamps))
    yield data or None
    if done or opts.previous:
        return
    sent = len(seen)
    try:
        _, restarts = _running(pod_now(), opts.container)
    except ApiError:
        return
    while True:
        try:
            running, now_restarts = _running(pod_now(), opts.container)
            restarted = now_restarts != restarts
            # After a restart the followed container is the previous one: send its rest.
            current = select_lines(normalise(fetch(restarted)), unfiltered)
        except ApiError:
            return
        except Exception:  # noqa: BLE001 - the kubelet has no log for it any more: the stream ends
            return
        if len(current) > sent:
            data, done = cut(render(current[sent:], opts.timestamps))
            sent = len(current)
            yield data
            if done:
                return
        if restarted or not running:
            return
        yield None
        time.sleep(FOLLOW_POLL_S)
