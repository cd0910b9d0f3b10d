"""Everything the CLI prints: escaping of untrusted names, JSON documents, text tables."""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from json.encoder import encode_basestring_ascii as _string
from typing import IO, TYPE_CHECKING

import click

from ..findings import Finding
from .view import PLAIN, View

if TYPE_CHECKING:
    from ..conversion.relabel import RelabelResult
    from ..conversion.report import ConvertReport
    from ..doctor import Diagnosis
    from ..ops.equivalence import EquivalenceReport, ReferenceReport
    from ..ops.inspect import InspectResult
    from ..ops.scan import ScanResult
    from ..ops.verify import Report


def escape(s: str | None) -> str:
    """Make a name from an untrusted file safe for a terminal: control and other non-printable
    characters (ANSI escapes included) become \\xNN / \\uNNNN. Printable characters, the
    backslash included, stay as they are, so a path prints as the user typed it. Apply it once,
    where untrusted text meets the terminal (note() and finding_line() do)."""
    if s is None:
        return ""
    if s.isprintable():   # nearly every name: one pass in C, not one a character in Python
        return s
    out = []
    for ch in s:
        if ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return "".join(out)


def defuse(line: str) -> str:
    """A text line that a CI runner cannot take for one of its commands: GitHub Actions reads a
    log line that starts with `::` (after blanks) as a workflow command, and a file or tensor
    name can start one (`::error::x.safetensors`). Its first colon becomes \\x3a, as escape()
    writes an unsafe character; every other line is returned as it is."""
    head = len(line) - len(line.lstrip())
    return line[:head] + "\\x3a" + line[head + 1:] if line[head:].startswith("::") else line


def finding_where(f: Finding) -> str:
    """Where a finding is, as text lines name it: `file::tensor`, either alone, or empty."""
    where = escape(f.file)
    if f.tensor:
        where = f"{where}::{escape(f.tensor)}" if where else escape(f.tensor)
    return where


def finding_line(f: Finding) -> str:
    """`file::tensor: CODE message (hint: next step)`: one line, the next step included, so a
    refusal in text mode says what to do as the JSON does."""
    where = finding_where(f)
    line = f"{where}: {f.code} {escape(f.message)}" if where else f"{f.code} {escape(f.message)}"
    return f"{line} (hint: {escape(f.hint)})" if f.hint else line


def plural(n: int, word: str, words: str | None = None) -> str:
    """'1 error', '2 errors', '1 module', '0 modules' ('1 entry', '2 entries' with `words`)."""
    return f"{n} {word}" if n == 1 else f"{n} {words or word + 's'}"


def emit_json(doc, file=None) -> None:
    """Exactly one JSON document on `file` (stdout by default; ASCII, so control characters
    are escaped). Non-finite numbers (an inf error, a NaN scale) become null: JSON has no
    NaN."""
    click.echo(json_text(doc), file=file)


def json_text(doc) -> str:
    """`doc` as json.dumps(doc, indent=2) writes it, byte for byte, with every non-finite float
    value null, in one walk. json's own encoder runs in Python once it indents (a
    36,000-module report: 1.6 s, and 0.7 s more to replace non-finite numbers first); here
    each string goes through its C escaping and each container is written in place (0.8 s).

    Worked example: {"a": [1, 2.5, float("nan")], "b": {}} gives
    '{\n  "a": [\n    1,\n    2.5,\n    null\n  ],\n  "b": {}\n}'."""
    out: list[str] = []
    put = out.append

    def value(x, pad: str) -> None:
        if isinstance(x, str):
            put(_string(x))
        elif x is None:
            put("null")
        elif x is True:
            put("true")
        elif x is False:
            put("false")
        elif isinstance(x, int):
            put(int.__repr__(x))
        elif isinstance(x, float):
            put(float.__repr__(x) if math.isfinite(x) else "null")
        elif isinstance(x, dict):
            if not x:
                put("{}")
                return
            inner = pad + "  "
            sep = "{\n" + inner
            for k, v in x.items():
                put(sep + _string(_key(k)) + ": ")
                sep = ",\n" + inner
                value(v, inner)
            put("\n" + pad + "}")
        elif isinstance(x, (list, tuple)):
            if not x:
                put("[]")
                return
            inner = pad + "  "
            sep = "[\n" + inner
            for v in x:
                put(sep)
                sep = ",\n" + inner
                value(v, inner)
            put("\n" + pad + "]")
        else:
            raise TypeError(f"Object of type {type(x).__name__} is not JSON serializable")
    value(doc, "")
    return "".join(out)


def _key(k) -> str:
    """A dict key as json writes it (str, or a number, bool or None as its JSON text)."""
    if isinstance(k, str):
        return k
    if isinstance(k, float):
        if not math.isfinite(k):
            raise ValueError(f"Out of range float values are not JSON compliant: {k!r}")
        return float.__repr__(k)
    if k is True or k is False or k is None:
        return {True: "true", False: "false", None: "null"}[k]
    if isinstance(k, int):
        return int.__repr__(k)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(k).__name__}")


def note(message: str) -> None:
    """A line for people on stderr."""
    click.echo(escape(message), err=True)


def human_bytes(n: int) -> str:
    """Decimal SI units (1 kB = 1000 B), as tqdm's progress bars and the Hugging Face Hub show
    sizes: one convention in every output."""
    x = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if x < 1000 or unit == "TB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1000
    return f"{x} B"


def table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header).rstrip()] + [fmt.format(*map(str, r)).rstrip() for r in rows]


class Reporter(ABC):
    """What every reporter shares: where its document goes (`stream`, stdout by default; a
    file under --output FORMAT=FILE) and what a person asked to see (`view`: colour, quiet,
    summary; only the text reporter reads it). A subclass answers every kind of result, each
    with the exit code the command decided."""
    name = ""
    target: str | None = None    # the checkpoint the command reads (set by the boundary)
    command: str = "gptqfmt"     # the command that runs (set by the boundary)

    def __init__(self, stream: IO[str] | None = None, view: View = PLAIN):
        self.stream = stream
        self.view = view

    def echo(self, text: str) -> None:
        # click strips ANSI codes from a stream that is not a terminal unless told otherwise
        click.echo(text, file=self.stream, color=True if self.view.color else None)

    @abstractmethod
    def inspect(self, result: InspectResult, code: int) -> None: ...

    @abstractmethod
    def verify(self, report: Report, strict: bool, code: int) -> None: ...

    @abstractmethod
    def against(self, rep: EquivalenceReport, code: int) -> None: ...

    @abstractmethod
    def reference(self, rep: ReferenceReport, code: int) -> None: ...

    @abstractmethod
    def convert(self, report: ConvertReport, code: int) -> None: ...

    @abstractmethod
    def fix_label(self, result: RelabelResult, code: int) -> None: ...

    @abstractmethod
    def doctor(self, result: Diagnosis, code: int) -> None: ...

    @abstractmethod
    def scan(self, result: ScanResult, code: int) -> None: ...

    @abstractmethod
    def failure(self, status: str, code: int, findings: Sequence[Finding] = (),
                message: str | None = None) -> None:
        """The command stopped: `status` fail (findings) or error (message)."""
