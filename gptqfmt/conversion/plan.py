"""convert's decisions before anything is written, for every kind of convert (into a copy, in
place, between formats): which convention or format the source is in, whether the input may be
converted at all, what changes in each module, and the findings that refuse or report it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..bits.conventions import CONVENTIONS, GPTQ_V2, field_changes, lossy_mask
from ..bits.layout import stored_fields
from ..bits.packing import maxq as code_max
from ..checks.modules import module_findings
from ..detection.decide import AMBIGUOUS
from ..detection.pool import Detection
from ..detection.read import detect_checkpoint
from ..errors import FindingError, UsageError
from ..findings import ERROR, Finding
from ..formats import WRITERS, Source
from ..formats.configs import fix_label_command
from ..formats.gptq.checkpoint import Checkpoint, Module
from ..ops.reports import CHECK, DETECT, PLAN, Progress, rounds, start
from ..runtimes.groups import maxq_readings
from .configs import declaring_configs, derive_config
from .reformat import name_clashes, no_form

# Findings a conversion resolves (it writes both keys); every other error blocks it.
RESOLVED_BY_CONVERT = {"GQ204", "GQ209"}
# Findings that a conversion into the source's own format resolves, by writing it again as its
# writer writes it: compressed-tensors' padded layout of 0.17 and older (GQ320) re-packed dense
REWRITTEN_BY_CONVERT = {"GQ320"}


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

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Plan:
    """What a conversion of `source` (read in `from_`) into `to` will write."""
    source: Source
    from_: str                        # the source's format, or GPTQ convention
    to: str
    modules: list[ModulePlan]
    detection: Detection | None       # None: a format whose zero points are stored exactly
    findings: list[Finding] = field(default_factory=list)
    derived: dict[str, Any] | None = None   # the config for a GPTQ source without one
    # --from was trusted over data that contradict it: the output's data are read again
    trusted: bool = False

    @property
    def relayout(self) -> bool:
        return relayout(self.from_, self.to)


def relayout(from_: str, to: str) -> bool:
    """Whether converting `from_` into `to` re-lays the tensors out (between formats), not only
    moves the zero points between GPTQ's conventions."""
    return not (from_ in CONVENTIONS and to in CONVENTIONS)


def plan_conversion(src: Source, requested: str, to: str, allow_lossy: bool,
                    jobs: int = 1, trust_from: bool = False,
                    detection: Detection | None = None,
                    progress: Progress | None = None, full: bool = True) -> Plan:
    """The Plan of converting `src` (opened; `requested`: --from, or auto) into `to`, with the
    refusals raised (FindingError, exit 1; UsageError for a --from, --to or --jobs that does
    not apply). A labelled source is checked, its convention resolved and its zero points
    planned field by field into `to` (into gptq_v2, the one model, where the tensors are
    re-laid out); a source that stores Z itself is checked and carried exactly.
    `trust_from`: a --from the data contradict is converted as asked (GQ413) instead of
    refused (GQ422). `detection`: the source's, where the caller has it (doctor: verify's),
    else detected here. `progress` hears of the phases (reports.Progress): DETECT, CHECK and
    PLAN, each module by module. `full` False: the modules checked on inspect's reads
    (checks.modules.module_findings), as doctor --remote judges them."""
    ck = src.labelled
    if ck is not None and requested not in CONVENTIONS + ("auto",):
        raise UsageError(f"{src.path}: a GPTQ checkpoint, not --from {requested}")
    if jobs > 1 and (ck is None or to not in CONVENTIONS):
        raise UsageError("--jobs applies between gptq and gptq_v2; between formats the "
                         "shards are written one at a time, each tensor's re-layout on "
                         "every CPU already")
    det = None
    if ck is None:
        _check_exact_target(src, requested, to)
        refuse_invalid(src, None, progress, full)
        from_, notes = src.format, list[Finding]()
        plans = [ModulePlan(m.name, m.bits, m.groups * m.out_features, 0, 0, 0, [])
                 for m in src.modules]
        findings: list[Finding] = []
    else:
        det = detection or detect_checkpoint(ck, full=False,
                                             progress=rounds(progress, DETECT))
        refuse_invalid(src, det, progress, full)
        notes = list[Finding]()
        from_ = resolve_from(requested, ck, det, notes, trust_from)
        plans, findings = plan_zeros(ck, det, from_, to if to in CONVENTIONS else GPTQ_V2,
                                     allow_lossy, progress)
        src = src.read_as(from_, allow_lossy)
    found = notes + findings
    derived = None
    if from_ in CONVENTIONS and to in CONVENTIONS:
        if ck is not None and not declaring_configs(src.root):  # the output must say what it is
            derived, about = derive_config(ck, from_, to)
            found += about
    else:
        writer = WRITERS[to]
        found += no_form(src, writer) + name_clashes(src, writer)
    refusals = [f for f in found if f.severity == ERROR]
    if refusals:
        raise FindingError(*refusals)
    trusted = trust_from and det is not None and det.verdict not in (AMBIGUOUS, from_)
    return Plan(src, from_, to, plans, det, found, derived, trusted)


def _check_exact_target(src: Source, requested: str, to: str) -> None:
    """The --from and --to a source that stores Z itself takes (UsageError otherwise): its
    own format only where writing it again changes what runtimes read (REWRITTEN_BY_CONVERT)."""
    if requested not in ("auto", src.format):
        raise UsageError(f"{src.path}: a {src.format} checkpoint "
                         f"({src.declared_by or 'from its tensors'}), not --from {requested}")
    if to == src.format and not any(f.code in REWRITTEN_BY_CONVERT for f in src.findings):
        raise UsageError(f"{src.path} is already {src.format}")
    if to not in WRITERS:
        raise UsageError(f"{src.format} converts to gptq_v2 (--to gptq_v2), where every zero "
                         "point is stored exactly; convert that to gptq afterwards if you "
                         "need v1 (it reports what v1 cannot hold)")


def resolve_from(requested: str, ckpt: Checkpoint, det: Detection,
                 findings: list[Finding] | None = None, trust: bool = False) -> str:
    """The convention the source is converted from: --from where given (refused, GQ422, when
    the data confidently say another, unless `trust`: then GQ413 in `findings`), else the
    label (refused, GQ408, when the data contradict it)."""
    declared = ckpt.label
    if requested != "auto":
        if det.verdict not in (AMBIGUOUS, requested):
            said = (f"--from {requested}, but the data are {det.verdict} (confidence "
                    f"{det.confidence:.4f})")
            if not trust:
                raise FindingError(Finding(
                    "GQ422", f"{said}: reading them as {requested} would write every zero "
                    "point off by one; nothing written",
                    hint=f"drop --from (the data decide: {det.verdict}), or add --trust-from "
                         f"if you know they are {requested}"))
            if findings is not None:
                findings.append(Finding("GQ413", f"{said}; converting as asked (--trust-from): "
                                        "the output is read again before it is kept",
                                        hint="check the source"))
        return requested
    if det.verdict not in (AMBIGUOUS, declared):
        where = ckpt.config.declared_in[0].file if ckpt.config and ckpt.config.declared_in \
            else None
        raise FindingError(Finding(
            "GQ408", f"the config says {declared} but the data are {det.verdict} (confidence "
            f"{det.confidence:.4f}); not converting on a contradicted label", file=where,
            hint=f"the label is wrong: `{fix_label_command(ckpt.path)}` sets "
                 f"it to {det.verdict} (then convert again), or run again with --from "
                 f"{det.verdict}"))
    return declared


def plan_zeros(ckpt: Checkpoint, det: Detection, src: str, dst: str, allow_lossy: bool,
               progress: Progress | None = None) -> tuple[list[ModulePlan], list[Finding]]:
    """Count what changes per module; refusal findings where the target cannot hold a field."""
    verdicts = {v.name: v for v in det.modules}
    plans, findings = [], []
    advance = start(progress, PLAN, len(ckpt.valid_modules))
    for m in ckpt.valid_modules:
        qz = m.tensors["qzeros"]
        c = field_changes(ckpt.view(qz), m.bits, src, dst, allow_lossy=True)
        v = verdicts.get(m.name)
        sigs = v.signatures if v else []
        lossy = c.lossy + (c.ambiguous if allow_lossy else 0)  # written, and some runtime reads
        # the fields themselves only where some are lossy (clean modules move word by word)
        lossy_at = lossy_mask(stored_fields(ckpt.view(qz), m.bits), m.bits, src, dst) \
            if c.ambiguous or c.lossy else None
        # a stored maxq read as 2^bits moves a weight by 2^bits scale steps; a Z of 0 written
        # as 1, by one
        change = 0.0 if lossy_at is None else \
            (1 << m.bits if c.ambiguous else 1) * _max_scale(ckpt, m, lossy_at)
        plans.append(ModulePlan(m.name, m.bits, c.fields, c.changed, c.ambiguous, lossy, sigs,
                                change))
        ckpt.store.release([qz])
        advance(1)
        file = ckpt.store.file_of(qz)
        if c.ambiguous:
            unrecoverable = (" Neighbouring fields are corrupted too (" + ", ".join(sigs) +
                             "): their true zero points cannot be recovered." if sigs else "")
            findings.append(Finding(
                "GQ411" if allow_lossy else "GQ409",
                f"{c.ambiguous} of {c.fields} fields store {code_max(m.bits)}: "
                + maxq_readings(m.bits)
                + (". Written as Z = 0 (the wrap reading)" if allow_lossy else "")
                + f".{unrecoverable}", file=file, tensor=qz,
                hint=None if allow_lossy else "--allow-lossy writes Z = 0 for them",
                details={"fields": c.ambiguous, "signatures": sigs}))
        if c.lossy and lossy_at is not None:
            findings.append(Finding(
                "GQ411" if allow_lossy else "GQ410",
                f"{c.lossy} of {c.fields} zero points are 0 "
                f"({int(lossy_at.any(axis=1).sum())} of {m.groups} groups): gptq stores "
                f"them as 0, read as Z = 1, moving each weight of those groups by one scale "
                f"step (up to {change:.4g})", file=file, tensor=qz,
                hint=None if allow_lossy else "--allow-lossy writes Z = 1 for them",
                details={"fields": c.lossy, "max_weight_change": change}))
    return plans, findings


def _max_scale(ckpt: Checkpoint, m: Module, mask: np.ndarray) -> float:
    return float(np.abs(ckpt.float32(m.tensors["scales"])[mask]).max(initial=0.0))


def refuse_invalid(src: Source, det: Detection | None,
                   progress: Progress | None = None, full: bool = True) -> None:
    """Raise FindingError for input that verify would reject on its cheap checks: container,
    index, config and shape errors, then every module's (scales, zero points and writer
    corruption: --allow-lossy does not pass a GQ405, whose overwritten fields hold no zero
    point to convert, and written as Z = 0 they would pass verify in the output)."""
    blocking = [f for f in src.findings if f.severity == ERROR
                and f.code not in RESOLVED_BY_CONVERT]
    if blocking:
        raise FindingError(*blocking)
    verdicts = {v.name: v for v in det.modules} if det is not None else None
    modules = [m for m in src.modules if verdicts is None or m.name in verdicts]
    advance = start(progress, CHECK, len(modules))
    for m in modules:
        verdict = None if verdicts is None else verdicts[m.name]
        blocking += [f for f in module_findings(src, m, verdict, full)
                     if f.severity == ERROR]
        src.store.release(m.tensors.values())
        advance(1)
    if blocking:
        raise FindingError(*blocking)
