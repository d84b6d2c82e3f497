"""The cached virtualenv holding the real XManager client, and running scripts in it.

Used by the real-client tests (``tests/system/real_client/conftest.py``) and by
the chaos suite (``bench/chaos.py``, whose launch driver runs in it); also a
command, to build the environment ahead of a test run::

    python -m tests.system.real_client.client_env

The client is ``xmanager==0.8.5.post1`` *with* all its dependencies (docker,
google-cloud-aiplatform, ...), which the server never installs, so it lives in
its own virtualenv outside the checkout: ``$XMC_CLIENT_VENV``, default
``~/.cache/xmc/xmanager-client-0.8.5.post1``. ``requirements-client.txt``
pins every package; the environment is rebuilt when that file (or the Python
version) changes, detected by a hash stored in the environment as its last
build step. Builds take an exclusive lock on a file beside the environment,
so concurrent test runs wait for one build instead of racing.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements-client.txt"
CLIENT_VERSION = "0.8.5.post1"
STAMP = ".xmc-client-requirements.sha256"


def venv_dir() -> Path:
    configured = os.environ.get("XMC_CLIENT_VENV")
    if configured:
        return Path(configured).expanduser().resolve()
    return Path.home() / ".cache" / "xmc" / f"xmanager-client-{CLIENT_VERSION}"


def requirements_key() -> str:
    """The hash the environment is keyed by: the pinned list and the Python it runs on."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes())
    digest.update(f"python{sys.version_info.major}.{sys.version_info.minor}".encode())
    return digest.hexdigest()


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def client_environment(
    venv: Path, home: Path, grpc_target: str, token: str | None, ui_url: str | None = None
) -> dict[str, str]:
    """The environment a client process runs in (client contract 1.5), and nothing else.

    ``XMANAGER_ENDPOINT=http://<grpc_target>`` (plain gRPC), ``XMC_AUTH_TOKEN``
    (None: none), ``XMANAGER_UI_URL`` (None: none), a private ``home`` with its
    XDG dirs (created here), and no Google: google-auth must never find
    credentials or probe a metadata server (pointed at a closed loopback port).
    """
    for sub in ("", ".config", ".cache"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "XMANAGER_ENDPOINT": f"http://{grpc_target}",
        "NO_GCE_CHECK": "True",
        "GCE_METADATA_HOST": "127.0.0.1:9",
        "GCE_METADATA_IP": "127.0.0.1:9",
    }
    if ui_url is not None:
        env["XMANAGER_UI_URL"] = ui_url
    if token is not None:
        env["XMC_AUTH_TOKEN"] = token
    return env


def _is_current(venv: Path, key: str) -> bool:
    stamp = venv / STAMP
    return stamp.is_file() and stamp.read_text().strip() == key and python_of(venv).exists()


def ensure_client_venv(progress: Callable[[str], None] = print) -> Path:
    """The path of an up-to-date client environment, building it first if needed."""
    venv = venv_dir()
    key = requirements_key()
    if _is_current(venv, key):
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    lock_path = venv.parent / f"{venv.name}.lock"
    with open(lock_path, "w") as lock:
        if not _try_lock(lock):
            progress(f"real_client: waiting for another run building {venv} ...")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_current(venv, key):  # built by whoever held the lock
            return venv
        _build(venv, key, progress)
    return venv


def _try_lock(lock: object) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # type: ignore[arg-type]
    except BlockingIOError:
        return False
    return True


def _build(venv: Path, key: str, progress: Callable[[str], None]) -> None:
    started = time.monotonic()
    progress(
        f"real_client: building the xmanager {CLIENT_VERSION} client environment in {venv} "
        f"(first run only; pinned in {REQUIREMENTS.name}; a few minutes) ..."
    )
    # Built in place: a virtualenv cannot be moved (its scripts name their
    # interpreter by absolute path). The stamp, written last, marks it complete.
    if venv.exists():
        shutil.rmtree(venv)
    log = venv.parent / f"{venv.name}.build.log"
    with open(log, "w") as out:
        steps = [
            [sys.executable, "-m", "venv", str(venv)],
            [
                str(python_of(venv)), "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
                "--no-deps", "-r", str(REQUIREMENTS),
            ],
            [str(python_of(venv)), "-m", "pip", "check"],
        ]
        for step in steps:
            done = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, check=False)
            if done.returncode != 0:
                out.flush()
                tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
                raise RuntimeError(f"building the client environment failed at {step[2:5]}; log {log}:\n{tail}")
    (venv / STAMP).write_text(key + "\n")
    progress(f"real_client: client environment ready in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    print(ensure_client_venv())
