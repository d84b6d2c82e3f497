"""Server text made safe for a terminal: no markup, no control characters.

Every string that comes from the server (titles, owners, argument values,
messages, log lines, error texts, response headers) is written by someone
else, possibly an attacker who can only create an experiment the victim can
read. Two things in such a string act on the victim's terminal:

* rich markup (``[/x]`` raised ``MarkupError`` and crashed ``xmc list`` for
  everyone; ``[link=...]`` made a hyperlink): the consoles of `xmc_cli.main`
  have markup and emoji codes off, and styled output is built from
  ``rich.text.Text``, which never parses markup;
* control characters (``ESC [ ... m`` recolours, ``ESC ] 8`` hyperlinks,
  ``ESC [ 2 J`` clears the screen, a carriage return overwrites the line,
  bidirectional overrides reorder what is shown): `clean` removes them.

`clean` is applied to every server string the tables and text print
(`xmc_cli.render`, `xmc_cli.present.why`, `xmc_cli.logs`, `xmc_cli.watch`,
`xmc_cli.actions`, the error line); ``--json`` output is the server's JSON,
untouched.
"""
from __future__ import annotations

import re
from typing import Any

from rich.text import Text

# C0 (but tab and line breaks, which become spaces), DEL, C1, and the Unicode
# bidirectional controls.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_BREAK = re.compile("\r\n|[\n\r\u2028\u2029]")
# A whole escape sequence (CSI, OSC up to its terminator, or a two-byte ESC x) goes, not only its ESC.
_SEQUENCE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x9b[0-?]*[ -/]*[@-~]|\x1b[@-_]?")


def clean(value: Any, *, tabs: bool = False) -> str:
    """``value`` as one line of text: escape sequences and control characters removed, line breaks
    (and tabs, unless ``tabs``) made spaces."""
    text = _BREAK.sub(" ", _CONTROL.sub("", _SEQUENCE.sub("", str(value if value is not None else ""))))
    return text if tabs else text.replace("\t", " ")


def plain(value: Any, style: str = "") -> Text:
    """A cell or line of server text: cleaned, and a ``Text`` so no markup in it is ever read."""
    return Text(clean(value), style=style)
