"""Declared convention against detected: the findings both inspect and verify report."""
from __future__ import annotations

from ..bits.conventions import GPTQ, GPTQ_V2
from ..detection.decide import AMBIGUOUS
from ..detection.pool import Detection
from ..findings import Finding
from ..formats.gptq.checkpoint import Checkpoint


def convention_findings(ckpt: Checkpoint, det: Detection) -> list[Finding]:
    """GQ401, GQ402, GQ404: the label the runtimes read against what the data are."""
    cfg = ckpt.config
    where = cfg.declared_in[0].file if cfg and cfg.declared_in else (
        cfg.sources[0] if cfg and cfg.sources else None)
    declared = ckpt.label
    out: list[Finding] = []
    if not det.modules:
        return out  # nothing to detect from (GQ314 or geometry findings say why)
    if det.verdict == AMBIGUOUS:
        if any(e.endswith("modules disagree") for e in det.evidence):
            mix = {c: [v.name for v in det.modules if v.verdict == c] for c in (GPTQ, GPTQ_V2)}
            out.append(Finding("GQ404", f"{len(mix[GPTQ])} modules read as gptq (e.g. "
                               f"{mix[GPTQ][0]}), {len(mix[GPTQ_V2])} as gptq_v2 (e.g. "
                               f"{mix[GPTQ_V2][0]}); one label cannot be right for both",
                               file=where))
        else:
            out.append(Finding("GQ402", "the data do not decide between gptq and gptq_v2: "
                               + "; ".join(det.evidence), file=where))
    elif det.verdict != declared:
        label = (f"declares {declared}" if cfg and cfg.convention == declared else
                 "declares no usable checkpoint_format, so runtimes read gptq")
        out.append(Finding(
            "GQ401", f"config {label}, but the data are {det.verdict} (confidence "
            f"{det.confidence:.4f}); every zero point will be read off by one",
            file=where, hint=f"set checkpoint_format (and format) to \"{det.verdict}\", or "
            f"convert the data with `gptqfmt convert --from {det.verdict}`",
            details={"declared": declared, "detected": det.verdict,
                     "confidence": det.confidence}))
    return out
