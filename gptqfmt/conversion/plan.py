"""convert's decisions before anything is written: which convention the source is in, whether
the input may be converted at all, and what changes in each module (with the findings that
refuse or report a lossy conversion)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import runtimes
from ..conventions import convert_words, lossy_mask
from ..errors import FindingError
from ..findings import ERROR, Finding
from ..gptq.checkpoint import Checkpoint, open_checkpoint
from ..gptq.checks import module_findings
from ..gptq.detect import AMBIGUOUS, Detection, stored_fields
from ..gptq.evidence import detect_checkpoint
from ..gptq.labels import effective_declared
from ..gptq.packing import maxq as code_max

# Findings a conversion resolves (it writes both keys); every other error blocks it.
RESOLVED_BY_CONVERT = {"GQ204", "GQ209"}


@dataclass(frozen=True)
class ModulePlan:
    name: str
    bits: int
    fields: int
    changed: int
    ambiguous: int
    lossy: int
    signatures: list[str]
    max_weight_change: float = 0.0     # one scale step (or 2^bits steps) of the lossy cells

    def to_json(self):
        return dict(self.__dict__)


def resolve_from(requested: str, ckpt: Checkpoint, det: Detection,
                 findings: list[Finding] | None = None) -> str:
    declared = effective_declared(ckpt)
    if requested != "auto":
        if det.verdict not in (AMBIGUOUS, requested) and findings is not None:
            findings.append(Finding(
                "GQ413", f"--from {requested}, but the data are {det.verdict} (confidence "
                f"{det.confidence:.4f}); converting as asked", hint="check the source"))
        return requested
    if det.verdict not in (AMBIGUOUS, declared):
        where = ckpt.config.declared_in[0].file if ckpt.config and ckpt.config.declared_in \
            else None
        raise FindingError(Finding(
            "GQ408", f"the config says {declared} but the data are {det.verdict} (confidence "
            f"{det.confidence:.4f}); not converting on a contradicted label", file=where,
            hint=f"if the data are right, run again with --from {det.verdict}"))
    return declared


def plan(ckpt: Checkpoint, det: Detection, src: str, dst: str,
         allow_lossy: bool) -> tuple[list[ModulePlan], list[Finding]]:
    """Count what changes per module; refusal findings where the target cannot hold a field."""
    verdicts = {v.name: v for v in det.modules}
    plans, findings = [], []
    for m in ckpt.modules:
        qz = m.tensors["qzeros"]
        _, c = convert_words(ckpt.view(qz), m.bits, src, dst, allow_lossy=True)
        v = verdicts.get(m.name)
        sigs = v.signatures if v else []
        lossy = c.lossy + (c.ambiguous if allow_lossy else 0)  # written, and some runtime reads
        # the fields themselves only where some are lossy (clean modules move word by word)
        lossy_at = lossy_mask(stored_fields(ckpt.view(qz), m.bits), m.bits, src, dst) \
            if c.ambiguous or c.lossy else None
        # a stored maxq read as 2^bits moves a weight by 2^bits scale steps; a Z of 0 written
        # as 1, by one
        change = 0.0 if not (c.ambiguous or c.lossy) else \
            (1 << m.bits if c.ambiguous else 1) * _max_scale(ckpt, m, lossy_at)
        plans.append(ModulePlan(m.name, m.bits, c.fields, c.changed, c.ambiguous, lossy, sigs,
                                change))
        ckpt.store.release([qz])
        file = ckpt.store.file_of(qz)
        if c.ambiguous:
            unrecoverable = (" Neighbouring fields are corrupted too (" + ", ".join(sigs) +
                             "): their true zero points cannot be recovered." if sigs else "")
            findings.append(Finding(
                "GQ411" if allow_lossy else "GQ409",
                f"{c.ambiguous} of {c.fields} fields store {code_max(m.bits)}: "
                + runtimes.maxq_readings(m.bits)
                + (". Written as Z = 0 (the wrap reading)" if allow_lossy else "")
                + f".{unrecoverable}", file=file, tensor=qz,
                hint=None if allow_lossy else "--allow-lossy writes Z = 0 for them",
                details={"fields": c.ambiguous, "signatures": sigs}))
        if c.lossy:
            findings.append(Finding(
                "GQ411" if allow_lossy else "GQ410",
                f"{c.lossy} of {c.fields} zero points are 0 "
                f"({int(lossy_at.any(axis=1).sum())} of {m.groups} groups): gptq stores "
                f"them as 0, read as Z = 1, moving each weight of those groups by one scale "
                f"step (up to {change:.4g})", file=file, tensor=qz,
                hint=None if allow_lossy else "--allow-lossy writes Z = 1 for them",
                details={"fields": c.lossy, "max_weight_change": change}))
    return plans, findings


def _max_scale(ckpt: Checkpoint, m, mask: np.ndarray) -> float:
    return float(np.abs(ckpt.float32(m.tensors["scales"])[mask]).max(initial=0.0))


def refuse_invalid(ckpt: Checkpoint, det: Detection, allow_lossy: bool) -> None:
    """Raise FindingError for input that verify would reject on its cheap checks: container,
    index, config and shape errors, then scales, zero points and writer corruption (the last
    allowed with --allow-lossy)."""
    blocking = [f for f in ckpt.findings if f.severity == ERROR
                and f.code not in RESOLVED_BY_CONVERT]
    if blocking:
        raise FindingError(*blocking)
    verdicts = {v.name: v for v in det.modules}
    for m in ckpt.modules:
        if m.name in verdicts:
            blocking += [f for f in module_findings(ckpt, m, verdicts[m.name])
                         if f.severity == ERROR and not (allow_lossy and f.code == "GQ405")]
            ckpt.store.release(m.tensors.values())
    if blocking:
        raise FindingError(*blocking)


def open_and_plan(path, requested: str, to: str, allow_lossy: bool):
    """A GPTQ source opened, checked (refuse_invalid), its convention resolved and its zero
    points planned into convention `to`: (checkpoint, detection, convention, plans, findings)
    with the --from notes first. Shared by convert between conventions and between formats."""
    ckpt = open_checkpoint(path)
    try:
        det = detect_checkpoint(ckpt, full=False)
        refuse_invalid(ckpt, det, allow_lossy)
        notes: list[Finding] = []
        from_conv = resolve_from(requested, ckpt, det, notes)
        plans, findings = plan(ckpt, det, from_conv, to, allow_lossy)
    except BaseException:
        ckpt.close()
        raise
    return ckpt, det, from_conv, plans, notes + findings
