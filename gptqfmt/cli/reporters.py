"""How results reach the user, one class per output format, chosen by name (`--format`).

A reporter turns the library's result objects (which carry no exit code and print nothing) into
stdout: TextReporter for people, JsonReporter for programs (exactly one document, valid against
its schema in schemas/). Adding an output format is adding one class here and its name to
REPORTERS; no command changes. The command decides the exit code and passes it in, because
failure documents and some result documents carry it."""
from __future__ import annotations

from typing import Any

import click

from ..conversion import ConvertReport
from ..conversion.relabel import RelabelResult
from ..findings import Finding
from ..formats.checks import layout_words
from ..inspection import FormatInspectResult, InspectResult, inspect_json
from ..validation import FormatReport, Report
from ..numerics.equivalence import EquivalenceReport, ReferenceReport
from .output import emit_json, escape, finding_line, human_bytes, note, plural, table


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


class JsonReporter:
    name = "json"

    def inspect(self, result: InspectResult, code: int) -> None:
        emit_json(result.to_json())

    def verify(self, report: Report, strict: bool, code: int) -> None:
        emit_json(report.to_json(strict))

    def against(self, rep: EquivalenceReport, code: int) -> None:
        emit_json(with_exit_code(rep.to_json(), code))

    def reference(self, rep: ReferenceReport, code: int) -> None:
        emit_json(with_exit_code(rep.to_json(), code))

    def convert(self, report: ConvertReport, code: int) -> None:
        emit_json(with_exit_code(report.to_json(), code))

    def fix_label(self, result: RelabelResult, code: int) -> None:
        emit_json(with_exit_code(result.to_json(), code))

    def failure(self, status: str, code: int, findings: list[Finding] = (),
                message: str | None = None) -> None:
        doc: dict[str, Any] = {"status": status, "exit_code": code,
                               "findings": [f.to_json() for f in findings]}
        if message:
            doc["error"] = message
        emit_json(doc)


class TextReporter:
    name = "text"

    def inspect(self, result: InspectResult, code: int) -> None:
        lines = (format_inspect_lines(result, result.to_json())
                 if isinstance(result, FormatInspectResult) else
                 inspect_lines(result, inspect_json(result)))
        for line in lines:
            click.echo(line)

    def verify(self, report: Report, strict: bool, code: int) -> None:
        for f in report.findings:
            click.echo(finding_line(f))
        doc = report.to_json(strict)
        if isinstance(report, FormatReport):
            s = doc["summary"]
            click.echo(f"{'FAIL' if report.failed(strict) else 'OK'}: "
                       f"{plural(s['modules'], 'module')}, {plural(s['errors'], 'error')}, "
                       f"{plural(s['warnings'], 'warning')}, {plural(s['infos'], 'info')}; "
                       f"{escape(layout_words(report.source))}; zero points stored exactly")
            return
        for line in runtime_lines(doc["runtimes"]):
            click.echo(line)
        s, cf = doc["summary"], doc["checkpoint_format"]
        status = "FAIL" if report.failed(strict) else "OK"
        click.echo(f"{status}: {plural(s['modules'], 'module')}, {plural(s['errors'], 'error')}, "
                   f"{plural(s['warnings'], 'warning')}, {plural(s['infos'], 'info')}; "
                   f"declared {cf['declared'] or 'none'} "
                   f"(runtimes read {cf['effective']}), detected {cf['detected']} "
                   f"(confidence {cf['confidence']:.4f})")

    def against(self, rep: EquivalenceReport, code: int) -> None:
        for m in rep.modules:
            if m.equal:
                click.echo(f"{escape(m.name)}: equal (bitwise, every runtime)")
                continue
            cells = ", ".join(f"{g}: {n} zero cells" for g, n in m.cells_differ.items())
            click.echo(f"{escape(m.name)}: DIFFERS for {'; '.join(m.runtimes_differ) or '-'} "
                       f"(max abs {m.max_abs:.4g}, relative {m.max_rel:.3g}; {cells})"
                       + (f" {m.note}" if m.note else ""))
        n_eq = sum(m.equal for m in rep.modules)
        click.echo(f"{'OK' if rep.equivalent else 'FAIL'}: {n_eq} of {len(rep.modules)} modules "
                   f"compute the same Y = X @ W ({rep.src_convention} vs {rep.dst_convention}, "
                   f"backend {rep.backend}, {rep.columns} columns per module)")

    def reference(self, rep: ReferenceReport, code: int) -> None:
        for d in rep.modules:
            click.echo(f"{escape(d.name)}: {d.verdict}" + (f" ({d.detail})" if d.detail else ""))
        bad = rep.inconsistent
        click.echo(f"{'FAIL' if bad else 'OK'}: {len(rep.modules) - len(bad)} of "
                   f"{len(rep.modules)} modules consistent (runtimes read {rep.declared}, the "
                   f"data are {rep.detected})")

    def convert(self, report: ConvertReport, code: int) -> None:
        doc = report.to_json()
        for f in report.findings:
            click.echo(finding_line(f))
        t = doc["totals"]
        verb = "would convert" if report.dry_run else "converted"
        if report.between_formats:
            click.echo(f"{verb} {escape(report.src)} ({doc['from']}) -> {escape(report.dst)} "
                       f"({doc['to']}): {plural(len(doc['modules']), 'module')} re-laid out "
                       f"(codes, zero points, scales); "
                       + (f"{t['changed']} of {plural(t['fields'], 'zero point')} re-encoded "
                          f"from gptq's Z - 1, {t['ambiguous']} ambiguous, {t['lossy']} lossy"
                          if doc["from"] == "gptq" else
                          f"{plural(t['fields'], 'zero point')} carried exactly"))
            if report.gate is not None:
                checks = report.gate.modules
                click.echo(f"verified ({report.backend}): {plural(len(checks), 'module')} "
                           f"equal in codes, zero points, scales and g_idx with Y = X @ W "
                           f"bitwise; {report.gate.bytes_compared} bytes of other tensors "
                           "identical")
            return
        click.echo(f"{verb} {escape(report.src)} ({doc['from']}) -> {escape(report.dst)} "
                   f"({doc['to']}): {plural(len(doc['modules']), 'module')}, {t['changed']} of "
                   f"{plural(t['fields'], 'zero-point field')} changed, {t['ambiguous']} "
                   f"ambiguous, {t['lossy']} lossy")
        if t["changed"] == 0 and not report.dry_run:
            click.echo("no zero point changed (already in the target convention); configs "
                       "normalised")
        if report.gate is not None:
            checks = report.gate.modules
            lossy = sum(1 for c in checks if c.lossy_cells)
            click.echo(f"verified ({report.backend}): {report.gate.bytes_compared} bytes outside "
                       f"qzeros identical, {plural(len(checks) - lossy, 'module')} bitwise "
                       "equal" + (f", {lossy} lossy as reported (max relative output error "
                                  f"{max(c.rel_err for c in checks):.3g})" if lossy else ""))

    def fix_label(self, result: RelabelResult, code: int) -> None:
        p = result.plan
        for f in p.findings:
            click.echo(finding_line(f))
        det = p.detection
        if p.refused:
            click.echo(f"FAIL: nothing written to {escape(str(p.path))} (detected {det.verdict})")
            return
        verb = "would set" if result.dry_run else "set"
        for c in p.changes:
            old = "missing" if c.old is None else repr(c.old)
            click.echo(f"{escape(c.file)}: {verb} {c.key} {escape(old)} -> {c.new!r}")
        head = (f"label {p.target} (detected {det.verdict}, confidence {det.confidence:.4f})")
        if not p.changes:
            click.echo(f"{head}: every config already says so; nothing written")
        elif result.dry_run:
            click.echo(f"{head}: {plural(len(p.files), 'file')} would change; nothing written "
                       "(--dry-run)")
        else:
            click.echo(f"{head}: rewrote {', '.join(escape(f) for f in result.written)}")
        if result.verify is not None:
            self.verify(result.verify, False, code)

    def failure(self, status: str, code: int, findings: list[Finding] = (),
                message: str | None = None) -> None:
        for f in findings:
            click.echo(finding_line(f))  # each with its hint: the next step, as in JSON
        if findings:
            click.echo(f"FAIL: stopped by {plural(len(findings), 'finding')}")
        if message:
            note(f"gptqfmt: error: {message}")  # note() escapes, once


REPORTERS = {r.name: r for r in (TextReporter, JsonReporter)}


def reporter(fmt: str):
    """The reporter for `--format fmt`."""
    return REPORTERS[fmt]()


def _yn(v) -> str:
    return "?" if v is None else ("yes" if v else "no")


def _where(declared_in: list[dict]) -> str:
    if not declared_in:
        return ""
    if len({d["value"] for d in declared_in}) == 1:
        keys = sorted({f"{d['file']}:{d['key']}" for d in declared_in})
        return f"  (in {len(keys)} place{'s' if len(keys) > 1 else ''}: {', '.join(keys)})"
    return "  (conflicting: " + ", ".join(f"{d['file']}:{d['key']}={escape(d['value'])}"
                                          for d in declared_in) + ")"


def _head_lines(doc: dict) -> list[str]:
    """inspect's first lines, every format: the path, the files and where the config is from."""
    size = sum(f["size"] for f in doc["files"])
    n_files = len(doc["files"])
    kind = "shards" if doc["sharded"] else "file" + ("s" if n_files > 1 else "")
    return [f"checkpoint   {escape(doc['path'])}",
            f"files        {n_files} {kind}, {human_bytes(size)}, config from "
            f"{', '.join(doc['config_sources']) or 'nothing (no config file)'}"]


def _modules_line(doc: dict) -> str:
    return (f"modules      {len(doc['modules'])} quantized, "
            f"{plural(doc['other_tensors']['count'], 'other tensor')} "
            f"({human_bytes(doc['other_tensors']['bytes'])})")


def _tail_lines(findings: list[Finding], doc: dict) -> list[str]:
    """inspect's last lines, every format: the findings and the status."""
    lines = []
    if findings:
        lines.append(f"findings     {len(findings)}")
        lines += ["  " + finding_line(f) for f in findings]
    s = doc["summary"]
    lines.append(f"{doc['status']}: {plural(s['errors'], 'error')}, "
                 f"{plural(s['warnings'], 'warning')}, {plural(s['infos'], 'info')}")
    return lines


def inspect_lines(result: InspectResult, doc: dict) -> list[str]:
    """inspect's text report, from its JSON document (one source for both)."""
    cf, q = doc["checkpoint_format"], doc["quantization"]
    lines = _head_lines(doc)
    declared = cf["declared"] or "none (runtimes read gptq)"
    lines.append(f"declared     {declared}{_where(cf['declared_in'])}")
    lines.append(f"detected     {cf['detected']} (confidence {cf['confidence']:.2f}; "
                 f"{escape('; '.join(cf['evidence']))})")
    lines.append(f"quantization bits={q['bits']} group_size={q['group_size']} sym={_yn(q['sym'])} "
                 f"desc_act={_yn(q['desc_act'])} pack_dtype={q['pack_dtype']}"
                 + (" (mixed per module)" if q["mixed"] else ""))
    mods = doc["modules"]
    lines.append(_modules_line(doc))
    if mods:
        rows = [[escape(m["name"]), m["bits"] or "?", m["group_size"] or "?", _yn(m["desc_act"]),
                 f"{m['in_features']}x{m['out_features']}" if m["in_features"] else "?",
                 m["pack_dtype"] or "?", m["scale_dtype"] or "?",
                 (m["zero_point"] or {}).get("verdict", "-")] for m in mods]
        lines += ["  " + r for r in table(rows, ["module", "bits", "group", "act", "KxN", "pack",
                                                 "scales", "zeros"])]
    return lines + runtime_lines(doc["runtimes"]) + _tail_lines(result.findings, doc)


def format_inspect_lines(result: FormatInspectResult, doc: dict) -> list[str]:
    """inspect's text report of a compressed-tensors or AWQ checkpoint, from its JSON."""
    q = doc["quantization"]
    lines = _head_lines(doc) + [
             f"format       {escape(layout_words(result.source))}",
             "zero points  stored exactly (Z itself): no convention to detect",
             f"quantization bits={q['bits']} group_size={q['group_size']} sym={_yn(q['sym'])} "
             f"desc_act={_yn(q['desc_act'])}" + (" (mixed per module)" if q["mixed"] else "")]
    mods = doc["modules"]
    lines.append(_modules_line(doc))
    if mods:
        rows = [[escape(m["name"]), m["bits"], m["group_size"], _yn(m["desc_act"]),
                 f"{m['in_features']}x{m['out_features']}", m["scale_dtype"],
                 "sym" if m["sym"] else "asym"] for m in mods]
        lines += ["  " + r for r in table(rows, ["module", "bits", "group", "act", "KxN",
                                                 "scales", "zeros"])]
    return lines + _tail_lines(result.findings, doc)


def _decodes(v: dict) -> str:
    if v["decodes_correctly"] is None:
        return "?" if v["loads"] else "-"
    return "right" if v["decodes_correctly"] else "WRONG"


def _affected(v: dict) -> str:
    if not v["modules_affected"]:
        return "-"
    out = plural(v["modules_affected"], "module")
    if v["zero_cells_affected"]:
        out += f", {v['zero_cells_affected']} cells"
    if v["max_weight_change"]:
        out += f", |dW| <= {v['max_weight_change']:.3g}"
    return out


def runtime_lines(verdicts: list[dict]) -> list[str]:
    """The runtimes section: one row per runtime (the path it takes on the default device),
    then why, for each runtime that does not load it or decode it right, and each other path
    (another GPU, an option) that would end otherwise."""
    if not verdicts:
        return []
    rows = [[v["id"], v["versions"], "yes" if v["loads"] else "NO", v["kernel"] or "-",
             v["convention_read"] or "-", _decodes(v), _affected(v)] for v in verdicts]
    lines = ["runtimes     (on an NVIDIA GPU of compute capability 8.0)"]
    lines += ["  " + r for r in table(rows, ["runtime", "versions", "loads", "kernel", "reads",
                                             "decodes", "affected"])]
    for v in verdicts:
        if not v["loads"] or v["decodes_correctly"] is not True:
            lines.append(f"  {v['id']}: " + escape("; ".join(v["reasons"])))
        if v["kernel"] is None:
            continue  # refused before any path: the paths say nothing more
        outcome = (v["loads"], v["decodes_correctly"])
        ends: dict[tuple, list[dict]] = {}   # paths that end alike, in table order
        for p in v["paths"]:
            if not p["taken"] and (p["loads"], p["decodes_correctly"]) != outcome:
                state = ("would not load" if not p["loads"] else
                         {True: "decodes right", False: "decodes WRONG", None: "undecided"}[
                             p["decodes_correctly"]])
                why = "" if state == "decodes right" else "; ".join(p["reasons"])
                ends.setdefault((state, why), []).append(p)
        for (state, why), ps in ends.items():
            which = (f"other path {ps[0]['kernel']} ({ps[0]['when']})" if len(ps) == 1 else
                     "other paths " + ", ".join(p["kernel"] for p in ps))
            lines.append(f"  {v['id']}: {escape(which)}: {state}"
                         + (f": {escape(why)}" if why else ""))
    return lines
