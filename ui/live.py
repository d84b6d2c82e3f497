"""Live updates of the researcher's pages: committed transitions over Redis, fanned out in memory.

Two halves, in two kinds of process:

* **Publisher** (any process that commits state changes; today the
  reconciler, through ``workunits.hooks.committed_hooks``, registered in
  ``ui.apps.UiConfig.ready``): :func:`publish` appends every committed
  transition to a capped Redis stream (:data:`STREAM`, the replay log) and
  publishes it, with the stream id the append got, on :func:`channel` -- both
  in one Lua script, so the id order on the channel is the log's order. It
  runs after the writer's commit and never raises (a page that misses an
  event is corrected by the next one or by its own reload).
* **Hub** (the web process, on its event loop): one pub/sub subscription per
  process (:class:`Hub`), whatever the number of open pages. Each open stream
  (``ui.events``) is a :class:`Subscriber` with a bounded queue and a
  filter (its experiment and optional work unit, or a set of experiments);
  the hub copies each message into the queues that want it. A queue that
  overflows is marked stale and its stream tells the page to reload.

Metric points (``metrics.hooks.written_hooks``, registered in
``ui.apps.UiConfig.ready``): :func:`publish_metrics` tells the open charts of
a work unit that it has new points -- after the write path's commit, on the
same channel (:func:`channel`), coalesced to one message per work unit per
:data:`METRICS_WINDOW_S` (a Redis ``SET NX PX`` gate shared by every
process, and a memo in each process so that most batches do not even ask
Redis). These messages are not appended to the replay log: they carry no
state, only "read the chart again", so a page that was away does not need
them replayed; it reads its charts again when its stream (re)opens (the
``hello`` event). They would otherwise crowd state changes out of the capped
log. Only streams that ask for them (``?metrics=1``: the work unit and
dashboard pages) receive them.

Study changes (``studies.hooks.changed_hooks``, registered in
``ui.apps.UiConfig.ready``): :func:`publish_study` logs and publishes "study
``sid`` of experiment ``xid`` changed" after the controller's (or the stop's)
commit -- a trial started, completed, failed or was pruned, the study ended --
in the replay log like a transition (a study page that reconnects must read
again what it missed), on the same channel. The experiment's streams carry it
(``study-<sid>``); work unit and list streams do not want it.

Resuming: each SSE event carries the stream id as its ``id``; a reconnecting
page sends ``Last-Event-ID`` (or the ``since`` the page was rendered with)
and :func:`replay` reads what it missed from the log. When the log no
longer reaches back that far (trimmed) the page is told to reload.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings

from metrics import services

log = logging.getLogger(__name__)

CHANNEL = "xmc:ui:changes:v1"
STREAM = "xmc:ui:changes-log:v1"
#: Entries the replay log keeps (approximately; Redis trims in whole nodes).
STREAM_MAX = 20_000
#: Events one open stream may have waiting before it is told to reload instead.
QUEUE_MAX = 1_000
#: At most this many events are replayed; further back, the page reloads.
REPLAY_MAX = 500

#: A work unit's metrics messages are at most one per this many seconds (the chart script reads
#: once more this long after the last one, so points the gate held back are shown too).
METRICS_WINDOW_S = 1.0
#: After a Redis failure the metrics publisher stays quiet this long (the write path never waits on it).
METRICS_BACKOFF_S = 5.0
#: The id a message on the channel has when it is not in the log (metrics: nothing to replay).
EPHEMERAL = "-"

# KEYS: stream, channel. ARGV: maxlen, then one JSON event per transition.
# XADD then PUBLISH "<id> <json>" for each, atomically and in log order.
_PUBLISH_LUA = """
local ids = {}
for i = 2, #ARGV do
  local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'd', ARGV[i])
  redis.call('PUBLISH', KEYS[2], id .. ' ' .. ARGV[i])
  ids[#ids + 1] = id
end
return ids
"""


def channel() -> str:
    """:data:`CHANNEL` for this system's Redis database.

    Pub/sub ignores the database number (a ``PUBLISH`` reaches subscribers of
    every database on the server), unlike the replay log's key: the number is
    in the channel's name, so two systems (or two test runs) sharing one Redis
    server never see each other's changes.
    """
    db = urllib.parse.urlsplit(str(settings.REDIS_URL)).path.strip("/") or "0"
    return f"{CHANNEL}:{db}"


# KEYS: gate, channel. ARGV: window in ms, the JSON event. At most one message per window per gate:
# -1 when it published, else the milliseconds until the gate opens again.
_PUBLISH_METRICS_LUA = """
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  redis.call('PUBLISH', KEYS[2], '- ' .. ARGV[2])
  return -1
end
return redis.call('PTTL', KEYS[1])
"""


def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1.0, socket_connect_timeout=1.0)


def _event(transition: Any) -> str:
    return json.dumps({"xid": transition.xid, "wid": transition.wid, "eid": transition.eid,
                       "old": str(transition.old_state), "new": str(transition.new_state)},
                      separators=(",", ":"))


def study_event(xid: int, study_id: int) -> str:
    return json.dumps({"kind": "study", "xid": xid, "study": study_id}, separators=(",", ":"))


def _append(events: Sequence[str]) -> Any:
    """XADD each JSON event to the log and PUBLISH it with its id, in log order; the ids."""
    return _client().eval(_PUBLISH_LUA, 2, STREAM, channel(), str(STREAM_MAX), *events)


def publish_study(xid: int, study_id: int) -> None:
    """Log and publish a committed change of study ``study_id``'s rows (a trial's state or value, the study's).

    Registered into ``studies.hooks.changed_hooks``: called after the controller's commit. A Redis
    failure is logged and swallowed (the page reads its live part again on the next change).
    """
    try:
        ids = _append([study_event(xid, study_id)])
    except redis.RedisError:
        log.warning("ui.publish_study_failed", extra={"xid": xid, "study": study_id}, exc_info=True)
        return
    log.debug("ui.published", extra={"ids": ids})


def publish(transitions: Sequence[Any]) -> None:
    """Log and publish committed ``transitions`` (``workunits.hooks.Transition``).

    Registered into ``workunits.hooks.committed_hooks``: called after the
    writer's commit. A Redis failure is logged and swallowed.
    """
    if not transitions:
        return
    try:
        ids = _append([_event(t) for t in transitions])
    except redis.RedisError:
        log.warning("ui.publish_failed", extra={"count": len(transitions)}, exc_info=True)
        return
    log.debug("ui.published", extra={"ids": ids})


class _MetricsGate:
    """This process's memo of the metrics publisher: when each execution last published, its key, the backoff."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: dict[int, float] = {}  # execution pk -> monotonic time of its last publish attempt
        self.keys: dict[int, tuple[int, int, int]] = {}  # execution pk -> (xid, wid, eid): never changes
        self.quiet_until = 0.0
        self.client: redis.Redis | None = None

    def due(self, execution: int, now: float) -> bool:
        with self.lock:
            if now < self.quiet_until or now - self.sent.get(execution, -1e9) < METRICS_WINDOW_S:
                return False
            if len(self.sent) > 10_000:
                self.sent = {pk: at for pk, at in self.sent.items() if now - at < METRICS_WINDOW_S}
            self.sent[execution] = now  # the attempt's start: the window ends no later than Redis's
            return True

    def held_back(self, execution: int, now: float, remaining_s: float) -> None:
        """Another process published: this one may try again when the shared gate opens, not a window later."""
        with self.lock:
            self.sent[execution] = now - METRICS_WINDOW_S + max(0.0, remaining_s)

    def redis(self) -> redis.Redis:
        if self.client is None:  # one pool per process, reused (redis-py resets it after a fork)
            self.client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5)
        return self.client


_gate = _MetricsGate()


def metrics_gate(xid: int, wid: int) -> str:
    """The Redis key of work unit ``wid``'s coalescing gate: while it exists, its writes send no message."""
    return f"xmc:ui:metrics-gate:v1:{xid}:{wid}"


def metrics_event(xid: int, wid: int, eid: int) -> str:
    return json.dumps({"kind": "metrics", "xid": xid, "wid": wid, "eid": eid}, separators=(",", ":"))


def publish_metrics(written: Mapping[int, int]) -> None:
    """Tell the open charts of the work units of the executions in ``written`` that they have new points.

    Registered into ``metrics.hooks.written_hooks``: called after the write
    path's commit, once per write (the system metrics' collector writes for a
    thousand executions at once). Coalesced: at most one message per work
    unit per :data:`METRICS_WINDOW_S`, across processes. One query for the
    keys this process has not seen yet and one Redis round trip (a pipeline
    of the gate's script) for the whole write. Never raises and never waits
    long: a Redis failure is logged and silences the publisher for
    :data:`METRICS_BACKOFF_S`.
    """
    now = time.monotonic()
    due = [execution for execution in written if _gate.due(execution, now)]
    if not due:
        return
    unknown = [execution for execution in due if execution not in _gate.keys]
    if unknown:
        if len(_gate.keys) + len(unknown) > 10_000:
            _gate.keys.clear()
        _gate.keys.update({pk: (k.xid, k.wid, k.eid) for pk, k in services.execution_keys(unknown).items()})
    keyed = [(execution, _gate.keys[execution]) for execution in due if execution in _gate.keys]
    if not keyed:
        return
    window_ms, on = str(int(METRICS_WINDOW_S * 1000)), channel()
    try:
        pipe = _gate.redis().pipeline(transaction=False)
        for _, (xid, wid, eid) in keyed:
            pipe.eval(_PUBLISH_METRICS_LUA, 2, metrics_gate(xid, wid), on, window_ms,
                      metrics_event(xid, wid, eid))
        answers: list[Any] = pipe.execute()
    except redis.RedisError:
        _gate.quiet_until = now + METRICS_BACKOFF_S
        log.warning("ui.publish_metrics_failed", extra={"executions": len(keyed)}, exc_info=True)
        return
    for (execution, _), answer in zip(keyed, answers, strict=True):
        if int(answer) >= 0:
            # Every write the shared gate holds back committed before it opens, less than a window
            # after the message that closed it: the chart's read a window after that message sees them.
            _gate.held_back(execution, now, int(answer) / 1000)


def top_id() -> str:
    """The newest id in the log ("0-0" when empty or Redis is down): a page renders with it as ``since``."""
    try:
        newest: Any = _client().xrevrange(STREAM, count=1)
    except redis.RedisError:
        return "0-0"
    return newest[0][0].decode() if newest else "0-0"


def stream_key(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def valid_id(value: str | None) -> str | None:
    """``value`` if it is a Redis stream id (``<ms>-<seq>``), else None."""
    if not value:
        return None
    ms, sep, seq = value.strip().partition("-")
    if (ms.isascii() and ms.isdigit()) and len(ms) <= 20 and (not sep or ((seq.isascii() and seq.isdigit()) and len(seq) <= 20)):
        return value.strip()
    return None


@dataclass
class Event:
    id: str  # its id in the log; "" for a message that is not in it (metrics)
    xid: int
    wid: int
    eid: int
    old: str
    new: str
    # "state": a committed transition; "metrics": the work unit has new points; "study": study `study`
    # of the experiment changed (its wid and eid are 0: no work unit's stream wants it)
    kind: str = "state"
    study: int = 0

    @classmethod
    def parse(cls, stream_id: str, data: str | bytes) -> Event:
        body = json.loads(data)
        if body.get("kind") == "metrics":
            return cls("", int(body["xid"]), int(body["wid"]), int(body["eid"]), "", "", "metrics")
        if body.get("kind") == "study":
            return cls(stream_id, int(body["xid"]), 0, 0, "", "", "study", int(body["study"]))
        return cls(stream_id, int(body["xid"]), int(body["wid"]), int(body["eid"]), body["old"], body["new"])

    @property
    def ephemeral(self) -> bool:
        return self.kind == "metrics"

    def json(self) -> str:
        if self.kind == "metrics":
            return metrics_event(self.xid, self.wid, self.eid)
        if self.kind == "study":
            return study_event(self.xid, self.study)
        return json.dumps({"xid": self.xid, "wid": self.wid, "eid": self.eid, "old": self.old, "new": self.new},
                          separators=(",", ":"))


@dataclass
class Scope:
    """What an open stream shows: these experiments, and within a single one maybe one work unit."""

    xids: frozenset[int]
    wid: int | None = None
    metrics: bool = False  # also the "new points" messages (the pages that draw charts)

    def wants(self, event: Event) -> bool:
        if (event.ephemeral and not self.metrics) or (event.kind == "study" and self.wid is not None):
            return False
        return event.xid in self.xids and (self.wid is None or event.wid == self.wid)


@dataclass(frozen=True)
class Replay:
    events: list[Event]
    reload: bool  # the log does not reach back to the page's id: it must reload


def replay(since: str, scope: Scope) -> Replay:
    """The events after ``since`` that ``scope`` wants, from the log (sync: one or two Redis reads)."""
    client = _client()
    rows: Any
    try:
        oldest: Any = client.xrange(STREAM, count=1)
        if since != "0-0" and oldest and stream_key(oldest[0][0].decode()) > stream_key(since):
            # `since` itself was trimmed from the log: what followed it may be too.
            return Replay([], reload=True)
        rows = client.xrange(STREAM, min=f"({since}", max="+", count=REPLAY_MAX * 20 + 1)
    except redis.RedisError:
        return Replay([], reload=True)
    if len(rows) > REPLAY_MAX * 20:
        return Replay([], reload=True)
    events = [Event.parse(row_id.decode(), fields[b"d"]) for row_id, fields in rows]
    wanted = [e for e in events if scope.wants(e)]
    if len(wanted) > REPLAY_MAX:
        return Replay([], reload=True)
    return Replay(wanted, reload=False)


@dataclass(eq=False)
class Subscriber:
    """One open stream's inbox (hash by identity: the hub holds a set of them)."""

    scope: Scope
    queue: asyncio.Queue[Event] = field(default_factory=lambda: asyncio.Queue(QUEUE_MAX))
    stale: bool = False  # its queue overflowed: the page must reload

    def offer(self, event: Event) -> None:
        if self.stale or not self.scope.wants(event):
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.stale = True  # nothing more is queued; the stream sends "reload"


class Hub:
    """The process's one subscription to :data:`CHANNEL`, copied into every open stream's queue."""

    def __init__(self) -> None:
        self.subscribers: set[Subscriber] = set()
        self.connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.received = 0

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="ui.hub")

    def subscribe(self, scope: Scope) -> Subscriber:
        self.start()
        subscriber = Subscriber(scope)
        self.subscribers.add(subscriber)
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self.subscribers.discard(subscriber)

    def dispatch(self, message: bytes | str) -> None:
        text = message.decode() if isinstance(message, bytes) else message
        stream_id, _, data = text.partition(" ")
        try:
            event = Event.parse(stream_id, data)
        except (ValueError, KeyError):
            log.warning("ui.bad_message", extra={"message": text[:200]})
            return
        self.received += 1
        for subscriber in list(self.subscribers):
            subscriber.offer(event)

    async def _run(self) -> None:
        while True:
            client = aioredis.Redis.from_url(settings.REDIS_URL)
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(channel())
                    while True:  # Redis confirmed: from here on every message published reaches us
                        confirmed = await pubsub.get_message(timeout=5.0)
                        if confirmed is not None and confirmed.get("type") == "subscribe":
                            break
                    self.connected.set()
                    while True:
                        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=30.0)
                        if message is not None and message.get("type") == "message":
                            self.dispatch(message["data"])
            except asyncio.CancelledError:
                raise
            except Exception:
                # Events published while we were away are in the log: each open stream's
                # page reloads its fragment on the next event it receives.
                self.connected.clear()
                for subscriber in list(self.subscribers):
                    subscriber.stale = True
                log.warning("ui.hub_disconnected", exc_info=True)
                await asyncio.sleep(1.0)
            finally:
                await client.aclose()


_hubs: dict[int, Hub] = {}


def hub() -> Hub:
    """This event loop's hub (one per process under uvicorn: one loop per worker)."""
    loop = asyncio.get_running_loop()
    found = _hubs.get(id(loop))
    if found is None:
        found = _hubs[id(loop)] = Hub()
    return found


def scope_of(xids: Iterable[int], wid: int | None = None, metrics: bool = False) -> Scope:
    return Scope(frozenset(xids), wid, metrics)
