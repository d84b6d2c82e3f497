"""The virtualenv the `xmc` tests install ``clients/python`` into, and run the ``xmc`` command from.

Built like a researcher's: ``python -m venv``, then ``pip install
clients/python`` (a real, non-editable install: the console script and the
pinned dependencies of its metadata, nothing of the server). It lives outside
the checkout, ``$XMC_CLI_VENV`` or ``~/.cache/xmc/xmc-cli-py3.N``, and is
reused: the dependencies are installed again only when ``pyproject.toml``
changes, the package itself when any of its files changes (a hash of them
is stored in the environment). A lock file beside it makes concurrent runs
wait for one build. Build it ahead with ``python -m tests.system.cli.cli_env``.

`ensure_launch_venv` builds a second one beside it (``<that path>-xmanager``):
a researcher's launch environment, the real XManager client with every
package it pins (``tests/system/real_client/requirements-client.txt``, as the
real-client tests install it) and ``clients/python`` installed beside it
(``pip install xmanager==0.8.5.post1 ./clients/python``): what a launch
script that imports ``xmc_study`` runs in. ``pip check`` ends both builds, so
a dependency of the package that the client's pins contradict fails the build.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "clients" / "python"
CLIENT_REQUIREMENTS = ROOT / "tests" / "system" / "real_client" / "requirements-client.txt"
DEPS_STAMP = ".xmc-cli-deps.sha256"
CODE_STAMP = ".xmc-cli-code.sha256"


def venv_dir() -> Path:
    configured = os.environ.get("XMC_CLI_VENV")
    if configured:
        return Path(configured).expanduser().resolve()
    return Path.home() / ".cache" / "xmc" / f"xmc-cli-py{sys.version_info.major}.{sys.version_info.minor}"


def _digest(paths: list[Path]) -> str:
    digest = hashlib.sha256(f"python{sys.version_info.major}.{sys.version_info.minor}".encode())
    for path in sorted(paths):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _code_files() -> list[Path]:
    return [p for p in (PACKAGE / "src").rglob("*") if p.is_file() and "__pycache__" not in p.parts
            and ".egg-info" not in str(p)] + [PACKAGE / "pyproject.toml"]


def _stamp(venv: Path, name: str) -> str:
    path = venv / name
    return path.read_text().strip() if path.is_file() else ""


def _run(step: list[str], log: Path) -> None:
    with open(log, "a") as out:
        done = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, check=False, cwd=PACKAGE.parent)
    if done.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
        raise RuntimeError(f"building the xmc environment failed at {step[:5]}; log {log}:\n{tail}")


def ensure_cli_venv() -> Path:
    """The path of a virtualenv with the current ``clients/python`` installed (built or updated first)."""
    return _ensure(venv_dir(), client=False)


def launch_venv_dir() -> Path:
    cli = venv_dir()
    return cli.with_name(f"{cli.name}-xmanager")


def ensure_launch_venv() -> Path:
    """The path of a virtualenv with the real XManager client and the current ``clients/python`` beside it."""
    return _ensure(launch_venv_dir(), client=True)


def _ensure(venv: Path, *, client: bool) -> Path:
    deps = [PACKAGE / "pyproject.toml", *([CLIENT_REQUIREMENTS] if client else [])]
    deps_key, code_key = _digest(deps), _digest(_code_files())
    if _stamp(venv, DEPS_STAMP) == deps_key and _stamp(venv, CODE_STAMP) == code_key:
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _stamp(venv, DEPS_STAMP) == deps_key and _stamp(venv, CODE_STAMP) == code_key:
            return venv  # built by the run that held the lock
        log = venv.parent / f"{venv.name}.build.log"
        log.write_text("")
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q"]
        # Built from a copy: pip's setuptools build writes build/ and *.egg-info next to the sources.
        source = venv.parent / f"{venv.name}.src"
        if _stamp(venv, DEPS_STAMP) != deps_key:
            if venv.exists():
                shutil.rmtree(venv)
            _run([sys.executable, "-m", "venv", str(venv)], log)
            if client:  # the client's pinned world first, as the real-client tests install it
                _run([*pip, "--no-deps", "-r", str(CLIENT_REQUIREMENTS)], log)
            _copy(source)
            _run([*pip, str(source)], log)
            (venv / DEPS_STAMP).write_text(deps_key + "\n")
        elif _stamp(venv, CODE_STAMP) != code_key:
            _copy(source)
            _run([*pip, "--no-deps", "--force-reinstall", str(source)], log)
        _run([str(venv / "bin" / "python"), "-m", "pip", "check"], log)
        (venv / CODE_STAMP).write_text(code_key + "\n")
    return venv


def _copy(target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache"))


if __name__ == "__main__":
    print(ensure_cli_venv())
    if "--launch" in sys.argv[1:]:
        print(ensure_launch_venv())
