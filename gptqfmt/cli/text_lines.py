"""The text reports, as lines tagged for the View (view.Line): which line is a finding of
which severity, which is a per-module row (hidden under --summary), which is the final status
line. Every report is built from the result object or its JSON document, never from a second
reading of the checkpoint; the CI reporters (ci.py) take their final line from here too."""
from __future__ import annotations

from ..conversion import ConvertReport
from ..conversion.relabel import RelabelResult
from ..doctor import BROKEN, UNDECIDED, Diagnosis, in_place_possible
from ..findings import Finding
from ..ops.equivalence import EquivalenceReport, ReferenceReport
from ..ops.inspect import InspectResult
from ..ops.verify import Report
from .output import escape, finding_line, human_bytes, plural, table
from .view import Line


def final(text: str, ok: bool) -> Line:
    return Line(text, "final", "ok" if ok else "error")


def findings_lines(findings, indent: str = "") -> list[Line]:
    return [Line(indent + finding_line(f), "finding", f.severity) for f in findings]


def rows(lines: list[str]) -> list[Line]:
    """A table of one row per module: its head, then the rows (both hidden by --summary)."""
    return [Line(lines[0], "rowhead")] + [Line(t, "row") for t in lines[1:]]


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
            out.append(Line(f"  ({plural(hidden, 'module row')} not shown; --no-summary "
                            "lists them)"))
            hidden = 0
        if ln.kind != "end":
            out.append(ln)
    return out


def _yn(v) -> str:
    return "?" if v is None else ("yes" if v else "no")


def _where(declared_in: list[dict]) -> str:
    if not declared_in:
        return ""
    if len({d["value"] for d in declared_in}) == 1:
        # a key that names the convention by another value (auto-round's packing_format)
        # shows that value too
        keys = sorted({f"{d['file']}:{d['key']}" + (f"={escape(d['written'])}"
                                                     if "written" in d else "")
                       for d in declared_in})
        return f"  (in {len(keys)} place{'s' if len(keys) > 1 else ''}: {', '.join(keys)})"
    return "  (conflicting: " + ", ".join(
        f"{d['file']}:{d['key']}={escape(d.get('written', d['value']))}"
        + (f" ({d['value']})" if "written" in d else "") for d in declared_in) + ")"


def _head_lines(doc: dict) -> list[Line]:
    """inspect's first lines, every format: the path, the files and where the config is from."""
    size = sum(f["size"] for f in doc["files"])
    n_files = len(doc["files"])
    bad = doc.get("unreadable_files", [])
    n_files = len(doc["files"]) + len(bad)
    kind = "shards" if doc["sharded"] else "file" + ("s" if n_files > 1 else "")
    cannot = f" ({len(bad)} cannot be read: {', '.join(map(escape, bad))})" if bad else ""
    return [Line(f"checkpoint   {escape(doc['path'])}"),
            Line(f"files        {n_files} {kind}{cannot}, {human_bytes(size)}, config from "
                 f"{', '.join(doc['config_sources']) or 'nothing (no config file)'}")]


def _modules_line(doc: dict) -> Line:
    return Line(f"modules      {len(doc['modules'])} quantized, "
                f"{plural(doc['other_tensors']['count'], 'other tensor')} "
                f"({human_bytes(doc['other_tensors']['bytes'])})")


def _tail_lines(findings: list[Finding], doc: dict) -> list[Line]:
    """inspect's last lines, every format: the findings and the status."""
    lines = []
    if findings:
        lines.append(Line(f"findings     {len(findings)}"))
        lines += findings_lines(findings, "  ")
    s = doc["summary"]
    lines.append(final(f"{doc['status']}: {plural(s['errors'], 'error')}, "
                       f"{plural(s['warnings'], 'warning')}, {plural(s['infos'], 'info')}",
                       doc["status"] == "ok"))
    return lines


def inspect_lines(result: InspectResult, doc: dict) -> list[Line]:
    """inspect's text report, from its JSON document (one source for both): a checkpoint
    whose zero points follow a label with what it declares and what the data are, one that
    stores them exactly with its format."""
    if result.detection is None:
        return format_inspect_lines(result, doc)
    cf, q = doc["checkpoint_format"], doc["quantization"]
    lines = _head_lines(doc)
    declared = cf["declared"] or "none (runtimes read gptq)"
    lines.append(Line(f"declared     {declared}{_where(cf['declared_in'])}"))
    lines.append(Line(f"detected     {cf['detected']} (confidence {cf['confidence']:.2f}; "
                      f"{escape('; '.join(cf['evidence']))})"))
    lines.append(Line(f"quantization bits={q['bits']} group_size={q['group_size']} "
                      f"sym={_yn(q['sym'])} desc_act={_yn(q['desc_act'])} "
                      f"pack_dtype={q['pack_dtype']}"
                      + (" (mixed per module)" if q["mixed"] else "")))
    mods = doc["modules"]
    lines.append(_modules_line(doc))
    if mods:
        cells = [[escape(m["name"]), m["bits"] or "?", m["group_size"] or "?",
                  _yn(m["desc_act"]),
                  f"{m['in_features']}x{m['out_features']}" if m["in_features"] else "?",
                  m["pack_dtype"] or "?", m["scale_dtype"] or "?",
                  (m["zero_point"] or {}).get("verdict", "-")] for m in mods]
        lines += rows(["  " + r for r in table(cells, ["module", "bits", "group", "act", "KxN",
                                                       "pack", "scales", "zeros"])])
    return lines + runtime_lines(doc["runtimes"]) + _tail_lines(result.findings, doc)


def format_inspect_lines(result: InspectResult, doc: dict) -> list[Line]:
    """inspect's text report of a checkpoint that stores its zero points exactly
    (compressed-tensors, AWQ), from its JSON."""
    q = doc["quantization"]
    lines = _head_lines(doc) + [
        Line(f"format       {escape(result.source.describe())}"),
        Line("zero points  stored exactly (Z itself): no convention to detect"),
        Line(f"quantization bits={q['bits']} group_size={q['group_size']} sym={_yn(q['sym'])} "
             f"desc_act={_yn(q['desc_act'])}" + (" (mixed per module)" if q["mixed"] else ""))]
    mods = doc["modules"]
    lines.append(_modules_line(doc))
    if mods:
        cells = [[escape(m["name"]), m["bits"], m["group_size"], _yn(m["desc_act"]),
                  f"{m['in_features']}x{m['out_features']}", m["scale_dtype"],
                  "sym" if m["sym"] else "asym"] for m in mods]
        lines += rows(["  " + r for r in table(cells, ["module", "bits", "group", "act", "KxN",
                                                       "scales", "zeros"])])
    return lines + _tail_lines(result.findings, doc)


def verify_lines(report: Report, strict: bool) -> list[Line]:
    lines = findings_lines(report.findings)
    doc = report.to_json(strict)
    ok = not report.failed(strict)
    s = doc["summary"]
    counts = (f"{'OK' if ok else 'FAIL'}: {plural(s['modules'], 'module')}, "
              f"{plural(s['errors'], 'error')}, {plural(s['warnings'], 'warning')}, "
              f"{plural(s['infos'], 'info')}; ")
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
    if report.detection is None:
        return lines + [final(counts + f"{escape(report.source.describe())}; zero points "
                                       "stored exactly", ok)]
    cf = doc["checkpoint_format"]
    return lines + runtime_lines(doc["runtimes"]) + [final(
        counts + f"declared {cf['declared'] or 'none'} (runtimes read {cf['effective']}), "
                 f"detected {cf['detected']} (confidence {cf['confidence']:.4f})", ok)]


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
    return lines + [final(
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
    return lines + [final(f"{'FAIL' if bad else 'OK'}: {len(rep.modules) - len(bad)} of "
                          f"{len(rep.modules)} modules consistent under every runtime's "
                          f"reading of the label {rep.declared} (the data are "
                          f"{rep.detected}; fp32 reference)", not bad)]


def convert_lines(report: ConvertReport) -> list[Line]:
    doc = report.to_json()
    lines = findings_lines(report.findings)
    t = doc["totals"]
    verb = "would convert" if report.dry_run else "converted"
    if report.between_formats:
        lines.append(final(
            f"{verb} {escape(report.src)} ({doc['from']}) -> {escape(report.dst)} "
            f"({doc['to']}): {plural(len(doc['modules']), 'module')} re-laid out "
            f"(codes, zero points, scales); "
            + (f"{t['changed']} of {plural(t['fields'], 'zero point')} re-encoded "
               f"from gptq's Z - 1, {t['ambiguous']} ambiguous, {t['lossy']} lossy"
               if report.zeros_reencoded else
               f"{plural(t['fields'], 'zero point')} carried exactly"), True))
        if report.gate is not None:
            checks = report.gate.modules
            lines.append(Line(f"verified ({report.backend}): {plural(len(checks), 'module')} "
                              f"equal in codes, zero points, scales and g_idx with Y = X @ W "
                              f"bitwise; {report.gate.bytes_compared} bytes of other tensors "
                              "identical"))
        return lines
    where = (f"{escape(report.src)} in place ({doc['from']} -> {doc['to']})" if report.in_place
             else f"{escape(report.src)} ({doc['from']}) -> {escape(report.dst)} ({doc['to']})")
    lines.append(final(f"{verb} {where}: {plural(len(doc['modules']), 'module')}, "
                       f"{t['changed']} of {plural(t['fields'], 'zero-point field')} changed, "
                       f"{t['ambiguous']} ambiguous, {t['lossy']} lossy", True))
    if t["changed"] == 0 and not report.dry_run:
        lines.append(Line("no zero point changed (already in the target convention); configs "
                          "normalised"))
    if report.gate is not None:
        checks = report.gate.modules
        lossy = sum(1 for c in checks if c.lossy_cells)
        what = (f"{report.gate.bytes_compared} bytes rewritten (qzeros ranges and configs) and "
                "read back as proven" if report.in_place else
                f"{report.gate.bytes_compared} bytes outside qzeros identical")
        lines.append(Line(
            f"verified ({report.backend}): {what}, "
            f"{plural(len(checks) - lossy, 'module')} bitwise equal"
            + (f", {lossy} lossy as reported (max relative output error "
               f"{max(c.rel_err for c in checks):.3g})" if lossy else "")))
    return lines


def fix_label_lines(result: RelabelResult) -> list[Line]:
    p = result.plan
    lines = findings_lines(p.findings)
    det = p.detection
    if p.refused:
        return lines + [final(f"FAIL: nothing written to {escape(str(p.path))} (detected "
                              f"{det.verdict})", False)]
    verb = "would set" if result.dry_run else "set"
    for c in p.changes:
        old = "missing" if c.old is None else repr(c.old)
        if c.new is None:   # a key GPTQModel refuses by name (is_marlin_format: false)
            lines.append(Line(f"{escape(c.file)}: {'would remove' if result.dry_run else 'remove'}"
                              f" {c.key} ({escape(c.old or '')}; GPTQModel 6.0 and later refuse "
                              "the key)"))
            continue
        lines.append(Line(f"{escape(c.file)}: {verb} {c.key} {escape(old)} -> {c.new!r}"))
    head = f"label {p.target} (detected {det.verdict}, confidence {det.confidence:.4f})"
    if not p.changes:
        lines.append(final(f"{head}: every config already says so; nothing written", True))
    elif result.dry_run:
        lines.append(final(f"{head}: {plural(len(p.files), 'file')} would change; nothing "
                           "written (--dry-run)", True))
    else:
        lines.append(final(f"{head}: rewrote {', '.join(escape(f) for f in result.written)}",
                           True))
    if result.verify is not None:
        lines += verify_lines(result.verify, False)
    return lines


def doctor_lines(d: Diagnosis) -> list[Line]:
    """The answer first, its reason second, then the plan (or why there is none), --fix's
    steps and the answer after them, and one final line."""
    lines = [Line(escape(d.headline)), Line(f"why: {escape(d.reason)}")]
    lines += [Line(f"note: {escape(n)}") for n in d.notes]
    lines += findings_lines(d.blocking)
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
        if f.after is not None:
            lines.append(Line(f"  after: {escape(f.after.headline)}"))
        elif not f.ran:
            lines.append(Line("  nothing to run: no plan"))
    who = d.runtime.id + (f"@{'.'.join(map(str, d.version))}" if d.version else "")
    steps = len(p.steps)
    if f is not None:
        tail = (f"OK: {who}: fixed, {escape(f.output)} computes the right weights" if d.ok
                else f"FAIL: {who}: not fixed")
    elif d.ok:
        tail = f"OK: {who}: {d.modules} modules, right weights"
    else:
        tail = (f"FAIL: {who}: {d.answer}; " + (
            f"plan: {plural(steps, 'step')} (--fix DST"
            + (" or --fix --in-place" if in_place_possible(p) else "") + " runs it)" if steps
            else "no plan"))
    lines.append(final(tail, d.ok))
    return lines


def failure_lines(findings: list[Finding]) -> list[Line]:
    lines = findings_lines(findings)  # each with its hint: the next step, as in JSON
    if findings:
        lines.append(final(f"FAIL: stopped by {plural(len(findings), 'finding')}", False))
    return lines


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


def runtime_lines(verdicts: list[dict]) -> list[Line]:
    """The runtimes section: one row per runtime (the path it takes on the default device),
    then why, for each runtime that does not load it or decode it right, and each other path
    (another GPU, an option) that would end otherwise. A runtime that fails is coloured as a
    warning: verify makes it an error only under --runtime, as a finding of its own."""
    if not verdicts:
        return []
    cells = [[v["id"], v["versions"], "yes" if v["loads"] else "NO", v["kernel"] or "-",
              v["convention_read"] or "-", _decodes(v), _affected(v)] for v in verdicts]
    table_lines = table(cells, ["runtime", "versions", "loads", "kernel", "reads", "decodes",
                                "affected"])
    lines = [Line("runtimes     (on an NVIDIA GPU of compute capability 8.0)"),
             Line("  " + table_lines[0])]
    for v, text in zip(verdicts, table_lines[1:]):
        bad = not v["loads"] or v["decodes_correctly"] is False
        lines.append(Line("  " + text, "text", "warning" if bad else None))
    for v in verdicts:
        if not v["loads"] or v["decodes_correctly"] is not True:
            lines.append(Line(f"  {v['id']}: " + escape("; ".join(v["reasons"]))))
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
