"""Reporters for CI systems, one class per format, each from one Outcome of any command:

- GithubReporter (`--format github`): one GitHub Actions workflow command per finding
  (`::error file=...,title=GQ401::message`), then the text report's final line; with
  GITHUB_STEP_SUMMARY set, a Markdown job summary appended to that file.
- SarifReporter (`--format sarif`): one SARIF 2.1.0 log (OASIS), one rule per finding code of
  the catalogue, one result per finding, for GitHub code scanning and other SARIF viewers.
- JunitReporter (`--format junit`): JUnit XML, one test case per module and one for the
  checkpoint as a whole, for test-report viewers (GitLab, Jenkins, Azure).

A finding about a config block inside a file (`config.json:quantization_config`) is located at
the file a runner or viewer can open (`config.json`), with the key named: first in the message
of a GitHub annotation, as a SARIF logical location beside the physical one (JUnit's cases
are modules, and its lines print the finding's `file` as it is).

verify --against and --reference report modules, not findings: a module that differs is a
GQ504 here (a tensor outside the modules or a config entry a GQ507), a module inconsistent
with the fp32 reference a GQ505, so that every CI line carries a code of the catalogue."""
from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..findings import CATALOGUE, ERROR, WARNING, Finding
from ..formats.configs import FILES
from ..ops.inspect import InspectResult
from ..runtimes.verdicts import runtime_findings
from ..version import __version__
from .output import Reporter, emit_json, escape
from .text_lines import (
    against_lines,
    convert_lines,
    doctor_lines,
    failure_lines,
    fix_label_lines,
    inspect_lines,
    module_differences,
    reference_lines,
    scan_lines,
    verify_lines,
)

if TYPE_CHECKING:   # each command's own modules are imported by that command
    from ..conversion import ConvertReport
    from ..conversion.relabel import RelabelResult
    from ..doctor import Diagnosis
    from ..ops.equivalence import EquivalenceReport, ReferenceReport
    from ..ops.scan import ScanResult
    from ..ops.verify import Report


@dataclass
class Outcome:
    """What any command ended with, in the terms every CI format needs."""
    command: str                 # "inspect", "verify", "verify --against", ...
    target: str | None           # the checkpoint path the findings' files are relative to
    code: int                    # the exit code
    final: str                   # the text report's final line ("" when there is none)
    findings: list[Finding] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    strict: bool = False
    message: str | None = None   # why the command stopped (exit 2, 3, a signal)
    # per finding, the checkpoint its file is relative to, where they differ (scan: each
    # repo's files' pages on the Hub); `target` for all where None
    targets: list[str | None] | None = None

    def target_of(self, i: int) -> str | None:
        return self.targets[i] if self.targets is not None else self.target

    def fails(self, f: Finding) -> bool:
        return f.severity == ERROR or self.strict and f.severity == WARNING


def _final(lines) -> str:
    finals = [ln.text for ln in lines if ln.kind == "final"]
    return finals[-1] if finals else ""


class _CiReporter(Reporter):
    """Turns each result into an Outcome; subclasses render it (`emit`)."""
    def emit(self, o: Outcome) -> None:
        raise NotImplementedError

    def _located(self, result: InspectResult | Diagnosis) -> str | None:
        """Where the result's findings are: the checkpoint, or for a repo read over HTTP
        the Hub's pages of its files (the boundary's target)."""
        return self.target if result.remote is not None else result.path

    def inspect(self, result: InspectResult, code: int) -> None:
        doc = result.to_json()
        self.emit(Outcome("inspect", self._located(result), code,
                          _final(inspect_lines(result, doc, row_lines=False)),
                          list(result.findings), [m["name"] for m in doc["modules"]]))

    def verify(self, report: Report, strict: bool, code: int) -> None:
        self.emit(Outcome("verify", report.path, code, _final(verify_lines(report, strict)),
                          list(report.findings), [r.name for r in report.source.records()],
                          strict))

    def against(self, rep: EquivalenceReport, code: int) -> None:
        found = [Finding("GQ504", d, tensor=m.name)
                 for m in rep.modules if not m.equal for d in module_differences(m)]
        found += [Finding("GQ507", d.what, tensor=d.where) for d in rep.tensors + rep.configs]
        self.emit(Outcome("verify --against", rep.src, code, _final(against_lines(rep)),
                          found, [m.name for m in rep.modules]))

    def reference(self, rep: ReferenceReport, code: int) -> None:
        found = [Finding("GQ505", f"{d.verdict}" + (f" ({d.detail})" if d.detail else ""),
                         tensor=d.name) for d in rep.inconsistent]
        self.emit(Outcome("verify --reference", self.target, code,
                          _final(reference_lines(rep)), found, [d.name for d in rep.modules]))

    def convert(self, report: ConvertReport, code: int) -> None:
        self.emit(Outcome("convert", report.src, code, _final(convert_lines(report)),
                          list(report.findings), [m.name for m in report.modules]))

    def fix_label(self, result: RelabelResult, code: int) -> None:
        found = list(result.plan.findings)
        mods = []
        if result.verify is not None:
            found += result.verify.findings
            mods = [r.name for r in result.verify.source.records()]
        self.emit(Outcome("fix-label", str(result.plan.path), code,
                          _final(fix_label_lines(result)), found, mods))

    def doctor(self, result: Diagnosis, code: int) -> None:
        d = result.fixed.after if result.fixed and result.fixed.after else result
        where = "config.json" if d.verdict is not None else None
        found = list(d.blocking) + (runtime_findings([d.verdict], where)
                                    if d.verdict is not None else [])
        self.emit(Outcome("doctor", self._located(result), code, _final(doctor_lines(result)),
                          [f for f in found if f.code != "GQ606"]))

    def scan(self, result: ScanResult, code: int) -> None:
        from ..ops.remote import blob_url

        located = [(blob_url(r.remote) if r.remote else None, f)
                   for r in result.repos for f in r.findings]
        self.emit(Outcome("scan", None, code, _final(scan_lines(result)),
                          [f for _, f in located], [r.repo for r in result.repos],
                          targets=[t for t, _ in located]))

    def failure(self, status: str, code: int, findings: Sequence[Finding] = (),
                message: str | None = None) -> None:
        self.emit(Outcome(self.command, self.target, code, _final(failure_lines(list(findings))),
                          list(findings), message=message))


def physical(file: str | None) -> tuple[str | None, str | None]:
    """(the file, the key inside it) of a finding's `file`: a config block is labelled
    FILE:KEY (`config.json:quantization_config`, formats/configs.py), a path a CI system cannot
    open; any other file is itself, with no key."""
    for name, key in FILES:
        if key is not None and file == f"{name}:{key}":
            return name, key
    return file, None


def artifact(target: str | None, file: str | None) -> str | None:
    """The path of a finding's file as a CI system wants it: relative to the working directory
    (the repository root in a CI job) when it lies inside it, else absolute. `file` is relative
    to the checkpoint directory (findings say "config.json"); `target` is the checkpoint (a
    directory or one .safetensors file)."""
    if target is None:
        return file
    if "://" in target:   # a repo read over HTTP: its files' pages on the Hub
        return f"{target}/{quote(file)}" if file is not None else target
    base = Path(target)
    if file is not None:
        base = (base if base.is_dir() else base.parent) / file
    absolute = Path(os.path.abspath(base))
    try:
        return absolute.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return absolute.as_posix()


# ---- GitHub Actions ----------------------------------------------------------------------

GITHUB_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def gh_data(s: str) -> str:
    """A workflow command's message, escaped as actions/toolkit's escapeData does."""
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def gh_property(s: str) -> str:
    """A workflow command's property value (file=, title=), as escapeProperty does."""
    return gh_data(s).replace(":", "%3A").replace(",", "%2C")


def gh_command(level: str, message: str, **props: str | None) -> str:
    given = ",".join(f"{k}={gh_property(v)}" for k, v in props.items() if v)
    return f"::{level}{' ' + given if given else ''}::{gh_data(message)}"


MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+!|~:@.])")  # : @ . : no URL, mail or www autolink


def md(s: str) -> str:
    """Text for a Markdown table cell or line, shown as it is: no pipe, newline, HTML, link,
    image, autolink or emphasis from a name can break out of it or render (CommonMark's
    backslash escapes for ASCII punctuation; entities for <, > and &)."""
    s = escape(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return MD_SPECIAL.sub(r"\\\1", s)


class GithubReporter(_CiReporter):
    name = "github"
    step_summary = True          # the boundary turns it off on a second github output
    SUMMARY_ROWS = 200           # a job summary is limited to 1 MiB

    def emit(self, o: Outcome) -> None:
        for i, f in enumerate(o.findings):
            text = escape(f.message) + (f" (hint: {escape(f.hint)})" if f.hint else "")
            file, key = physical(f.file)
            for inside in (f.tensor, key):   # each put in front: key, tensor, message
                if inside:
                    text = f"{escape(inside)}: {text}"
            self.echo(gh_command(GITHUB_LEVEL[f.severity], text,
                                 file=escape(artifact(o.target_of(i), file)) if file else None,
                                 title=f"{f.code} {CATALOGUE[f.code].title}"))
        if o.message:
            self.echo(gh_command("error", escape(o.message), title="gptqfmt"))
        if o.final:
            self.echo(escape(o.final))
        path = os.environ.get("GITHUB_STEP_SUMMARY")
        if path and self.step_summary:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(job_summary(o))

def job_summary(o: Outcome) -> str:
    """The Markdown a job summary shows: the verdict, then a table of the findings."""
    ok = o.code == 0
    lines = [f"### {'✅' if ok else '❌'} gptqfmt {o.command}"
             + (f" {md(o.target)}" if o.target else ""), ""]
    if o.final:
        lines += [md(o.final), ""]
    if o.message:
        lines += [f"**error:** {md(o.message)}", ""]
    if o.findings:
        lines += ["| severity | code | where | message |", "|---|---|---|---|"]
        for f in o.findings[:GithubReporter.SUMMARY_ROWS]:
            where = "::".join(x for x in (f.file, f.tensor) if x) or "-"
            text = f.message + (f" (hint: {f.hint})" if f.hint else "")
            lines.append(f"| {f.severity} | {f.code} | {md(where)} | {md(text)} |")
        if len(o.findings) > GithubReporter.SUMMARY_ROWS:
            lines.append(f"\n… and {len(o.findings) - GithubReporter.SUMMARY_ROWS} more "
                         "(see the SARIF or JSON report)")
        lines.append("")
    return "\n".join(lines) + "\n"


# ---- SARIF 2.1.0 -------------------------------------------------------------------------

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}
RULE_IDS = list(CATALOGUE)       # ruleIndex: the position in this list


def sarif_rules() -> list[dict]:
    return [{"id": c.code, "shortDescription": {"text": c.title},
             "defaultConfiguration": {"level": SARIF_LEVEL[c.severity]},
             "properties": {"severity": c.severity}} for c in CATALOGUE.values()]


def _sarif_location(target: str | None, f: Finding) -> dict:
    file, key = physical(f.file)
    path = artifact(target, file)
    loc: dict = {}
    if path is not None and "://" in path:
        loc["physicalLocation"] = {"artifactLocation": {"uri": path}}
    elif path is not None:
        absolute = path.startswith("/")
        uri = {"uri": Path(path).as_uri() if absolute else quote(path)}
        if not absolute:
            uri["uriBaseId"] = "%SRCROOT%"
        loc["physicalLocation"] = {"artifactLocation": uri}
    logical = []
    if f.tensor:
        logical.append({"fullyQualifiedName": f.tensor, "kind": "member"})
    if key:   # the JSON object under that key of the file
        logical.append({"name": key, "fullyQualifiedName": key, "kind": "object"})
    if logical:
        loc["logicalLocations"] = logical
    return loc


def sarif_log(o: Outcome) -> dict:
    results = []
    for i, f in enumerate(o.findings):
        r = {"ruleId": f.code, "ruleIndex": RULE_IDS.index(f.code),
             "level": SARIF_LEVEL[f.severity],
             "message": {"text": f.message + (f" (hint: {f.hint})" if f.hint else "")}}
        loc = _sarif_location(o.target_of(i), f)
        if loc:
            r["locations"] = [loc]
        props = {k: v for k, v in (("hint", f.hint), ("details", f.details)) if v}
        if props:
            r["properties"] = props
        results.append(r)
    invocation: dict[str, Any] = {"executionSuccessful": o.code in (0, 1), "exitCode": o.code}
    if o.message:
        invocation["toolExecutionNotifications"] = [{"level": "error",
                                                     "message": {"text": o.message}}]
    run = {"tool": {"driver": {"name": "gptqfmt", "version": __version__,
                               "semanticVersion": __version__, "rules": sarif_rules()}},
           "invocations": [invocation],
           "originalUriBaseIds": {"%SRCROOT%": {"uri": Path.cwd().as_uri() + "/"}},
           "results": results,
           "properties": {"command": o.command, "final": o.final, "strict": o.strict}}
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}


class SarifReporter(_CiReporter):
    name = "sarif"

    def emit(self, o: Outcome) -> None:
        emit_json(sarif_log(o), self.stream)


# ---- JUnit XML ---------------------------------------------------------------------------

CHECKPOINT_CASE = "(checkpoint)"   # the test case of findings that belong to no module


def module_of(tensor: str | None, modules: set[str]) -> str | None:
    """The module a finding's tensor belongs to (`a.b.qzeros` -> `a.b`), if any."""
    name = tensor
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def junit_xml(o: Outcome) -> str:
    import xml.etree.ElementTree as ET  # only a junit report needs it

    mods = set(o.modules)
    cases: dict[str, list[Finding]] = {CHECKPOINT_CASE: []}
    cases.update((m, []) for m in o.modules)
    for f in o.findings:
        cases[module_of(f.tensor, mods) or CHECKPOINT_CASE].append(f)
    classname = f"gptqfmt.{o.command.split()[0]}"
    suite = ET.Element("testsuite", name=escape(f"gptqfmt {o.command} {o.target or ''}".strip()))
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="exit_code", value=str(o.code))
    ET.SubElement(props, "property", name="result", value=escape(o.final))
    failures = errors = 0
    for name, found in cases.items():
        case = ET.SubElement(suite, "testcase", classname=classname, name=escape(name))
        bad = [f for f in found if o.fails(f)]
        if name == CHECKPOINT_CASE and o.message:
            errors += 1
            ET.SubElement(case, "error", message=escape(o.message), type="error").text = \
                escape(o.message)
        elif bad:
            failures += 1
            # each line led by its severity, never by a name from the file: a line of the
            # XML on a CI log cannot start a workflow command (`::error::`)
            ET.SubElement(case, "failure", message=escape(bad[0].one_line()),
                          type=bad[0].code).text = "\n".join(
                f"{f.severity}: {escape(f.one_line())}" for f in bad)
        rest = [f for f in found if f not in bad]
        if rest:
            ET.SubElement(case, "system-out").text = "\n".join(
                f"{f.severity}: {escape(f.one_line())}" for f in rest)
    counts = {"tests": str(len(cases)), "failures": str(failures), "errors": str(errors)}
    suite.attrib.update(counts, skipped="0")
    root = ET.Element("testsuites", {"name": "gptqfmt", **counts})
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode")


class JunitReporter(_CiReporter):
    name = "junit"

    def emit(self, o: Outcome) -> None:
        self.echo(junit_xml(o))
