"""``xmc study show``'s table: at most five parameter columns, and the rest named, never dropped silently."""
from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "clients" / "python" / "src"))
from xmc_cli import study  # noqa: E402 - the package's source, as test_writer reads xmc_metrics


def test_it_names_the_parameters_beyond_the_columns_under_the_table() -> None:
    names = [f"p{i}" for i in range(study.MAX_PARAM_COLUMNS + 2)]
    shown = {"parameters": {n: {} for n in names}, "objective": {"metric": "loss", "stat": "last", "goal": "MINIMIZE"},
             "trials": [{"number": 0, "workUnit": 2, "state": "COMPLETED", "value": 0.5,
                         "parameters": {n: i for i, n in enumerate(names)}}]}
    console = Console(width=200, record=True)
    console.print(study.trials_table(shown))
    text = console.export_text()
    header = text.splitlines()[0].split()
    assert [n for n in names if n in header] == names[:study.MAX_PARAM_COLUMNS]
    hidden = names[study.MAX_PARAM_COLUMNS:]
    assert f"2 more parameters not shown: {', '.join(hidden)} (--json shows every one)" in text
