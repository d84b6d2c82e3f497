"""The architecture contracts of .importlinter hold (STYLE.md 12): the floors, the SDK seam, the simulators apart."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _lint(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--config", str(config), "--no-cache"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )


def test_it_keeps_every_import_contract() -> None:
    proc = _lint(ROOT / ".importlinter")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout
    for name in ("Only k8s_bridge.client imports the kubernetes SDK", "Nothing in production imports the simulator",
                 "The simulators import nothing of production and no Django",
                 "Every floor imports only the floors below it", "Nothing below imports notifications"):
        assert name in proc.stdout


def test_it_would_catch_a_module_that_imports_the_sdk(tmp_path: Path) -> None:
    """The first contract is live: without its one exemption it breaks on k8s_bridge.client."""
    config = (ROOT / ".importlinter").read_text().replace(
        "ignore_imports =\n    k8s_bridge.client -> kubernetes\n", "")
    path = tmp_path / "importlinter.ini"
    path.write_text(config)
    proc = _lint(path)
    assert proc.returncode != 0
    assert "k8s_bridge.client -> kubernetes" in proc.stdout


def test_it_would_catch_a_floor_that_imports_upwards(tmp_path: Path) -> None:
    """The layers contract is live: with artifacts and metrics put below workunits it breaks on their real imports."""
    config = (ROOT / ".importlinter").read_text().replace("    artifacts | metrics\n    workunits\n",
                                                          "    workunits\n    artifacts | metrics\n")
    assert config != (ROOT / ".importlinter").read_text()
    path = tmp_path / "importlinter.ini"
    path.write_text(config)
    proc = _lint(path)
    assert proc.returncode != 0
    assert "Every floor imports only the floors below it BROKEN" in proc.stdout
