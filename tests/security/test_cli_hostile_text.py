"""Issue 40, item 7: ``xmc`` prints hostile server text as text, not as markup or terminal commands.

Mallory (Bob here) creates an experiment every signed-in user may read, with a
title and argument values made to attack the terminal of whoever lists it:
``[/x]`` (a closing tag with no opening one crashed rich), ``[link=...]`` (a
hyperlink), an ANSI colour, an OSC 8 hyperlink and a screen clear. Alice runs
the ordinary commands and must get a table with the text as written, minus
the control characters; ``--json`` still gives the server's exact strings.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.system.cli import rest
from tests.system.cli.conftest import cli_venv, issue_token, tokens, xmc  # noqa: F401
from tests.system.cli.runner import ALICE, BOB, Xmc
from tests.fixtures.systems import System

ESC = "\x1b"
QUICK_OK = "pull=1s;run=2s;exit=0"
TITLE = f"[/x] [link=https://evil.example]click[/link] {ESC}[31mred{ESC}[0m {ESC}]8;;https://evil.example{ESC}\\here{ESC}]8;;{ESC}\\ {ESC}[2J:smile:"
ARG = f"[/bold]{ESC}[5mblink\rover"


@pytest.fixture(scope="module")
def hostile(system: System, tokens: dict[str, str]) -> int:  # noqa: F811
    bob = tokens[BOB]
    created = rest.call(system.api, bob, "POST", "/v1/experiments",
                        {"title": TITLE, "acls": {"owners": [{"user": BOB}], "readers": [{"allAuthenticatedUsers": True}]}})
    xid = int(created["name"].rpartition("/")[2])
    for value in (ARG, "plain"):
        rest.call(system.api, bob, "POST", f"/v1/experiments/{xid}/workUnits",
                  rest.work_unit(QUICK_OK, args={"lr": value}))
    return xid


def assert_harmless(output: str) -> None:
    assert ESC not in output and "\r" not in output and "\x9b" not in output
    assert "MarkupError" not in output and "Traceback" not in output


def test_it_lists_a_hostile_title_as_text(xmc: Xmc, hostile: int, tokens: dict[str, str]) -> None:  # noqa: F811
    run = xmc("list", "--limit", "50", token=tokens[ALICE], COLUMNS="400").ok()
    assert_harmless(run.stdout + run.stderr)
    # The words as written; the sequences gone, not half-printed.
    assert "[/x] [link=https://evil.example]click[/link] red here :smile:" in run.stdout
    assert "😄" not in run.stdout


def test_it_shows_a_hostile_title_and_arguments_in_status(xmc: Xmc, hostile: int,  # noqa: F811
                                                          tokens: dict[str, str]) -> None:
    run = xmc("status", str(hostile), token=tokens[ALICE], COLUMNS="400").ok()
    assert_harmless(run.stdout + run.stderr)
    assert "[/x] [link=https://evil.example]click[/link]" in run.stdout
    assert "[/bold]blink" in run.stdout  # (the argument column is 14 wide)


def test_it_keeps_the_servers_strings_in_json(xmc: Xmc, hostile: int, tokens: dict[str, str]) -> None:  # noqa: F811
    run = xmc("status", str(hostile), "--json", token=tokens[ALICE]).ok()
    assert run.json["experiment"]["title"] == TITLE
    assert {u["args"]["lr"] for u in run.json["workUnits"]} == {ARG, "plain"}


def test_it_strips_control_sequences_but_keeps_the_words(cli_venv: Path) -> None:  # noqa: F811
    # The installed package's own function, as the command runs it.
    code = ("import sys; from xmc_cli import safe; "
            "sys.stdout.write(safe.clean(sys.argv[1]) + '|' + safe.clean('col\\tumn', tabs=True))")
    hostile = f"a{ESC}[1;31mb{ESC}]8;;http://x{ESC}\\c\x07d\x9b2Je\u202ef\r\ng\th"
    done = subprocess.run([str(cli_venv / "bin" / "python"), "-c", code, hostile], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout == "abcdef g h|col\tumn"


def test_it_prints_a_hostile_log_line_as_text(cli_venv: Path) -> None:  # noqa: F811
    # `xmc logs`' printer, in the installed package, on a terminal console.
    code = ("import sys; from rich.console import Console; from xmc_cli import logs\n"
            "out = Console(file=sys.stdout, force_terminal=True, markup=False, emoji=False, highlight=False)\n"
            "ctx = type('Ctx', (), {'out': out})()\n"
            "logs.Printer(ctx, as_json=False, timestamps=False, prefix=False).line({'text': sys.argv[1]})\n")
    line = f"step 1 [/x][link=https://evil.example]loss[/link] {ESC}]0;owned{ESC}\\{ESC}[2Jdone"
    done = subprocess.run([str(cli_venv / "bin" / "python"), "-c", code, line], capture_output=True, text=True,
                          check=True, timeout=60)
    # Rich styles the line itself (no style here, so no escape at all); the server's sequences are gone.
    assert "]0;owned" not in done.stdout and "[2J" not in done.stdout
    assert "step 1 [/x][link=https://evil.example]loss[/link] done" in done.stdout
