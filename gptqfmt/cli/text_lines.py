"""The text reports, as lines tagged for the View (view.Line): which line is a finding of
which severity, which is a per-module row (hidden under --summary), which is the final status
line. Every report is built from the result object or its JSON document, never from a second
reading of the checkpoint; the CI reporters (ci.py) take their final line from here too."""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..bits.conventions import CONVENTIONS
from ..findings import CATALOGUE, Finding
from ..ops.inspect import InspectResult
from ..ops.reports import summary_counts
from .output import escape, finding_line, finding_where, human_bytes, plural, table
from .view import Line

if TYPE_CHECKING:   # each command's own modules are imported by that command
    from ..conversion import ConvertReport
    from ..conversion.relabel import RelabelResult
    from ..doctor import Diagnosis
    from ..ops.equivalence import EquivalenceReport, ReferenceReport
    from ..ops.scan import ScanResult
    from ..ops.verify import Report


def final(text: str, ok: bool) -> Line:
    return Line(text, "final", "ok" if ok else "error")


def status(ok: bool, summary: dict, tail: str = "", infos_hidden: bool = False) -> Line:
    """The last line of every command, one grammar: `OK|FAIL: N modules, E errors, W warnings,
    I infos; what happened` (the modules left out where the command stopped before it
    counted them)."""
    modules = "" if summary["modules"] is None else f"{plural(summary['modules'], 'module')}, "
    text = (f"{'OK' if ok else 'FAIL'}: {modules}"
            f"{plural(summary['errors'], 'error')}, {plural(summary['warnings'], 'warning')}, "
            f"{plural(summary['infos'], 'info')}")
    if infos_hidden and summary["infos"]:
        text += " (-v lists them)"
    return final(text + (f"; {tail}" if tail else ""), ok)


def verdict(ok: bool, reason: str) -> Line:
    """The first line of every command: the answer and the one reason that matters most."""
    return Line(f"{'OK' if ok else 'FAIL'}: {reason}", "verdict", "ok" if ok else "error")


#: Which failing finding gives the verdict's reason: the label first (every zero point off by
#: one), then the container, the configs, the shapes, the rest, in code order.
def _weight(f: Finding) -> tuple:
    return (f.code != "GQ401", f.code)


def top_reason(findings: list[Finding], failing: set[str], cf: dict | None) -> str | None:
    """The reason of the most important failing finding, in words, with how many others
    there are; None when nothing fails."""
    bad = [f for f in findings if f.severity in failing]
    if not bad:
        return None
    top = min(bad, key=_weight)
    if top.code == "GQ401" and cf is not None:
        declared, reads = cf["declared"], _reads(cf)
        # nothing declared: runtimes read gptq, as every report says; a label runtimes do
        # not read (format without checkpoint_format) is named beside what they do read
        said = f"declared {declared or 'nothing'}" + (
            f", runtimes read {reads}" if declared not in (None, reads) else "")
        reason = (f"{said}, the data are {cf['detected']}: every runtime that reads the zero "
                  "points reads each one off by one")
    elif len(top.message) > SHORT:
        # a long explanation is said once, on the finding's own line: here its title
        same = sum(1 for f in bad if f.code == top.code)
        reason = f"{CATALOGUE[top.code].title} ({top.code}" + (
            f", {same} findings)" if same > 1 else f": {finding_where(top) or 'the checkpoint'})")
        others = len(bad) - same
        return reason + (f" (and {plural(others, 'more finding')})" if others else "")
    else:
        where = finding_where(top)
        reason = (f"{escape(top.message).rstrip('.')} "
                  f"({where + ': ' if where else ''}{top.code})")
    others = len(bad) - 1
    return reason + (f" (and {plural(others, 'more finding')})" if others else "")


#: The longest finding message the verdict repeats; a longer one is named by its title.
SHORT = 120


def findings_lines(findings, indent: str = "", verbose: bool = True,
                   failing: frozenset[str] = frozenset({"error"})) -> list[Line]:
    """One line per finding (-v); by default infos are left out (the status line counts them)
    and findings that say the same thing of several modules (the same code and message, but
    for the numbers) are one line naming the first and counting the others."""
    if verbose:
        return [Line(indent + finding_line(f), "finding", f.severity,
                     f.severity in failing) for f in findings]
    groups: dict[tuple, list[Finding]] = {}
    for f in findings:
        if f.severity != "info":
            groups.setdefault((f.code, _DIGITS.sub("#", f.message), f.hint and
                               _DIGITS.sub("#", f.hint)), []).append(f)
    lines = []
    for same in groups.values():
        text = finding_line(same[0])
        if len(same) > 1:
            head, more = finding_where(same[0]), f"(and {len(same) - 1} more like it)"
            text = f"{head} {more}{text[len(head):]}" if head else f"{more} {text}"
        lines.append(Line(indent + text, "finding", same[0].severity,
                          same[0].severity in failing))
    return lines


_DIGITS = re.compile(r"\d+(\.\d+)?")


def rows(lines: list[str]) -> list[Line]:
    """A table of one row per module: its head, then the rows (both hidden by --summary)."""
    return [Line(lines[0], "rowhead")] + [Line(t, "row") for t in lines[1:]]


def hidden_rows(n: int) -> Line:
    """The line that stands for `n` module rows left out (--summary)."""
    return Line(f"  ({plural(n, 'module row')} not shown; --no-summary lists them)")


def without_rows(lines: list[Line]) -> list[Line]:
    """--summary: each block of per-module rows becomes one line that says how many were left
    out and how to see them."""
    out: list[Line] = []
    hidden = 0
    for ln in lines + [Line("", "end")]:
        if ln.kind in ("row", "rowhead"):
            hidden += ln.kind == "row"
            continue
        if hidden:
            out.append(hidden_rows(hidden))
            hidden = 0
        if ln.kind != "end":
            out.append(ln)
    return out


def _yn(v) -> str:
    return "?" if v is None else ("yes" if v else "no")


def _places(declared_in: list[dict], verbose: bool = True) -> str:
    if not declared_in:
        return ""
    if len({d["value"] for d in declared_in}) == 1:
        # a key that names the convention by another value (auto-round's packing_format)
        # shows that value too
        keys = sorted({f"{d['file']}:{d['key']}" + (f"={escape(d['written'])}"
                                                     if "written" in d else "")
                       for d in declared_in})
        n = f"in {len(keys)} place{'s' if len(keys) > 1 else ''}"
        return f"  ({n}: {', '.join(keys)})" if verbose or len(keys) == 1 else \
            f"  ({n}; -v lists them)"
    return "  (conflicting: " + ", ".join(
        f"{d['file']}:{d['key']}={escape(d.get('written', d['value']))}"
        + (f" ({d['value']})" if "written" in d else "") for d in declared_in) + ")"


def _head_lines(doc: dict) -> list[Line]:
    """inspect's first lines after the verdict: the path, the files and where the config is
    from."""
    size = sum(f["size"] for f in doc["files"])
    bad = doc.get("unreadable_files", [])
    n_files = len(doc["files"]) + len(bad)
    kind = "shards" if doc["sharded"] else "file" + ("s" if n_files > 1 else "")
    cannot = f" ({len(bad)} cannot be read: {', '.join(map(escape, bad))})" if bad else ""
    return [Line(f"checkpoint   {escape(doc['path'])}"), *remote_lines(doc.get("remote")),
            Line(f"files        {n_files} {kind}{cannot}, {human_bytes(size)}; config from "
                 f"{', '.join(doc['config_sources']) or 'nothing (no config file)'}")]


def remote_lines(remote: dict | None) -> list[Line]:
    """For a repo read over HTTP: the commit read, what was fetched, and how to get the local
    copy that the commands below name."""
    if remote is None:
        return []
    return [Line(f"remote       commit {remote['commit']} on {escape(remote['endpoint'])}: "
                 f"{human_bytes(remote['bytes_read'])} read of "
                 f"{human_bytes(remote['checkpoint_bytes'])} "
                 f"({100 * remote['fraction_read']:.2f}%) in "
                 f"{plural(remote['requests'], 'request')}"),
            Line(f"local copy   {escape(remote['download'])} (commands below name it)")]


def remote_tail(remote: dict | None) -> str:
    """The status line's tail for a repo read over HTTP."""
    if remote is None:
        return ""
    return (f"; {human_bytes(remote['bytes_read'])} read over HTTP "
            f"({100 * remote['fraction_read']:.2f}%)")


def _module_lines(doc: dict, row_lines: bool, cells: Callable[[dict], list],
                  header: list[str]) -> list[Line]:
    """inspect's modules line, then a row of `cells(module)` under `header` for each module,
    or without `row_lines` (--summary) one line that says how many rows are not shown."""
    n = doc["summary"]["modules"]
    out = [Line(f"modules      {n} quantized, "
                f"{plural(doc['other_tensors']['count'], 'other tensor')} "
                f"({human_bytes(doc['other_tensors']['bytes'])})")]
    if n and not row_lines:
        out.append(hidden_rows(n))
    elif n:
        out += rows(["  " + r for r in table([cells(m) for m in doc["modules"]], header)])
    return out


def _reads(cf: dict) -> str:
    """The convention the runtimes read (the label's, gptq where there is none)."""
    return str(cf["effective"])


def _ok_reason(cf: dict | None, runtimes: list[dict], what: str, describe: str = "") -> str:
    """The verdict's reason where nothing fails: what the zero points are, and how many
    runtimes serve the checkpoint right."""
    if cf is None:
        head = f"{describe}, zero points stored exactly"
    elif cf["detected"] == _reads(cf):
        head = (f"the data are {cf['detected']}, as declared" if cf["declared"]
                else f"no label, data {cf['detected']} (as runtimes assume)")
    else:
        head = (f"declared {cf['declared'] or 'nothing'}; the data do not decide "
                f"({cf['detected']})")
    right = sum(1 for v in runtimes if v["loads"] and v["decodes_correctly"])
    tail = f"; {right} of {len(runtimes)} runtimes decode it right" if runtimes else ""
    return f"{what + '; ' if what else ''}{head}{tail}"


def _mark(verdict: str | None, reads: str) -> str:
    """A module's zero-point verdict, marked where it is not what the runtimes read."""
    if verdict in (None, "-"):
        return "-"
    return verdict + (" (!)" if verdict in CONVENTIONS and verdict != reads else "")


def inspect_lines(result: InspectResult, doc: dict, verbose: bool = False,
                  row_lines: bool = True) -> list[Line]:
    """inspect's text report, from its JSON document (one source for both): the verdict, a
    checkpoint whose zero points follow a label with what it declares and what the data are,
    one that stores them exactly with its format; the runtimes; the findings; the status.
    Without `row_lines` (--summary) the module rows are never built: one line says how many
    there are."""
    if result.detection is None:
        return format_inspect_lines(result, doc, verbose, row_lines)
    cf, q = doc["checkpoint_format"], doc["quantization"]
    reads = _reads(cf)
    reason = top_reason(result.findings, {"error"}, cf) or _ok_reason(
        cf, doc.get("runtimes", []), "")
    lines = [verdict(doc["status"] == "ok", reason)] + _head_lines(doc)
    declared = cf["declared"] or "none (runtimes read gptq)"
    if cf["declared"] not in (None, reads):   # format without checkpoint_format
        declared += f" (runtimes read {reads})"
    mismatch = (f"  MISMATCH: the data are {cf['detected']}"
                if cf["detected"] in CONVENTIONS and cf["detected"] != reads else "")
    lines.append(Line(f"declared     {declared}{mismatch}{_places(cf['declared_in'], verbose)}",
                      "text", "error" if mismatch else None))
    evidence = cf["evidence"] if verbose else cf["evidence"][:1]
    lines.append(Line(f"detected     {cf['detected']} (confidence {cf['confidence']:.2f}; "
                      f"{escape('; '.join(evidence))})"))
    lines.append(Line(f"quantization bits={q['bits']} group_size={q['group_size']} "
                      f"sym={_yn(q['sym'])} desc_act={_yn(q['desc_act'])} "
                      f"pack_dtype={q['pack_dtype']}"
                      + (" (mixed per module)" if q["mixed"] else "")))
    lines += _module_lines(doc, row_lines, lambda m: [
        escape(m["name"]), m["bits"] or "?", m["group_size"] or "?", _yn(m["desc_act"]),
        f"{m['in_features']}x{m['out_features']}" if m["in_features"] else "?",
        m["pack_dtype"] or "?", m["scale_dtype"] or "?",
        _mark((m["zero_point"] or {}).get("verdict"), reads)],
        ["module", "bits", "group", "act", "KxN", "pack", "scales", "zeros"])
    return (lines + runtime_lines(doc.get("runtimes", []), verbose)
            + _tail_lines(result.findings, doc, verbose))


def _tail_lines(findings: list[Finding], doc: dict, verbose: bool) -> list[Line]:
    """inspect's last lines: the findings and the status."""
    lines = []
    shown = findings_lines(findings, "  ", verbose)
    if shown:
        lines.append(Line("findings"))
        lines += shown
    return lines + [status(doc["status"] == "ok", doc["summary"],
                           _conventions(doc) + remote_tail(doc.get("remote")),
                           infos_hidden=not verbose)]


def _conventions(doc: dict) -> str:
    """The status line's tail for inspect and verify: the label and the data, or the
    format where zero points are stored exactly."""
    cf = doc.get("checkpoint_format")
    if cf is None:
        return doc.get("format") or ""
    declared = cf["declared"] or "none"
    if declared == cf["detected"]:
        return f"{declared} declared and detected"
    return f"declared {declared}, detected {cf['detected']}"


def format_inspect_lines(result: InspectResult, doc: dict, verbose: bool = False,
                         row_lines: bool = True) -> list[Line]:
    """inspect's text report of a checkpoint that stores its zero points exactly
    (compressed-tensors, AWQ), from its JSON."""
    q = doc["quantization"]
    describe = escape(result.source.describe())
    reason = top_reason(result.findings, {"error"}, None) or _ok_reason(None, [], "", describe)
    lines = [verdict(doc["status"] == "ok", reason)] + _head_lines(doc) + [
        Line(f"format       {describe}"),
        Line("zero points  stored exactly (Z itself): no convention to detect"),
        Line(f"quantization bits={q['bits']} group_size={q['group_size']} sym={_yn(q['sym'])} "
             f"desc_act={_yn(q['desc_act'])}" + (" (mixed per module)" if q["mixed"] else ""))]
    lines += _module_lines(doc, row_lines, lambda m: [
        escape(m["name"]), m["bits"], m["group_size"], _yn(m["desc_act"]),
        f"{m['in_features']}x{m['out_features']}", m["scale_dtype"],
        "sym" if m["sym"] else "asym"],
        ["module", "bits", "group", "act", "KxN", "scales", "zeros"])
    return lines + _tail_lines(result.findings, doc, verbose)


def verify_lines(report: Report, strict: bool, verbose: bool = False) -> list[Line]:
    """verify's text report: the verdict, the findings, the checksums, the runtimes, the
    status."""
    doc = report.to_json(strict)
    ok = not report.failed(strict)
    failing = {"error", "warning"} if strict else {"error"}
    cf = doc.get("checkpoint_format")
    runtimes = doc.get("runtimes", [])
    describe = escape(report.source.describe()) if report.detection is None else ""
    warned = doc["summary"]["warnings"]
    reason = top_reason(report.findings, failing, cf) or _ok_reason(
        cf, runtimes, "every check passes" + (f" ({plural(warned, 'warning')})" if warned
                                              else ""), describe)
    lines = [verdict(ok, reason)]
    lines += findings_lines(report.findings, "", verbose, frozenset(failing))
    cs = doc.get("checksums")
    if cs:
        lines.append(Line(f"checksums    {plural(cs['files'], 'file')} "
                          f"({human_bytes(cs['bytes'])}) "
                          f"hashed against the {cs['source']} records: "
                          + (f"{cs['mismatched']} mismatched" if cs["mismatched"] else
                             "every one matches")
                          + (f"; {plural(len(cs['unrecorded']), 'file')} with no record"
                             if cs["unrecorded"] else ""),
                          "text", "error" if cs["mismatched"] else None))
    if cf is not None and verbose:
        lines.append(Line(f"zero points  declared {cf['declared'] or 'none'} (runtimes read "
                          f"{cf['effective']}), detected {cf['detected']} (confidence "
                          f"{cf['confidence']:.4f}; {escape('; '.join(cf['evidence']))})"))
    return lines + runtime_lines(runtimes, verbose) + [
        status(ok, doc["summary"], _conventions(doc), infos_hidden=not verbose)]


def against_lines(rep: EquivalenceReport) -> list[Line]:
    lines = []
    for m in rep.modules:
        if m.equal:
            lines.append(Line(f"{escape(m.name)}: equal (bitwise, every runtime)", "row"))
            continue
        lines += [Line(f"{escape(m.name)}: DIFFERS: {d}", "finding", "error")
                  for d in module_differences(m)]
    lines += [Line(f"{escape(d.where)}: DIFFERS: {d.what}", "finding", "error")
              for d in rep.tensors + rep.configs]
    n_eq = sum(m.equal for m in rep.modules)
    n = len(rep.modules)
    return [verdict(rep.equivalent, "both compute the same Y = X @ W in every module"
                    if rep.equivalent else f"{n - n_eq} of {plural(n, 'module')} compute "
                    "another Y = X @ W" if n_eq < n else "a tensor or config differs")
            ] + lines + [final(
        f"{'OK' if rep.equivalent else 'FAIL'}: {n_eq} of {plural(len(rep.modules), 'module')} "
        f"compute the same Y = X @ W, {rep.tensors_identical} of "
        f"{plural(rep.tensors_compared, 'other tensor')} identical byte for byte, "
        + (f"{plural(len(rep.configs), 'config entry differs', 'config entries differ')}"
           if rep.configs else "configs agree")
        + f" ({rep.src_convention} vs {rep.dst_convention}, backend {rep.backend}, "
          f"{rep.columns} columns per module)", rep.equivalent)]


def module_differences(m) -> list[str]:
    """How a module of verify --against differs, one phrase per difference (the text lines and
    the CI reporters' messages); the first carries how far the outputs are apart."""
    out = list(m.differences) or ["Y = X @ W differs"]
    if m.runtimes_differ and (m.max_abs or m.max_rel):
        out[0] += (f" (Y = X @ W max abs {m.max_abs:.4g}, relative {m.max_rel:.3g}, for "
                   f"{'; '.join(m.runtimes_differ)})")
    return out


def reference_lines(rep: ReferenceReport) -> list[Line]:
    bad = rep.inconsistent
    lines = [Line(f"{escape(d.name)}: {d.verdict}" + (f" ({d.detail})" if d.detail else ""),
                  "finding" if d in bad else "row", "error" if d in bad else None)
             for d in rep.modules]
    return [verdict(not bad, f"{len(bad)} of {plural(len(rep.modules), 'module')} inconsistent"
                    if bad else "every module consistent under every runtime's reading")
            ] + lines + [final(f"{'FAIL' if bad else 'OK'}: {len(rep.modules) - len(bad)} of "
                          f"{len(rep.modules)} modules consistent under every runtime's "
                          f"reading of the label {rep.declared} (the data are "
                          f"{rep.detected}; fp32 reference)", not bad)]


def convert_lines(report: ConvertReport, verbose: bool = False) -> list[Line]:
    """convert's text report: what was converted (the verdict), the findings, the proof, the
    status."""
    doc = report.to_json()
    t = doc["totals"]
    n = len(doc["modules"])
    verb = "would convert" if report.dry_run else "converted"
    if report.in_place:
        where = f"{escape(report.src)} in place ({doc['from']} -> {doc['to']})"
    else:
        where = (f"{escape(report.src)} ({doc['from']}) -> {escape(report.dst)} "
                 f"({doc['to']})")
    if report.between_formats:
        what = (f"{plural(n, 'module')} re-laid out (codes, zero points, scales); "
                + (f"{t['changed']} of {plural(t['fields'], 'zero point')} re-encoded from "
                   f"gptq's Z - 1, {t['ambiguous']} ambiguous, {t['lossy']} lossy"
                   if report.zeros_reencoded else
                   f"{plural(t['fields'], 'zero point')} carried exactly"))
    else:
        what = (f"{plural(n, 'module')}, {t['changed']} of "
                f"{plural(t['fields'], 'zero-point field')} changed, {t['ambiguous']} "
                f"ambiguous, {t['lossy']} lossy")
    lines = [verdict(True, f"{verb} {where}: {what}")]
    lines += findings_lines(report.findings, "", verbose)
    if not report.between_formats and t["changed"] == 0 and not report.dry_run:
        lines.append(Line("no zero point changed (already in the target convention); configs "
                          "normalised"))
    if report.gate is not None:
        lines.append(Line(_proof(report, doc)))
    tail = ("nothing written (--dry-run)" if report.dry_run else
            f"{escape(report.src)} rewritten in place" if report.in_place else
            f"{escape(report.dst)} written")
    return lines + [status(True, summary_counts(report.findings, n), tail,
                           infos_hidden=not verbose)]


def _proof(report: ConvertReport, doc: dict) -> str:
    """What the gate proved before anything was visible, and, for a lossy conversion, how far
    the outputs moved: measured against the source read as its own convention."""
    gate = report.gate
    assert gate is not None
    checks = gate.modules
    if report.between_formats:
        return (f"verified ({report.backend}): {plural(len(checks), 'module')} equal in codes, "
                f"zero points, scales and g_idx with Y = X @ W bitwise; "
                f"{gate.bytes_compared} bytes of other tensors identical")
    lossy = [c for c in checks if c.lossy_cells]
    what = (f"{gate.bytes_compared} bytes rewritten (qzeros ranges and configs) and read back "
            "as proven" if report.in_place else
            f"{gate.bytes_compared} bytes outside qzeros identical")
    text = (f"verified ({report.backend}): {what}, "
            f"{plural(len(checks) - len(lossy), 'module')} bitwise equal")
    if lossy:
        worst = max(lossy, key=lambda c: c.rel_err)
        src, dst = doc["from"], doc["to"]
        z = ("Z = 0, which gptq cannot store" if dst == "gptq" else
             "a stored maxq, whose Z (2^bits under gptq's reading) gptq_v2 cannot store")
        text += (f"; {len(lossy)} lossy as reported: where the source's zero points are {z}, "
                 f"Y = X @ W moves by at most {worst.rel_err:.3g} relative "
                 f"(||Y - Y_src|| / ||Y_src||, {worst.name}; Y_src: the source read as {src}, "
                 "on the columns that hold such a zero, random X)")
    return text


def fix_label_lines(result: RelabelResult, verbose: bool = False) -> list[Line]:
    """fix-label's text report: what it wrote (the verdict), each change, then verify's
    findings and runtimes on the result, and the status."""
    p = result.plan
    det = p.detection
    modules = len(det.modules)
    if p.refused:
        f = summary_counts(p.findings, modules)
        return ([verdict(False, (top_reason(p.findings, {"error"}, None) or "refused")
                         + f"; nothing written to {escape(str(p.path))}")]
                + findings_lines(p.findings, "", verbose)
                + [status(False, f, f"nothing written (detected {det.verdict})")])
    verb = "would set" if result.dry_run else "set"
    head = f"label {p.target} (detected {det.verdict}, confidence {det.confidence:.4f})"
    if not p.changes:
        first, tail = f"{head}: every config already says so", "nothing written"
    elif result.dry_run:
        first = f"{head}: {plural(len(p.files), 'file')} would change"
        tail = "nothing written (--dry-run)"
    else:
        first = f"{head}: rewrote {', '.join(escape(f) for f in result.written)}"
        tail = f"{', '.join(escape(f) for f in result.written)} rewritten"
    rep = result.verify
    ok = rep is None or not rep.failed()
    lines = [verdict(ok, first)] + findings_lines(p.findings, "", verbose)
    for c in p.changes:
        old = "missing" if c.old is None else c.old
        if c.new is None:   # a key GPTQModel refuses by name (is_marlin_format: false)
            lines.append(Line(f"{escape(c.file)}: {'would remove' if result.dry_run else 'remove'}"
                              f" {c.key} ({escape(c.old or '')}; GPTQModel 6.0 and later refuse "
                              "the key)"))
            continue
        lines.append(Line(f"{escape(c.file)}: {verb} {c.key} {escape(old)} -> {escape(c.new)}"))
    if rep is None:
        return lines + [status(ok, summary_counts(p.findings, modules), tail)]
    after = verify_lines(rep, False, verbose)
    body = [ln for ln in after if ln.kind not in ("verdict", "final")]
    if not ok:
        body.insert(0, Line("verify after: " + after[0].text, "text", "error"))
    summary = rep.to_json()["summary"]
    return lines + body + [status(ok, summary, tail if ok else f"{tail}, and verify fails",
                                  infos_hidden=not verbose)]


def doctor_lines(d: Diagnosis, verbose: bool = False) -> list[Line]:
    """The answer first, its reason second, then the plan (or why there is none), --fix's
    steps and the answer after them, and the status line."""
    from ..doctor import BROKEN, UNDECIDED, in_place_possible

    lines = [verdict(d.ok, escape(d.headline)), Line(f"why: {escape(d.reason)}")]
    lines += remote_lines(d.remote)
    lines += [Line(f"note: {escape(n)}") for n in d.notes]
    lines += findings_lines(d.blocking, "", verbose)
    p = d.plan
    if p.steps:
        lines.append(Line("plan:"))
        for i, s in enumerate(p.steps, 1):
            lines.append(Line(f"  {i}. {escape(s.command)}"))
            lines.append(Line(f"     {escape(s.does)}"))
        if p.expect:
            lines.append(Line(f"  then: {escape(p.expect)}"))
    elif not d.ok:
        if p.tried:
            lines.append(Line("no lossless way:" if d.answer != BROKEN else "next:"))
            lines += [Line(f"  - {escape(t)}") for t in p.tried]
        if p.elsewhere:
            lines.append(Line("serves it as it is:"))
            lines += [Line(f"  - {escape(e)}") for e in p.elsewhere]
        if d.answer not in (BROKEN, UNDECIDED):
            lines.append(Line("otherwise requantize: no conversion makes these weights right "
                              "for this runtime"))
    f = d.fixed
    if f is not None:
        lines.append(Line(f"fix ({escape(f.output)}):"))
        for s, err in f.ran:
            lines.append(Line(f"  {escape(s.command)}: " + ("done" if err is None else
                                                             escape(err))))
        if not f.ran:
            lines.append(Line("  nothing to run: " + (
                "it already computes the right weights (nothing written)"
                if f.after is not None else "no plan")))
        elif f.after is not None:
            lines.append(Line(f"  after: {escape(f.after.headline)}"))
    who = d.runtime.id + (f"@{'.'.join(map(str, d.version))}" if d.version else "")
    steps = len(p.steps)
    if f is not None:
        tail = (f"{who}: fixed, {escape(f.output)} computes the right weights" if d.ok
                else f"{who}: not fixed")
    elif d.ok:
        tail = f"{who}: right weights"
    else:
        tail = (f"{who}: {d.answer}; " + (
            f"plan: {plural(steps, 'step')} (--fix DST"
            + (" or --fix --in-place" if in_place_possible(p) else "") + " runs it)" if steps
            else "no plan"))
    return lines + [status(d.ok, summary_counts(d.blocking, d.modules),
                           tail + remote_tail(d.remote))]


def failure_lines(findings: list[Finding], verbose: bool = True) -> list[Line]:
    """A command stopped by findings: the reason first, the findings (with their hints: the
    next step, as in JSON), the status."""
    if not findings:
        return []
    reason = top_reason(findings, {"error", "warning", "info"}, None)
    assert reason is not None
    return ([verdict(False, reason)] + findings_lines(findings, "", verbose)
            + [status(False, {**summary_counts(findings, 0), "modules": None}, "stopped")])


def _decodes(v: dict) -> str:
    if v["decodes_correctly"] is None:
        return "?" if v["loads"] else "-"
    return "right" if v["decodes_correctly"] else "WRONG"


def _affected(v: dict) -> str:
    """How much a runtime gets wrong beyond the modules its reason counts: zero-point cells,
    the largest weight change."""
    out = []
    if v["zero_cells_affected"]:
        out.append(f"{v['zero_cells_affected']} zero-point cells")
    if v["max_weight_change"]:
        out.append(f"|dW| <= {v['max_weight_change']:.3g}")
    return f" ({', '.join(out)})" if out else ""


def _range(versions: str) -> str:
    """A runtime's version range without the code that was read (`>= 0.22 (read: 0.33.0)`:
    `>= 0.22`); an entry read at one commit only says so."""
    head = versions.split(" (read:")[0]
    return head.replace("read: ", "at ") if head.startswith("read: ") else head


def _read(versions: str) -> str:
    """The release or commit of a runtime's code that its rules were read from."""
    read = versions.partition("read: ")[2]
    return read[:-1] if read.endswith(")") else read or "-"


_DEVICE = "on an NVIDIA GPU of compute capability 8.0"


def runtime_lines(verdicts: list[dict], verbose: bool = False) -> list[Line]:
    """The runtimes section. By default one compact table (runtime, version range, loads,
    decodes), two runtimes to a row; -v: one row per runtime with the kernel it takes on the
    default device, the convention it reads and what it gets wrong, then why, for each runtime
    that does not load it or decode it right, and each other path (another GPU, an option)
    that would end otherwise. A runtime that fails is coloured as a warning: verify makes it
    an error only under --runtime, as a finding of its own."""
    if not verdicts:
        return []
    if not verbose:
        return _runtime_table(verdicts)
    cells = [[v["id"], _range(v["versions"]), _read(v["versions"]),
              "yes" if v["loads"] else "NO", v["kernel"] or "-", v["convention_read"] or "-",
              _decodes(v), v["modules_affected"] or "-"] for v in verdicts]
    table_lines = table(cells, ["runtime", "versions", "code read", "loads", "kernel", "reads",
                                "decodes", "modules"])
    lines = [Line(f"runtimes     {_DEVICE}"),
             Line("  " + table_lines[0])]
    for v, text in zip(verdicts, table_lines[1:]):
        bad = not v["loads"] or v["decodes_correctly"] is False
        lines.append(Line("  " + text, "text", "warning" if bad else None))
    for v in verdicts:
        if not v["loads"] or v["decodes_correctly"] is not True:
            lines.append(Line(f"  {v['id']}: " + escape("; ".join(v["reasons"]))
                              + (_affected(v) if v["loads"] else "")))
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
            lines.append(Line(f"  {v['id']}: {escape(which)}: {state}"
                              + (f": {escape(why)}" if why else "")))
    return lines


def _runtime_table(verdicts: list[dict]) -> list[Line]:
    """The compact runtimes table: runtime, version range, loads, decodes, two runtimes to a
    row, read down the left half first (as `ls` lists), within WIDTH columns. A runtime whose
    default path decodes right but another of its paths (another GPU, an option) would not is
    starred."""
    def other_wrong(v: dict) -> str:
        return "*" if any(not p["taken"] and p["loads"] and p["decodes_correctly"] is False
                          for p in v["paths"]) and v["decodes_correctly"] is not False else ""

    cells = [[v["id"], _range(v["versions"]), "yes" if v["loads"] else "NO",
              _decodes(v) + other_wrong(v)] for v in verdicts]
    star = any(c[3].endswith("*") for c in cells)
    head, *rows = table(cells, ["runtime", "versions", "loads", "decodes"])
    w = max(len(r) for r in [head, *rows])
    half = (len(rows) + 1) // 2
    bad = [not v["loads"] or v["decodes_correctly"] is False for v in verdicts]
    lines = [Line(f"runtimes     {_DEVICE} (-v: why"
                  + ("; *: another kernel WRONG)" if star else ")")),
             Line("  " + (head.ljust(w) + "    " + head if len(rows) > 1 else head))]
    for i, text in enumerate(rows[:half]):
        j = half + i
        if j < len(rows):
            text = text.ljust(w) + "    " + rows[j]
        worse = bad[i] or (j < len(rows) and bad[j])
        lines.append(Line("  " + text, "text", "warning" if worse else None))
    return lines


def inspect_reason(result: InspectResult) -> str:
    """The reason on inspect's first line (after OK: or FAIL:), for scan's line of a repo."""
    first = inspect_lines(result, result.to_json(rows=False), row_lines=False)[0]
    return first.text.split(": ", 1)[1]


def scan_lines(result: ScanResult, verbose: bool = False) -> list[Line]:
    """scan's report: the verdict over every repo, one line per repo (its status, the commit
    read, inspect's reason), the status line with what was read."""
    from ..ops.scan import OK, UNREADABLE

    t = result.totals()
    bad = t["fail"] + t["unreadable"]
    if result.ok:
        head = verdict(True, f"all {plural(t['repos'], 'repo')} pass inspect")
    else:
        parts = [f"{t['fail']} fail inspect" if t["fail"] else "",
                 f"{t['unreadable']} cannot be read" if t["unreadable"] else ""]
        head = verdict(False, f"{bad} of {plural(t['repos'], 'repo')}: "
                       + ", ".join(p for p in parts if p))
    lines = [head]
    cells = [[{OK: "OK", UNREADABLE: "ERROR"}.get(r.status, "FAIL"), escape(r.repo),
              r.remote["commit"][:12] if r.remote else "-", escape(r.reason)]
             for r in result.repos]
    if cells:
        lines += [Line("  " + row, "row", "error" if not c[0] == "OK" else None)
                  for row, c in zip(table(cells, ["status", "repo", "commit", "reason"])[1:],
                                    cells)]
    if verbose:
        for r in result.repos:
            shown = findings_lines(r.findings, "    ", verbose)
            if shown and r.status != UNREADABLE:
                lines.append(Line(f"  {escape(r.repo)}"))
                lines += shown
    share = (f" ({100 * t['bytes_read'] / t['checkpoint_bytes']:.2f}%)"
             if t["checkpoint_bytes"] else "")
    tail = (f"{plural(t['repos'], 'repo')}: {t['ok']} ok, {t['fail']} fail, "
            f"{t['unreadable']} unreadable; {human_bytes(t['bytes_read'])} read of "
            f"{human_bytes(t['checkpoint_bytes'])}{share} in {plural(t['requests'], 'request')}")
    return lines + [status(result.ok, summary_counts(result.findings, None), tail,
                           infos_hidden=not verbose)]
