"""`inspect`: what a checkpoint holds, as one result object for the text and JSON reporters.

Its findings come from verify's own rules (gptq/checks.py) fed with what inspect reads: every
header, config, g_idx and qzeros, and a sample of qweight rows. Whatever it finds, verify finds with the
same code and severity; verify may find more (scales, and evidence from the unsampled rows)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .findings import Finding
from .formats import GPTQ, open_source, sniff
from .formats import checks as format_checks
from .safetensors_io.index import open_store
from .gptq.checkpoint import Checkpoint, Module, open_checkpoint
from .gptq.checks import declared_findings, zero_point_findings
from .gptq.detect import Detection
from .gptq.evidence import detect_checkpoint
from .gptq.labels import convention_findings
from .reports import checkpoint_format_json, failed, files_json, summary_counts, tool_json
from .verdicts import RuntimeVerdict, assess


@dataclass(frozen=True)
class InspectResult:
    checkpoint: Checkpoint
    detection: Detection
    findings: list[Finding]
    runtimes: list[RuntimeVerdict]

    @property
    def ok(self) -> bool:
        return not failed(self.findings)

    def to_json(self) -> dict[str, Any]:
        return inspect_json(self)


@dataclass(frozen=True)
class FormatInspectResult:
    """inspect of a compressed-tensors or AWQ checkpoint (formats/checks.py)."""
    path: str
    source: Any
    findings: list[Finding]

    @property
    def ok(self) -> bool:
        return not failed(self.findings)

    def to_json(self) -> dict[str, Any]:
        src = self.source
        st = src.store
        others = src.passthrough
        return {
            "tool": tool_json(), "path": self.path,
            "status": "ok" if self.ok else "fail", "format": src.format,
            "files": files_json(st),
            "sharded": st.index_name is not None, "config_sources": src.config_files,
            "quantization": format_checks.summary(src),
            "modules": [format_checks.module_json(src, m) for m in src.modules],
            "other_tensors": {"count": len(others),
                              "bytes": sum(st.info(t).nbytes for t in others),
                              "names": others},
            "findings": [f.to_json() for f in self.findings],
            "summary": summary_counts(self.findings, len(src.modules)),
        }


def inspect_checkpoint(path: str | os.PathLike) -> InspectResult | FormatInspectResult:
    """Model the checkpoint at `path` and detect its convention from bounded reads (every
    qzeros, a sample of qweight rows). A compressed-tensors or AWQ checkpoint gets its
    format's checks instead (its zero points are stored exactly: nothing to detect)."""
    store = open_store(path)
    sniffed = sniff(store)
    if sniffed.format != GPTQ:
        src = open_source(path, sniffed, store)
        findings = list(src.findings)
        for m in src.modules:
            findings += format_checks.data_findings(src, m, full=False)
        return FormatInspectResult(str(path), src, sorted(findings, key=Finding.sort_key))
    ckpt = open_checkpoint(path, store)
    det = detect_checkpoint(ckpt, full=False)
    findings = ckpt.findings + convention_findings(ckpt, det)
    verdicts = {v.name: v for v in det.modules}
    for m in ckpt.modules:
        if m.name in verdicts:  # the valid modules, as in verify
            findings += zero_point_findings(ckpt, m, verdicts[m.name], settled_only=True)
            findings += declared_findings(ckpt, m)
            ckpt.store.release(m.tensors.values())
    # what each runtime makes of it: counts from qzeros only (no scales: inspect's reads stay
    # bounded, so the largest weight change is verify's)
    verdicts = assess(ckpt, det, scales=False)
    return InspectResult(ckpt, det, sorted(findings, key=Finding.sort_key), verdicts)


def quantization_summary(ckpt: Checkpoint) -> dict[str, Any]:
    """Declared base values, falling back to the value every module's shapes agree on."""
    base = ckpt.config.base if ckpt.config else None
    mods = [m for m in ckpt.modules if m.valid]

    def uniform(attr):
        vals = {getattr(m, attr) for m in mods}
        return vals.pop() if len(vals) == 1 else None

    def pick(declared, inferred):
        return declared if declared is not None else inferred

    return {
        "bits": pick(base and base.bits, uniform("bits")),
        "group_size": pick(base and base.group_size, uniform("group_size")),
        "sym": base.sym if base else None,
        "desc_act": pick(base and base.desc_act, uniform("act_order")),
        "pack_dtype": pick(base and base.pack_dtype, uniform("pack_dtype")),
        "lm_head": any(m.name.split(".")[-1] == "lm_head" for m in mods),
        "static_groups": bool(ckpt.config and ckpt.config.static_groups),
        "mixed": any(len({getattr(m, a) for m in mods}) > 1
                     for a in ("bits", "group_size", "act_order", "word_bits")),
    }


def module_json(m: Module, ckpt: Checkpoint, verdict) -> dict[str, Any]:
    files = sorted({ckpt.store.file_of(t) for t in m.tensors.values()})
    return {
        "name": m.name, "bits": m.bits, "group_size": m.group_size, "desc_act": m.act_order,
        "sym": m.declared.sym if m.declared else None,
        "in_features": m.in_features, "out_features": m.out_features,
        "pack_dtype": m.pack_dtype, "groups": m.groups, "scale_dtype": m.scale_dtype,
        "has_g_idx": "g_idx" in m.tensors, "has_bias": "bias" in m.tensors,
        "excluded_by_config": m.declared is None, "valid": m.valid, "files": files,
        "zero_point": ({"verdict": verdict.verdict, "confidence": verdict.confidence,
                        "evidence": verdict.evidence, "signatures": verdict.signatures}
                       if verdict else None),
    }


def inspect_json(r: InspectResult) -> dict[str, Any]:
    ckpt, det = r.checkpoint, r.detection
    cfg = ckpt.config
    by_name = {v.name: v for v in det.modules}
    return {
        "tool": tool_json(),
        "path": str(ckpt.path),
        "status": "ok" if r.ok else "fail",
        "files": files_json(ckpt.store),
        "sharded": ckpt.store.index_name is not None,
        "config_sources": cfg.sources if cfg else [],
        "checkpoint_format": checkpoint_format_json(cfg, det),
        "quantization": quantization_summary(ckpt),
        "modules": [module_json(m, ckpt, by_name.get(m.name)) for m in ckpt.modules],
        "other_tensors": {"count": len(ckpt.other_tensors),
                          "bytes": sum(ckpt.store.info(t).nbytes for t in ckpt.other_tensors),
                          "names": ckpt.other_tensors},
        "runtimes": [v.to_json() for v in r.runtimes],
        "findings": [f.to_json() for f in r.findings],
        "summary": summary_counts(r.findings, len(ckpt.modules)),
    }

