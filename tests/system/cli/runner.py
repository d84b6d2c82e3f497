"""Running the installed ``xmc`` command as a subprocess (tests/system/cli and the walkthrough)."""
from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
