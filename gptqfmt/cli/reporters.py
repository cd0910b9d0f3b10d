"""How results reach the user, one class per output format, chosen by name (`--format`).

A reporter turns the library's result objects (which carry no exit code and print nothing) into
its document: TextReporter for people (text_lines.py builds the lines, view.py filters and
colours them), JsonReporter for programs (exactly one document, valid against its schema in
schemas/), and the CI formats of ci.py (github, sarif, junit). Adding an output format is adding
one class and its name to REPORTERS; no command changes. The command decides the exit code and
passes it in, because failure documents and some result documents carry it."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..findings import Finding
from ..ops.inspect import InspectResult
from .ci import GithubReporter, JunitReporter, SarifReporter
from .output import Reporter, defuse, emit_json, note
from .text_lines import (
    against_lines,
    convert_lines,
    doctor_lines,
    failure_lines,
    fix_label_lines,
    inspect_lines,
    reference_lines,
    scan_lines,
    verify_lines,
    without_rows,
)
from .view import PLAIN, Line, View, width, wrapped

if TYPE_CHECKING:   # each command's own modules are imported by that command
    from ..conversion import ConvertReport
    from ..conversion.relabel import RelabelResult
    from ..doctor import Diagnosis
    from ..ops.equivalence import EquivalenceReport, ReferenceReport
    from ..ops.scan import ScanResult
    from ..ops.verify import Report


def with_exit_code(doc: dict[str, Any], code: int) -> dict[str, Any]:
    """`doc` with "exit_code" right after its header ("mode" where there is one, else
    "status"): where the schemas' documents have always carried it."""
    after = "mode" if "mode" in doc else "status"
    out: dict[str, Any] = {}
    for k, v in doc.items():
        out[k] = v
        if k == after:
            out["exit_code"] = code
    return out


class JsonReporter(Reporter):
    name = "json"

    def inspect(self, result: InspectResult, code: int) -> None:
        emit_json(with_exit_code(result.to_json(), code), self.stream)

    def verify(self, report: Report, strict: bool, code: int) -> None:
        emit_json(with_exit_code(report.to_json(strict), code), self.stream)

    def against(self, rep: EquivalenceReport, code: int) -> None:
        emit_json(with_exit_code(rep.to_json(), code), self.stream)

    def reference(self, rep: ReferenceReport, code: int) -> None:
        emit_json(with_exit_code(rep.to_json(), code), self.stream)

    def convert(self, report: ConvertReport, code: int) -> None:
        emit_json(with_exit_code(report.to_json(), code), self.stream)

    def fix_label(self, result: RelabelResult, code: int) -> None:
        doc = with_exit_code(result.to_json(), code)
        if result.verify is not None:   # verify's document as verify prints it (not --strict)
            doc["verify"] = with_exit_code(doc["verify"], 1 if result.verify.failed() else 0)
        emit_json(doc, self.stream)

    def doctor(self, result: Diagnosis, code: int) -> None:
        emit_json(with_exit_code(result.to_json(), code), self.stream)

    def scan(self, result: ScanResult, code: int) -> None:
        emit_json(with_exit_code(result.to_json(), code), self.stream)

    def failure(self, status: str, code: int, findings: Sequence[Finding] = (),
                message: str | None = None) -> None:
        doc: dict[str, Any] = {"status": status, "exit_code": code,
                               "findings": [f.to_json() for f in findings]}
        if message:
            doc["error"] = message
        emit_json(doc, self.stream)


class TextReporter(Reporter):
    """For people: the lines of text_lines.py, filtered and coloured by the View."""
    name = "text"

    def _show(self, lines: list[Line], modules: int = 0) -> None:
        if self.view.summarise(modules):
            lines = without_rows(lines)
        columns = width()
        for line in self.view.shown(lines):
            for piece in wrapped(line.text, columns):
                self.echo(self.view.paint(Line(defuse(piece), line.kind, line.level)))

    def inspect(self, result: InspectResult, code: int) -> None:
        n = result.source.record_count
        shown = not self.view.summarise(n)
        self._show(inspect_lines(result, result.to_json(rows=shown), self.view.verbose,
                                 row_lines=shown), n)

    def verify(self, report: Report, strict: bool, code: int) -> None:
        self._show(verify_lines(report, strict, self.view.verbose))

    def against(self, rep: EquivalenceReport, code: int) -> None:
        self._show(against_lines(rep), len(rep.modules))

    def reference(self, rep: ReferenceReport, code: int) -> None:
        self._show(reference_lines(rep), len(rep.modules))

    def convert(self, report: ConvertReport, code: int) -> None:
        self._show(convert_lines(report, self.view.verbose))

    def fix_label(self, result: RelabelResult, code: int) -> None:
        self._show(fix_label_lines(result, self.view.verbose))

    def doctor(self, result: Diagnosis, code: int) -> None:
        self._show(doctor_lines(result, self.view.verbose))

    def scan(self, result: ScanResult, code: int) -> None:
        self._show(scan_lines(result, self.view.verbose))

    def failure(self, status: str, code: int, findings: Sequence[Finding] = (),
                message: str | None = None) -> None:
        self._show(failure_lines(list(findings), self.view.verbose))
        if message:
            note(f"gptqfmt: error: {message}")  # note() escapes, once; never quieted


REPORTERS: dict[str, type[Reporter]] = {
    r.name: r for r in (TextReporter, JsonReporter, GithubReporter, SarifReporter,
                        JunitReporter)}


def reporter(fmt: str, stream=None, view: View = PLAIN) -> Reporter:
    """The reporter for `--format fmt`, writing to `stream` (stdout by default)."""
    return REPORTERS[fmt](stream, view)
