"""Running the installed ``xmc`` command as a subprocess (tests/system/cli and the walkthrough)."""
from __future__ import annotations

import json
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests import waiting

ALICE = "alice@example.com"
BOB = "bob@example.com"


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    def ok(self) -> Run:
        assert self.returncode == 0, f"exit {self.returncode}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        return self

    @property
    def json(self) -> Any:
        return json.loads(self.stdout)

    @property
    def lines(self) -> list[Any]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]


class Running:
    """A command still running, its output read as it comes (a thread per stream), so a test can wait on
    the line that says the command reached a point (``wait_for``) before it acts, instead of a clock."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(stream, into), daemon=True)
                         for stream, into in ((proc.stdout, self.out), (proc.stderr, self.err))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    def wait_for(self, text: str, *, stream: str = "stderr", timeout: float = 120) -> None:
        """Until ``text`` appears on ``stream`` (the command still running or not)."""
        lines = self.err if stream == "stderr" else self.out
        waiting.eventually(lambda: text in "".join(lines), timeout, f"{text!r} on the command's {stream}",
                           detail=lambda: f"stdout: {''.join(self.out)!r}\nstderr: {''.join(self.err)!r}")

    def finish(self, timeout: float = 180) -> Run:
        """Wait for the command's end (killed past ``timeout``) and answer what it printed."""
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            for reader in self._readers:
                reader.join(10)
        return Run(self.proc.returncode, "".join(self.out), "".join(self.err))


class Xmc:
    def __init__(self, venv: Path, home: Path, api: str) -> None:
        self.venv, self.home, self.api = venv, home, api

    def env(self, token: str | None, **overrides: str | None) -> dict[str, str]:
        env = {"PATH": f"{self.venv / 'bin'}:/usr/bin:/bin", "HOME": str(self.home), "LANG": "C.UTF-8",
               "COLUMNS": "80", "XMC_API_URL": self.api, "PYTHONUNBUFFERED": "1"}
        if token is not None:
            env["XMC_AUTH_TOKEN"] = token
        for key, value in overrides.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def __call__(self, *args: str, token: str | None, timeout: float = 60, **env: str | None) -> Run:
        done = subprocess.run([str(self.venv / "bin" / "xmc"), *args], env=self.env(token, **env),
                              capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL)
        return Run(done.returncode, done.stdout, done.stderr)

    def popen(self, *args: str, token: str | None, **env: str | None) -> subprocess.Popen[str]:
        return subprocess.Popen([str(self.venv / "bin" / "xmc"), *args], env=self.env(token, **env),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)

    def start(self, *args: str, token: str | None, **env: str | None) -> Running:
        """The command running in the background; see :class:`Running`."""
        return Running(self.popen(*args, token=token, **env))
