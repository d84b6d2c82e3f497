"""``scripts/debian_package.sh``: how ``./dev`` installs Debian's chromium and prometheus when missing.

Two checkouts set up at once on a fresh machine (a ``./dev test`` beside
another) ran apt-get together; the second found dpkg's lock taken, gave up,
and its run skipped the browser tests and turned the system metrics off.
These tests put a stand-in ``apt-get`` first on a PATH of its own (the only
part that is not real: the suite cannot install and remove Debian packages
of the machine it runs on) that refuses to run while another one runs, as
dpkg's lock does, and that "installs" a command by writing it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "debian_package.sh"
#: What the script and the stand-in apt-get run, linked from the machine into the private PATH.
TOOLS = ("bash", "flock", "mktemp", "rm", "tail", "sleep", "mkdir", "rmdir", "chmod", "cat")

FAKE_APT = """#!{bash}
# dpkg's lock as apt-get meets it without waiting: a second one while one runs fails.
if ! mkdir "{state}/dpkg-lock" 2>/dev/null; then
  echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)" >&2
  exit 100
fi
trap 'rmdir "{state}/dpkg-lock"' EXIT
echo "$*" >> "{state}/calls"
sleep 1
case " $* " in
  *" install "*)
    for last; do :; done
    if [ -e "{state}/broken" ]; then echo "E: Unable to locate package $last" >&2; exit 100; fi
    printf '#!{bash}\\n' > "{bin}/xmc-test-$last"
    chmod +x "{bin}/xmc-test-$last"
    ;;
esac
"""


@pytest.fixture
def machine(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A private PATH (the tools, a stand-in apt-get, an ``id`` that says root) and its state folder."""
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} is not on this machine"
        (bin_dir / tool).symlink_to(found)
    bash = shutil.which("bash")
    (bin_dir / "apt-get").write_text(FAKE_APT.format(bash=bash, state=state, bin=bin_dir))
    (bin_dir / "id").write_text(f"#!{bash}\necho ${{FAKE_UID:-0}}\n")
    for name in ("apt-get", "id"):
        (bin_dir / name).chmod(0o755)
    env = {"PATH": str(bin_dir), "TMPDIR": str(tmp_path), "XMC_APT_LOCK": str(tmp_path / "apt.lock"),
           "HOME": str(tmp_path)}
    return bin_dir, state, env


def _install(env: dict[str, str], package: str = "browser") -> subprocess.Popen[str]:
    return subprocess.Popen([str(SCRIPT), f"xmc-test-{package}", package], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_it_installs_once_for_two_checkouts_set_up_at_once_and_both_find_the_command(
        machine: tuple[Path, Path, dict[str, str]]) -> None:
    bin_dir, state, env = machine
    first, second = _install(env), _install(env)
    done = [(p.wait(timeout=60), *p.communicate()) for p in (first, second)]
    assert [rc for rc, _, _ in done] == [0, 0], done
    calls = (state / "calls").read_text().splitlines()
    assert [c for c in calls if " install " in f" {c} "] == ["-o DPkg::Lock::Timeout=600 install -y -qq browser"]
    assert (bin_dir / "xmc-test-browser").exists()
    said = "".join(err for _, _, err in done)
    assert "installing Debian's browser" in said
    assert "waiting for another checkout's install" in said
    # Found: nothing more runs.
    again = _install(env)
    assert again.wait(timeout=30) == 0 and (state / "calls").read_text().splitlines() == calls


def test_it_says_why_an_install_failed_and_that_it_cannot_install_without_root(
        machine: tuple[Path, Path, dict[str, str]]) -> None:
    bin_dir, state, env = machine
    (state / "broken").touch()
    failed = _install(env, "absent")
    _, err = failed.communicate(timeout=60)
    assert failed.returncode == 1 and "Unable to locate package absent" in err
    assert not (bin_dir / "xmc-test-absent").exists()
    (state / "calls").unlink()
    not_root = _install({**env, "FAKE_UID": "1000"}, "absent")
    assert not_root.wait(timeout=30) == 2
    assert not (state / "calls").exists()  # apt-get was not even asked
    assert os.access(SCRIPT, os.X_OK)
