"""The virtualenv the `xmc` tests install ``clients/python`` into, and run the ``xmc`` command from.

Built like a researcher's: ``python -m venv``, then ``pip install
clients/python`` (a real, non-editable install: the console script and the
pinned dependencies of its metadata, nothing of the server). It lives outside
the checkout, ``$XMC_CLI_VENV`` or ``~/.cache/xmc/xmc-cli-py3.N``, and is
reused: the dependencies are installed again only when ``pyproject.toml``
changes, the package itself when any of its files changes (a hash of them
is stored in the environment). A lock file beside it makes concurrent runs
wait for one build. Build it ahead with ``python -m tests.system.cli.cli_env``.
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
        digest.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
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
    venv = venv_dir()
    deps_key, code_key = _digest([PACKAGE / "pyproject.toml"]), _digest(_code_files())
    if _stamp(venv, DEPS_STAMP) == deps_key and _stamp(venv, CODE_STAMP) == code_key:
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        log = venv.parent / f"{venv.name}.build.log"
        log.write_text("")
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q"]
        # Built from a copy: pip's setuptools build writes build/ and *.egg-info next to the sources.
        source = venv.parent / f"{venv.name}.src"
        if _stamp(venv, DEPS_STAMP) != deps_key:
            if venv.exists():
                shutil.rmtree(venv)
            _run([sys.executable, "-m", "venv", str(venv)], log)
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
