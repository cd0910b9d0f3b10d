"""How text reaches a terminal: colour by severity, quiet, summary. The reporters build lines,
each tagged with what it is (a finding of some severity, a per-module row, the final status
line); a View decides which of them a person sees and in which colour. The lines themselves,
and every JSON, SARIF or JUnit document, never depend on it.

    --color auto    colour when stdout is a terminal, NO_COLOR is unset or empty
                    (https://no-color.org) and TERM is not "dumb"
    --color always  colour even into a pipe or a file (`| less -R`); wins over NO_COLOR
    --color never   no colour
    -q/--quiet      only the final line and the findings that made the command fail (error
                    findings; under --strict the warnings too); no progress bar, no notes
    -v/--explain    every detail: each finding (infos too) with its own line, the runtimes'
                    kernels, readings and reasons, the evidence, every place a label is declared
    --summary       no per-module rows; the default above SUMMARY_ABOVE modules

Every line a person sees is at most WIDTH columns (GPTQFMT_WIDTH sets another; 0 never
wraps): a longer one is wrapped (never cut), its continuation indented under its text.
"""
from __future__ import annotations

import os
import sys
import textwrap
from dataclasses import dataclass

import click

COLOR_CHOICES = ("auto", "always", "never")

#: Above this many modules, inspect and verify print a summary unless --no-summary is given:
#: a 70B model has 560 quantized modules, and 560 rows bury the verdicts.
SUMMARY_ABOVE = 64

#: The widest line of a text report, in columns (characters): wider ones are wrapped.
WIDTH = 100

#: Severity -> colour, one table for every reporter: errors red, warnings yellow, infos cyan,
#: a passing final line green.
COLOURS = {"error": "red", "warning": "yellow", "info": "cyan", "ok": "green"}


@dataclass(frozen=True)
class Line:
    """One line of a text report. kind: "finding" (level = its severity), "row" (a per-module
    row, hidden under --summary; "rowhead" the head of their table), "final" (the status
    line; level "ok" or "error"), "verdict" (the first line: the answer and its reason),
    "text" (anything else: headers, tables' heads, verdict rows). `fails`: a line that made
    the command fail (a warning under --strict), which --quiet keeps."""
    text: str
    kind: str = "text"
    level: str | None = None
    fails: bool = False


def colour_wanted(choice: str, stream=None) -> bool:
    """Whether --color CHOICE colours what goes to `stream` (stdout by default)."""
    if choice == "always":
        return True
    if choice == "never":
        return False
    if os.environ.get("NO_COLOR", "") != "" or os.environ.get("TERM") == "dumb":
        return False
    stream = sys.stdout if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no stream, or a closed one
        return False


@dataclass(frozen=True)
class View:
    """What a person asked to see. `summary` None: decide by the module count."""
    color: bool = False
    quiet: bool = False
    summary: bool | None = None
    verbose: bool = False

    def summarise(self, modules: int) -> bool:
        return self.summary if self.summary is not None else modules > SUMMARY_ABOVE

    def shown(self, lines: list[Line]) -> list[Line]:
        """The lines a person sees: under quiet only the final line and what made the
        command fail."""
        if not self.quiet:
            return lines
        return [ln for ln in lines if ln.kind == "final"
                or ln.kind == "finding" and (ln.level == "error" or ln.fails)]

    def paint(self, line: Line) -> str:
        """The line's text, coloured by its level when colour is on. Only whole lines are
        coloured, so a line's text (escaped before it got here) is never cut by a code."""
        if not self.color or line.level not in COLOURS:
            return line.text
        return click.style(line.text, fg=COLOURS[line.level],
                           bold=True if line.kind == "final" else None)


PLAIN = View()


def width() -> int:
    """The widest line: WIDTH, or GPTQFMT_WIDTH where set (0: never wrap, for a log that a
    program reads line by line)."""
    try:
        return max(0, int(os.environ.get("GPTQFMT_WIDTH", WIDTH)))
    except ValueError:
        return WIDTH


def wrapped(text: str, width: int = WIDTH) -> list[str]:
    """`text` in lines of at most `width` columns, broken at spaces where it can be (a word
    longer than a line, such as a long path, is broken inside), each continuation indented
    four columns deeper than the text's own indent. Nothing is cut."""
    if width <= 0 or len(text) <= width:
        return [text]
    indent = " " * (len(text) - len(text.lstrip()) + 4)
    return textwrap.wrap(text, width=width, subsequent_indent=indent, break_long_words=True,
                         break_on_hyphens=False, drop_whitespace=True) or [text]
