"""The real XManager client (``xmanager==0.8.5.post1``) against a live XMC.

The client runs as it would on a researcher's machine: ``python`` scripts (or
the ``xmanager`` command) in the cached virtualenv of `client_env`, as
subprocesses, with the environment of client contract 1.5 --
``XMANAGER_ENDPOINT=http://127.0.0.1:<grpc port>``, ``XMC_AUTH_TOKEN`` (a
server-issued JWT), ``XMANAGER_UI_URL`` -- a private HOME and XDG dirs, a cwd
that is not a git repository, and no Google credentials (the metadata server
is pointed at a closed loopback port so nothing ever leaves the machine).

The server is the session gRPC server of ``tests/api/grpc_server`` (in-process,
real interceptors and handlers) plus pytest-django's ``live_server`` for the
login pages. Tests are ``django_db(transaction=True)``: what the client wrote
is committed, and the tests read it back through the ORM.

A script reports to the test by printing one line ``RESULT: <json>``.
"""
from __future__ import annotations

import json
import subprocess
import textwrap
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.api.grpc_server.conftest import (  # noqa: F401 - shared fixtures
    _server_connections_closed_after_each_test,
    grpc_server,
    grpc_target,
)
from tests.system.real_client.client_env import client_environment, ensure_client_venv, python_of
from xmc.api import registry
from xmc.auth.tokens import issue_token

RESULT_PREFIX = "RESULT: "
ALICE = "alice@example.com"

#: Prepended to every script: ``report(value)`` prints the one result line.
PRELUDE = textwrap.dedent(
    """
    import json as _json

    def report(value):
        print("RESULT: " + _json.dumps(value, sort_keys=True, default=str), flush=True)
    """
)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Build the client's virtualenv right after collection, if these tests will run.

    Here and not in a fixture: a first build (minutes on a cold pip cache)
    must not count against the first test's timeout. The progress lines go
    straight to the terminal.
    """
    here = Path(__file__).parent
    if not any(Path(str(item.fspath)).is_relative_to(here) for item in items):
        return
    reporter = config.pluginmanager.getplugin("terminalreporter")

    def progress(line: str) -> None:
        if reporter is not None:
            reporter.write_line(line)
        else:
            print(line, flush=True)

    ensure_client_venv(progress)


@pytest.fixture(scope="session")
def client_venv() -> Path:
    """The client's virtualenv (already built after collection; checked again here)."""
    return ensure_client_venv()


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    @property
    def result(self) -> Any:
        lines = [line for line in self.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
        assert lines, f"no RESULT line; exit {self.returncode}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        return json.loads(lines[-1][len(RESULT_PREFIX) :])

    def ok(self) -> Run:
        assert self.returncode == 0, f"exit {self.returncode}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        return self


class Client:
    """Runs code in the client's environment, as a user whose token it holds."""

    def __init__(self, venv: Path, workdir: Path, grpc_target: str, ui_url: str, token: str | None) -> None:
        self.venv = venv
        self.workdir = workdir
        self.grpc_target = grpc_target
        self.ui_url = ui_url
        self.token = token
        self.home = workdir.parent / "home"

    def env(self, **overrides: str | None) -> dict[str, str]:
        env = client_environment(self.venv, self.home, self.grpc_target, self.token, self.ui_url)
        for key, value in overrides.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def write(self, name: str, *sources: str) -> Path:
        """A script in the work dir: the prelude, then each source, dedented on its own."""
        path = self.workdir / name
        path.write_text(PRELUDE + "\n".join(textwrap.dedent(source) for source in sources))
        return path

    def run(self, argv: list[str], *, timeout: float = 120, stdin: str | None = None, **env: str | None) -> Run:
        done = subprocess.run(
            argv,
            cwd=self.workdir,
            env=self.env(**env),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return Run(done.returncode, done.stdout, done.stderr)

    def python(self, *sources: str, timeout: float = 120, **env: str | None) -> Run:
        """Run ``sources`` (see `write`; ``report(value)`` available) with the client's Python."""
        script = self.write(f"script_{uuid.uuid4().hex[:8]}.py", *sources)
        return self.run([str(python_of(self.venv)), str(script)], timeout=timeout, **env)

    def xmanager(self, *args: str, timeout: float = 120, **env: str | None) -> Run:
        """The ``xmanager`` command of the client's environment."""
        return self.run([str(self.venv / "bin" / "xmanager"), *args], timeout=timeout, **env)


@pytest.fixture
def make_client(
    client_venv: Path, grpc_target: str, live_server: Any, tmp_path: Path  # noqa: F811
) -> Callable[..., Client]:
    """``make_client(email)``: a client holding a fresh token for ``email`` (None: no token)."""

    def make(email: str | None = ALICE, *, token: str | None = None) -> Client:
        workdir = tmp_path / f"work-{uuid.uuid4().hex[:6]}"
        workdir.mkdir()
        held = token if token is not None else (issue_token(email) if email is not None else None)
        return Client(client_venv, workdir, grpc_target, live_server.url, held)

    return make


@pytest.fixture
def alice_client(make_client: Callable[..., Client]) -> Client:
    return make_client(ALICE)


@dataclass(frozen=True)
class Call:
    """One RPC as the server's handler saw it."""

    method: str  # "ExperimentStateService/CreateWorkUnit"
    email: str  # verified, from the token
    asserted_email: str  # x-goog-user-email
    request: Any


@pytest.fixture
def rpc_log(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """Every RPC the in-process server hands to a handler during the test, in order."""
    import xmc.api.handlers  # noqa: F401 - fill the registry before wrapping it

    log: list[Call] = []
    for key, rpc in list(registry.RPCS.items()):

        def spy(request: Any, caller: registry.Caller, _rpc: registry.Rpc = rpc) -> Any:
            method = f"{_rpc.service.rsplit('.', 1)[-1]}/{_rpc.method}"
            log.append(Call(method, caller.email, caller.asserted_email, request))
            return _rpc.handler(request, caller)

        monkeypatch.setitem(registry.RPCS, key, registry.Rpc(rpc.service, rpc.method, rpc.request, rpc.response, spy))
    return log


@pytest.fixture(autouse=True)
def _no_git_above(tmp_path: Path) -> Iterator[None]:
    # The client snapshots the cwd's git repo (contract 2.2); tmp dirs must not be in one.
    probe = subprocess.run(["git", "rev-parse", "--git-dir"], cwd=tmp_path, capture_output=True, check=False)
    assert probe.returncode != 0, "tmp_path is inside a git repository"
    yield
