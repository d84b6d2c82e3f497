"""The pod behaviour script of the simulated kubelet, and its pure timeline.

A pod's behaviour in the simulator is described by the pod (template)
annotation `sim.xmc.dev/script`, e.g. ``pull=2s;run=30s;exit=0``.  This module
parses that text (`parse_script`) and turns it, together with the pod's
restart policy and the time the kubelet started it, into a deterministic
timeline of container states (`Timeline`).  The kubelet stand-in
(`simulators.cluster.controllers.kubelet`) asks the timeline "what does the main
container look like at simulated time t, which events have happened by then,
and when is the next change?" and writes the answer as pod status, so a
reconcile is a pure function of (script, start time, now) and running it
twice writes nothing new.

Grammar (documented in docs/architecture/simulator_controllers.md)::

    script   = [ step *( ";" step ) ]
    step     = key "=" value
    duration = number [ "ms" | "s" | "m" | "h" ]      ; plain number = seconds
    schedule = duration | "fail"                       ; scheduling delay / Unschedulable
    pull     = duration | "fail" [ ":" reason ]        ; reason ErrImagePull | ImagePullBackOff | InvalidImageName
    run      = duration | "forever"
    exit     = integer
    ready    = "after:" duration | "never" | "immediate"
    crash    = "every:" duration [ ",times:" integer ]
    heal     = "restarts:" integer                     ; behave as pull=1s;exit=0 from that JobSet restart attempt on
    log      = "every:" duration [ ":" template ]      ; progress line interval (default 5s) and its text
    print    = text                                    ; a stdout line when the container starts (repeatable)
    stderr   = text                                    ; a stderr line just before it exits (repeatable)
    oom                                                ; a bare flag: exit code 137 is reported as OOMKilled
    create   = "fail:" ( "CreateContainerConfigError" | "CreateContainerError" )   ; container never created
    start    = "fail"                                  ; RunContainerError: every start fails (exit 128, StartError)
    evict    = "after:" duration                       ; kubelet node-pressure eviction (phase Failed, reason Evicted)
    node     = "lost:" duration                        ; the node is lost: DisruptionTarget, deleted, stuck Terminating
    metrics  = "every:" duration ":" name "=" expr *( "," name "=" expr )
                                                       ; while running, POST points to XMC_METRICS_URL with the
                                                       ; container's XMC_METRICS_TOKEN (see metric_points)
    gpu      = "util:" expr [ ",mem:" expr ]          ; while running, each GPU's utilisation and memory used,
                                                       ; fractions 0-1 (clamped), read by the cluster's metrics
                                                       ; endpoints (simulators.cluster.controllers.usage)

A log template may name ``{n}`` (1-based line number of the attempt), ``{x}``
(a deterministic, decreasing "loss"), ``{t}`` (seconds since the attempt
started), ``{attempt}`` and ``{container}``; other text (braces included) is
kept as it is.  Every log line carries its stream (``stdout`` / ``stderr``):
the exit line of a non-zero exit and the ``stderr`` lines go to stderr.

A metrics expression is arithmetic (``+ - * / ** %``, parentheses) over ``t``
(seconds since the attempt started), ``n`` (the point number, 1-based: also
its step), the constants ``e`` and ``pi``, the functions ``exp``, ``log``,
``sqrt``, ``sin``, ``cos``, ``abs``, ``min`` and ``max``, and ``arg('name')``:
the number after ``--name=`` in the container's args (`container_args`),
read when the script is parsed (a missing or non-numeric argument is a
script error), e.g. ``metrics=every:1s:loss=exp(-t/30),acc=1-exp(-t/20)`` or,
for a sweep with an optimum, ``loss=(log(arg('lr'))+4.6)**2/10+exp(-t/20)``.
The ``gpu`` key takes the same expressions (``n`` is 0 there), e.g.
``gpu=util:max(0,min(0.9,(60-t)*10)),mem:0.4`` for a job that keeps its GPUs
busy for a minute and then idles with 40% of their memory in use.

Default when the annotation is absent: ``pull=1s;run=10s;exit=0``.
"""

from __future__ import annotations

import ast
import math
import re
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, cast

from simulators.cluster.clock import format_time

SCRIPT_ANNOTATION = "sim.xmc.dev/script"
#: A running pod's GPU load from now on, ``util:<expr>[,mem:<expr>]`` as the script's ``gpu`` key: set or
#: changed on the live pod (``kubectl annotate``), it replaces that key, as a job's load changes with what
#: it does (`simulators.cluster.controllers.kubelet.Kubelet.pod_usage`). ``t`` is still the attempt's.
GPU_ANNOTATION = "sim.xmc.dev/gpu"
DEFAULT_SCRIPT = "pull=1s;run=10s;exit=0"

PULL_FAIL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName")
CREATE_FAIL_REASONS = ("CreateContainerConfigError", "CreateContainerError")

_PLACEHOLDER = re.compile(r"\{(n|x|t|attempt|container)\}")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}

# Kubelet back-off: 10 s doubling, capped at 5 minutes (image pulls and crash loops).
BACKOFF_BASE = 10.0
BACKOFF_CAP = 300.0
# An image pull failure shows ErrImagePull for this long before ImagePullBackOff.
ERR_IMAGE_PULL_SHOWN = 1.0


class ScriptError(ValueError):
    """The annotation does not follow the grammar."""


@dataclass(frozen=True)
class Script:
    schedule_delay: float = 0.0
    schedule_fail: bool = False
    pull: float = 1.0
    pull_fail: str | None = None
    run: float | None = 10.0  # None = forever
    exit_code: int = 0
    ready_after: float | None = 0.0  # None = never ready
    crash_every: float | None = None
    crash_times: int | None = None  # None = every attempt crashes
    heal_restarts: int | None = None
    log_every: float = 5.0
    log_template: str | None = None
    prints: tuple[str, ...] = ()
    stderr_lines: tuple[str, ...] = ()
    oom: bool = False
    create_fail: str | None = None
    start_fail: bool = False
    evict_after: float | None = None
    node_lost_after: float | None = None
    metrics_every: float | None = None
    metrics: tuple[tuple[str, str], ...] = ()  # (metric name, expression)
    gpu_util: str | None = None  # expression over t: each GPU's utilisation (0-1) while running
    gpu_mem: str | None = None  # expression over t: the fraction of each GPU's memory in use

    def healed(self) -> Script:
        """The behaviour once the JobSet restart attempt reached `heal_restarts`."""
        return replace(self, pull_fail=None, exit_code=0, crash_every=None, crash_times=None,
                       schedule_fail=False, heal_restarts=None, create_fail=None, start_fail=False,
                       evict_after=None, node_lost_after=None)


def parse_duration(text: str) -> float:
    m = _DURATION.match(text)
    if not m:
        raise ScriptError(f"bad duration {text!r}")
    return float(m.group(1)) * float(_UNITS[m.group(2)])


def container_args(argv: Any) -> dict[str, str]:
    """``--name=value`` items of a container's args as ``{name: value}`` (what ``arg('name')`` reads)."""
    out: dict[str, str] = {}
    for item in argv or ():
        if isinstance(item, str) and item.startswith("--") and "=" in item:
            name, _, value = item[2:].partition("=")
            out.setdefault(name, value)
    return out


def parse_script(text: str | None, args: dict[str, str] | None = None) -> Script:
    """Parse the annotation value; None/empty gives the default behaviour.

    ``args`` are the container's ``--name=value`` arguments (`container_args`), which metrics
    expressions read with ``arg('name')``."""
    script = Script()
    if text is None or not text.strip():
        return script
    values: dict[str, Any] = {}
    for raw in text.split(";"):
        step = raw.strip()
        if not step:
            continue
        if step == "oom":
            values["oom"] = True
            continue
        if "=" not in step:
            raise ScriptError(f"step {step!r} is not key=value")
        key, value = (s.strip() for s in step.split("=", 1))
        if key == "schedule":
            if value == "fail":
                values["schedule_fail"] = True
            else:
                values["schedule_delay"] = parse_duration(value)
        elif key == "pull":
            if value.startswith("fail"):
                reason = value.split(":", 1)[1].strip() if ":" in value else "ImagePullBackOff"
                if reason not in PULL_FAIL_REASONS:
                    raise ScriptError(f"pull failure reason must be one of {PULL_FAIL_REASONS}")
                values["pull_fail"] = reason
            else:
                values["pull"] = parse_duration(value)
        elif key == "run":
            values["run"] = None if value in ("forever", "inf") else parse_duration(value)
        elif key == "exit":
            try:
                values["exit_code"] = int(value)
            except ValueError:
                raise ScriptError(f"exit code {value!r} is not an integer") from None
            if not 0 <= values["exit_code"] <= 255:
                raise ScriptError("exit code must be 0..255")
        elif key == "ready":
            if value == "never":
                values["ready_after"] = None
            elif value == "immediate":
                values["ready_after"] = 0.0
            elif value.startswith("after:"):
                values["ready_after"] = parse_duration(value[len("after:"):])
            else:
                raise ScriptError("ready must be after:<duration>, never or immediate")
        elif key == "crash":
            parts = [p.strip() for p in value.split(",")]
            if not parts[0].startswith("every:"):
                raise ScriptError("crash must be every:<duration>[,times:<n>]")
            values["crash_every"] = parse_duration(parts[0][len("every:"):])
            for p in parts[1:]:
                if p.startswith("times:"):
                    values["crash_times"] = int(p[len("times:"):])
                else:
                    raise ScriptError(f"unknown crash option {p!r}")
        elif key == "heal":
            if not value.startswith("restarts:"):
                raise ScriptError("heal must be restarts:<n>")
            values["heal_restarts"] = int(value[len("restarts:"):])
        elif key == "oom":
            values["oom"] = value in ("true", "1", "yes")
        elif key == "create":
            reason = value.split(":", 1)[1].strip() if value.startswith("fail:") else ""
            if reason not in CREATE_FAIL_REASONS:
                raise ScriptError(f"create must be fail:<reason> with a reason in {CREATE_FAIL_REASONS}")
            values["create_fail"] = reason
        elif key == "start":
            if value != "fail":
                raise ScriptError("start must be fail")
            values["start_fail"] = True
        elif key == "evict":
            if not value.startswith("after:"):
                raise ScriptError("evict must be after:<duration>")
            values["evict_after"] = parse_duration(value[len("after:"):])
        elif key == "node":
            if not value.startswith("lost:"):
                raise ScriptError("node must be lost:<duration>")
            values["node_lost_after"] = parse_duration(value[len("lost:"):])
        elif key == "log":
            if not value.startswith("every:"):
                raise ScriptError("log must be every:<duration>[:<template>]")
            every, _, template = value[len("every:"):].partition(":")
            values["log_every"] = max(0.001, parse_duration(every))
            if template.strip():
                values["log_template"] = template.strip()
        elif key == "metrics":
            if not value.startswith("every:"):
                raise ScriptError("metrics must be every:<duration>:<name>=<expr>[,<name>=<expr>...]")
            every, _, spec = value[len("every:"):].partition(":")
            values["metrics_every"] = max(0.001, parse_duration(every))
            values["metrics"] = parse_metrics(spec, args)
        elif key == "gpu":
            values.update(parse_gpu(value, args))
        elif key == "print":
            values["prints"] = (*values.get("prints", ()), value)
        elif key == "stderr":
            values["stderr_lines"] = (*values.get("stderr_lines", ()), value)
        else:
            raise ScriptError(f"unknown key {key!r}")
    return replace(script, **values)


_FUNCTIONS: dict[str, Any] = {"exp": math.exp, "log": math.log, "sqrt": math.sqrt, "sin": math.sin,
                              "cos": math.cos, "abs": abs, "min": min, "max": max}
_CONSTANTS = {"e": math.e, "pi": math.pi}
_OPERATORS: dict[type, Any] = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
                               ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b,
                               ast.Pow: lambda a, b: a ** b, ast.Mod: lambda a, b: a % b}
_METRIC_NAME = re.compile(r"[A-Za-z0-9_./-]{1,256}")


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses (``a=max(t,1),b=2``)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


class _Arguments(ast.NodeTransformer):
    """Replace every ``arg('name')`` by the container's value of ``--name=``, a number (else ScriptError)."""

    def __init__(self, args: dict[str, str]) -> None:
        self.args = args
        self.used = False

    def visit_Call(self, node: ast.Call) -> ast.AST:  # noqa: N802 - ast's name
        if not (isinstance(node.func, ast.Name) and node.func.id == "arg"):
            return self.generic_visit(node)
        if (len(node.args) != 1 or node.keywords or not isinstance(node.args[0], ast.Constant)
                or not isinstance(node.args[0].value, str)):
            raise ScriptError(f"metrics expression: {ast.unparse(node)!r}: write arg('<name>')")
        name = node.args[0].value
        if name not in self.args:
            raise ScriptError(f"metrics expression: arg({name!r}): the container has no --{name}=<number> argument")
        try:
            value = float(self.args[name])
        except ValueError:
            raise ScriptError(f"metrics expression: arg({name!r}): --{name}={self.args[name]!r} is not a number") from None
        if not math.isfinite(value):
            raise ScriptError(f"metrics expression: arg({name!r}): --{name}={self.args[name]!r} is not a finite number")
        self.used = True
        return ast.copy_location(ast.Constant(value), node)


def _check_expression(node: ast.AST) -> None:
    if isinstance(node, ast.Expression):
        _check_expression(node.body)
    elif isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        _check_expression(node.left)
        _check_expression(node.right)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        _check_expression(node.operand)
    elif isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        pass
    elif isinstance(node, ast.Name) and node.id in ("t", "n", *_CONSTANTS):
        pass
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
          and not node.keywords):
        for arg in node.args:
            _check_expression(arg)
    else:
        raise ScriptError(f"metrics expression: {ast.unparse(node)!r} is not allowed")


def _evaluate(node: ast.AST, t: float, n: int) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, t, n)
    if isinstance(node, ast.BinOp):
        return float(_OPERATORS[type(node.op)](_evaluate(node.left, t, n), _evaluate(node.right, t, n)))
    if isinstance(node, ast.UnaryOp):
        value = _evaluate(node.operand, t, n)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Constant):
        return float(cast(float, node.value))  # checked: an int or a float
    if isinstance(node, ast.Name):
        return float(t if node.id == "t" else n if node.id == "n" else _CONSTANTS[node.id])
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    return float(_FUNCTIONS[node.func.id](*(_evaluate(a, t, n) for a in node.args)))


def checked_expression(expr: str, args: dict[str, str] | None = None, *, key: str = "metrics") -> str:
    """A metrics expression, checked against the grammar, with every ``arg('name')`` replaced by the
    value of the container's ``--name=`` (``args``); ScriptError (naming ``key``) otherwise."""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        raise ScriptError(f"{key}: {expr.strip()!r} is not an expression") from None
    arguments = _Arguments(args or {})
    tree = ast.fix_missing_locations(arguments.visit(tree))
    _check_expression(tree)
    return ast.unparse(tree) if arguments.used else expr.strip()


def parse_metrics(spec: str, args: dict[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """``loss=exp(-t/30),acc=1-exp(-t/20)`` -> ((name, expression), ...), each expression checked, with
    every ``arg('name')`` replaced by the value of the container's ``--name=`` (``args``)."""
    out: list[tuple[str, str]] = []
    for part in _split_top(spec):
        name, eq, expr = part.partition("=")
        if not eq or not _METRIC_NAME.fullmatch(name.strip()):
            raise ScriptError(f"metrics: {part!r} is not <name>=<expression>")
        out.append((name.strip(), checked_expression(expr, args)))
    if not out:
        raise ScriptError("metrics needs at least one <name>=<expression>")
    return tuple(out)


def parse_gpu(spec: str, args: dict[str, str] | None = None) -> dict[str, str]:
    """``util:<expr>[,mem:<expr>]`` -> the Script fields ``gpu_util`` / ``gpu_mem`` (each expression checked)."""
    out: dict[str, str] = {}
    for part in _split_top(spec):
        what, colon, expr = part.partition(":")
        field_name = {"util": "gpu_util", "mem": "gpu_mem"}.get(what.strip())
        if not colon or field_name is None or field_name in out:
            raise ScriptError(f"gpu: {part!r} is not util:<expression> or mem:<expression> (each at most once)")
        out[field_name] = checked_expression(expr, args, key="gpu")
    if "gpu_util" not in out:
        raise ScriptError("gpu must be util:<expression>[,mem:<expression>]")
    return out


def metric_value(expression: str, t: float, n: int) -> float | None:
    """The value of a (checked) metrics expression at ``t`` and ``n``; None when it is undefined there."""
    try:
        value = _evaluate(ast.parse(expression, mode="eval"), t, n)
    except (ArithmeticError, ValueError):
        return None
    return value if math.isfinite(value) else None


def metric_points(script: Script, attempt_start: float, after_n: int, now: float) -> list[tuple[int, float, dict[str, float]]]:
    """(n, simulated time, {metric: value}) of the points due after point ``after_n`` up to ``now``."""
    every = script.metrics_every
    if every is None or not script.metrics:
        return []
    out: list[tuple[int, float, dict[str, float]]] = []
    n = after_n + 1
    while attempt_start + n * every <= now and len(out) < 10_000:
        elapsed = n * every
        values = {name: v for name, expr in script.metrics if (v := metric_value(expr, elapsed, n)) is not None}
        out.append((n, attempt_start + elapsed, values))
        n += 1
    return out


def render_template(template: str, *, n: int, elapsed: float, attempt: int, container: str) -> str:
    """One progress line from a `log=every:<d>:<template>` template (unknown braces stay)."""
    values = {"n": str(n), "x": f"{2.0 * math.exp(-0.05 * n) + 0.1:.4f}", "t": f"{elapsed:g}",
              "attempt": str(attempt), "container": container}
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


#: One container log line: (simulated time, attempt, text, stream "stdout" | "stderr").
LogLine = tuple[float, int, str, str]


def backoff(n: int) -> float:
    """Kubelet back-off before retry number `n` (0-based)."""
    return float(min(BACKOFF_CAP, BACKOFF_BASE * (2.0 ** min(n, 16))))


# --- timeline -------------------------------------------------------------------


@dataclass
class Happening:
    """One kubelet event at simulated time `at` (type Normal/Warning)."""

    at: float
    etype: str
    reason: str
    message: str


@dataclass
class Segment:
    """The main container's state from `start` until the next segment."""

    start: float
    phase: str  # Pending | Running | Succeeded | Failed
    state: dict[str, Any]  # {"waiting": {...}} | {"running": {...}} | {"terminated": {...}}
    last_state: dict[str, Any]
    restart_count: int
    started: bool
    ready: bool
    attempt_start: float | None  # when the current attempt's container started
    happenings: list[Happening] = field(default_factory=list)
    logs: list[LogLine] = field(default_factory=list)
    final: bool = False


@dataclass
class View:
    """What the timeline says at one instant."""

    segment: Segment
    ready_since: float | None  # when the container last became ready (None = not ready)
    unready_since: float  # when it last stopped being ready (or t0)
    next_change: float | None
    happenings: list[Happening]
    logs: list[LogLine]


def _t(seconds: float) -> str:
    return format_time(seconds)


class Timeline:
    """Deterministic container timeline for one pod (extended lazily)."""

    def __init__(self, script: Script, restart_policy: str, t0: float, image: str, container: str, pod_ref: str) -> None:
        self.script = script
        self.restart_policy = restart_policy or "Always"
        self.t0 = t0
        self.image = image
        self.container = container
        self.pod_ref = pod_ref  # "<name>_<ns>(<uid>)" as in kubelet messages
        self._gen = self._segments()
        self._segs: list[Segment] = []
        self._done = False
        # The kubelet's worker and the API server's log reads share a timeline.
        self._lock = threading.Lock()

    def _ensure(self, until: float) -> None:
        while not self._done and (not self._segs or self._segs[-1].start <= until):
            try:
                self._segs.append(next(self._gen))
            except StopIteration:
                self._done = True

    def view(self, now: float) -> View:
        with self._lock:
            return self._view(now)

    def _view(self, now: float) -> View:
        self._ensure(now)
        idx = 0
        for i, seg in enumerate(self._segs):
            if seg.start <= now:
                idx = i
            else:
                break
        cur = self._segs[idx]
        nxt = self._segs[idx + 1].start if idx + 1 < len(self._segs) else None
        ready_since: float | None = None
        unready_since = self.t0
        prev_ready = False
        for seg in self._segs[: idx + 1]:
            if seg.ready and not prev_ready:
                ready_since = seg.start
            elif not seg.ready and prev_ready:
                unready_since = seg.start
                ready_since = None
            prev_ready = seg.ready
        happenings = [h for seg in self._segs[: idx + 1] for h in seg.happenings if h.at <= now]
        logs = [line for seg in self._segs[: idx + 1] for line in seg.logs if line[0] <= now]
        # Progress lines of the running attempt are produced lazily up to now.
        if "running" in cur.state and cur.attempt_start is not None:
            logs.extend(self._progress(cur.attempt_start, cur.attempt_start, now, cur.restart_count))
        return View(cur, ready_since, unready_since, nxt, happenings, logs)

    def _progress(self, attempt_start: float, from_t: float, to_t: float, attempt: int) -> list[LogLine]:
        every = self.script.log_every
        template = self.script.log_template
        out: list[LogLine] = []
        k = int((from_t - attempt_start) // every) + 1
        while attempt_start + k * every <= to_t and len(out) < 100_000:
            t = attempt_start + k * every
            if template is None:
                text = f"[sim] {self.container}: working, {k * every:g}s elapsed"
            else:
                text = render_template(template, n=k, elapsed=k * every, attempt=attempt, container=self.container)
            out.append((t, attempt, text, "stdout"))
            k += 1
        return out

    def _segments(self) -> Iterator[Segment]:
        s = self.script
        img, c = self.image, self.container
        t = self.t0
        creating = {"waiting": {"reason": "ContainerCreating"}}
        first = Segment(t, "Pending", creating, {}, 0, False, False, None,
                        [Happening(t, "Normal", "Pulling", f'Pulling image "{img}"')])
        if s.pull_fail == "InvalidImageName":
            first.happenings = [Happening(t, "Warning", "InspectFailed", f'Failed to apply default image tag "{img}": couldn\'t parse image name "{img}": invalid reference format'),
                                Happening(t, "Warning", "Failed", "Error: InvalidImageName")]
            first.state = {"waiting": {"reason": "InvalidImageName", "message": f'Failed to apply default image tag "{img}": couldn\'t parse image name "{img}": invalid reference format'}}
            yield first
            return
        yield first
        if s.pull_fail:
            n = 0
            while True:
                err_at = t + max(s.pull, 0.001)
                msg = f'Failed to pull image "{img}": rpc error: code = NotFound desc = failed to pull and unpack image "{img}": not found'
                yield Segment(err_at, "Pending", {"waiting": {"reason": "ErrImagePull", "message": msg}}, {}, 0, False, False, None,
                              [Happening(err_at, "Warning", "Failed", msg), Happening(err_at, "Warning", "Failed", "Error: ErrImagePull")])
                bo_at = err_at + ERR_IMAGE_PULL_SHOWN
                yield Segment(bo_at, "Pending", {"waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{img}"'}}, {}, 0, False, False, None,
                              [Happening(bo_at, "Normal", "BackOff", f'Back-off pulling image "{img}"'),
                               Happening(bo_at, "Warning", "Failed", "Error: ImagePullBackOff")])
                t = bo_at + backoff(n)
                n += 1
                yield Segment(t, "Pending", {"waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{img}"'}}, {}, 0, False, False, None,
                              [Happening(t, "Normal", "Pulling", f'Pulling image "{img}"')])
        # Pulled; attempts follow.
        start = t + s.pull
        pull_msg = f'Successfully pulled image "{img}" in {s.pull:g}s ({s.pull:g}s including waiting). Image size: 4265484 bytes.'
        if s.create_fail:
            # The kubelet cannot create the container (kubelet pkg/kubelet/kuberuntime: a missing
            # Secret/ConfigMap key gives CreateContainerConfigError); it retries with back-off.
            msg = {"CreateContainerConfigError": 'secret "sim-missing-secret" not found',
                   "CreateContainerError": f'failed to generate container "{c}" spec: failed to apply OCI options: no such file or directory'}[s.create_fail]
            n = 0
            t = start
            while True:
                happenings = [Happening(t, "Normal", "Pulled", pull_msg if n == 0 else f'Container image "{img}" already present on machine'),
                              Happening(t, "Warning", "Failed", f"Error: {msg}")]
                yield Segment(t, "Pending", {"waiting": {"reason": s.create_fail, "message": msg}}, {}, 0, False, False, None, happenings)
                t += backoff(n)
                n += 1
        attempt = 0
        last_state: dict[str, Any] = {}
        if s.start_fail:
            # RunContainerError: the container is created but its start fails (exit 128,
            # StartError); the restart policy applies as to a crash.
            msg = (f'failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: '
                   f'unable to start container process: exec: "sim-missing-binary": executable file not found in $PATH: unknown')
            while True:
                terminated = {"terminated": {"exitCode": 128, "reason": "StartError", "message": msg, "startedAt": _t(0),
                                             "finishedAt": _t(start), "containerID": f"containerd://sim-{attempt}"}}
                happenings = [Happening(start, "Normal", "Pulled", pull_msg if attempt == 0 else f'Container image "{img}" already present on machine'),
                              Happening(start, "Normal", "Created", f"Created container: {c}"),
                              Happening(start, "Warning", "Failed", f"Error: {msg}")]
                if self.restart_policy == "Never":
                    yield Segment(start, "Failed", terminated, last_state, attempt, False, False, None, happenings, final=True)
                    return
                yield Segment(start, "Pending" if attempt == 0 else "Running",
                              {"waiting": {"reason": "RunContainerError", "message": msg}}, terminated, attempt + 1,
                              False, False, None, happenings)
                wait = backoff(attempt)
                last_state = terminated
                attempt += 1
                shown = start + ERR_IMAGE_PULL_SHOWN
                yield Segment(shown, "Pending" if attempt == 1 else "Running",
                              {"waiting": {"reason": "CrashLoopBackOff",
                                           "message": f"back-off {wait:g}s restarting failed container={c} pod={self.pod_ref.split('(')[0]}"}},
                              last_state, attempt, False, False, None,
                              [Happening(shown, "Warning", "BackOff", f"Back-off restarting failed container {c} in pod {self.pod_ref}")])
                start = shown + wait
        while True:
            crashing = s.crash_every is not None and (s.crash_times is None or attempt < s.crash_times)
            duration = s.crash_every if crashing else s.run
            code = (s.exit_code or 1) if crashing else s.exit_code
            pulled = Happening(start, "Normal", "Pulled", pull_msg if attempt == 0 else f'Container image "{img}" already present on machine')
            happenings = [pulled, Happening(start, "Normal", "Created", f"Created container: {c}"),
                          Happening(start, "Normal", "Started", f"Started container {c}")]
            running = {"running": {"startedAt": _t(start)}}
            logs: list[LogLine] = [(start, attempt, f"[sim] {c}: started image={img} attempt={attempt}", "stdout")]
            logs += [(start, attempt, text, "stdout") for text in s.prints]
            ready_at = None if s.ready_after is None else start + s.ready_after
            end = None if duration is None else start + duration
            if ready_at is not None and (end is None or ready_at < end) and ready_at <= start:
                yield Segment(start, "Running", running, last_state, attempt, True, True, start, happenings, logs)
            else:
                yield Segment(start, "Running", running, last_state, attempt, True, False, start, happenings, logs)
                if ready_at is not None and (end is None or ready_at < end):
                    yield Segment(ready_at, "Running", running, last_state, attempt, True, True, start)
            if end is None:
                return
            # OOMKilled for exit 137 when the script says the kernel's OOM killer did it.
            reason = "Completed" if code == 0 else ("OOMKilled" if code == 137 and s.oom else "Error")
            terminated = {"terminated": {"exitCode": code, "reason": reason, "startedAt": _t(start), "finishedAt": _t(end),
                                         "containerID": f"containerd://sim-{attempt}"}}
            exit_log = self._progress(start, start, end, attempt)
            exit_log += [(end, attempt, text, "stderr") for text in s.stderr_lines]
            exit_log.append((end, attempt, f"[sim] {c}: exiting with code {code}", "stdout" if code == 0 else "stderr"))
            restarts = self.restart_policy == "Always" or (self.restart_policy == "OnFailure" and code != 0)
            if not restarts:
                phase = "Succeeded" if code == 0 else "Failed"
                yield Segment(end, phase, terminated, last_state, attempt, False, False, None, [], exit_log, final=True)
                return
            last_state = terminated
            if attempt == 0:
                # The kubelet restarts a container the first time at once; the back-off
                # (10 s doubling, cap 5 min) starts with the second exit.  restartCount
                # rises when the new container starts (kubernetes pkg/kubelet/kuberuntime).
                yield Segment(end, "Running", terminated, {}, attempt, False, False, None, [], exit_log)
                attempt += 1
                start = end
                continue
            wait = backoff(attempt - 1)
            crash = {"waiting": {"reason": "CrashLoopBackOff",
                                 "message": f"back-off {wait:g}s restarting failed container={c} pod={self.pod_ref.split('(')[0]}"}}
            yield Segment(end, "Running", crash, last_state, attempt, False, False, None,
                          [Happening(end, "Warning", "BackOff", f"Back-off restarting failed container {c} in pod {self.pod_ref}")],
                          exit_log)
            attempt += 1
            start = end + wait
