"""`gptqfmt inspect PATH`: what is in a checkpoint."""
from __future__ import annotations

import click

from ..inspection import InspectResult, inspect_checkpoint, inspect_json
from .boundary import guarded
from .output import emit_json, escape, finding_line, human_bytes, plural, table


@click.command("inspect", short_help="What is in a checkpoint: modules, bits, group size, and the "
                                       "declared and detected zero-point convention.")
@click.argument("path", type=click.Path(exists=False, dir_okay=True, file_okay=True))
@guarded
def inspect_cmd(path, fmt):
    """Show layers, bits, group size, sym, act-order, word size and the declared and detected
    zero-point convention of the checkpoint at PATH (a directory or one .safetensors file).

    Exit 0 when nothing is wrong, 1 when findings of severity error exist, 2 when PATH cannot be
    read."""
    result = inspect_checkpoint(path)
    doc = inspect_json(result)
    if fmt == "json":
        emit_json(doc)
    else:
        for line in render_text(result, doc):
            click.echo(line)
    return 0 if result.ok else 1


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


def render_text(result: InspectResult, doc: dict) -> list[str]:
    cf, q = doc["checkpoint_format"], doc["quantization"]
    size = sum(f["size"] for f in doc["files"])
    n_files = len(doc["files"])
    lines = [f"checkpoint   {escape(doc['path'])}",
             f"files        {n_files} {'shards' if doc['sharded'] else 'file' + ('s' if n_files > 1 else '')}"
             f", {human_bytes(size)}, config from "
             f"{', '.join(doc['config_sources']) or 'nothing (no config file)'}"]
    declared = cf["declared"] or "none (runtimes read gptq)"
    lines.append(f"declared     {declared}{_where(cf['declared_in'])}")
    lines.append(f"detected     {cf['detected']} (confidence {cf['confidence']:.2f}; "
                 f"{escape('; '.join(cf['evidence']))})")
    lines.append(f"quantization bits={q['bits']} group_size={q['group_size']} sym={_yn(q['sym'])} "
                 f"desc_act={_yn(q['desc_act'])} pack_dtype={q['pack_dtype']}"
                 + (" (mixed per module)" if q["mixed"] else ""))
    mods = doc["modules"]
    lines.append(f"modules      {len(mods)} quantized, "
                 f"{plural(doc['other_tensors']['count'], 'other tensor')} "
                 f"({human_bytes(doc['other_tensors']['bytes'])})")
    if mods:
        rows = [[escape(m["name"]), m["bits"] or "?", m["group_size"] or "?", _yn(m["desc_act"]),
                 f"{m['in_features']}x{m['out_features']}" if m["in_features"] else "?",
                 m["pack_dtype"] or "?", m["scale_dtype"] or "?",
                 (m["zero_point"] or {}).get("verdict", "-")] for m in mods]
        lines += ["  " + r for r in table(rows, ["module", "bits", "group", "act", "KxN", "pack",
                                                 "scales", "zeros"])]
    findings = result.findings
    if findings:
        lines.append(f"findings     {len(findings)}")
        lines += ["  " + finding_line(f) for f in findings]
    s = doc["summary"]
    lines.append(f"{doc['status']}: {plural(s['errors'], 'error')}, "
                 f"{plural(s['warnings'], 'warning')}, {plural(s['infos'], 'info')}")
    return lines
