"""`verify`: every check over all the data, collected into one Report (findings are data).

The per-module rules live once, in gptq/checks.py. inspect runs those its bounded reads can feed
(zero_point_findings on its sampled verdicts, declared_findings); verify runs them all, on
verdicts from every row, plus scale_findings. So inspect may see less than verify, never
something else."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from .errors import UsageError
from .findings import Finding
from .formats import GPTQ, open_source, sniff
from .formats import checks as format_checks
from .safetensors_io.index import open_store
from .gptq.checkpoint import Checkpoint, Module, open_checkpoint
from .gptq.checks import module_findings
from .gptq.detect import Detection, ModuleVerdict, combine
from .gptq.evidence import module_verdict
from .parallel import cpus
from .gptq.labels import convention_findings, effective_declared
from .reports import checkpoint_format_json, failed, summary_counts, tool_json
from .verdicts import RuntimeVerdict, assess, runtime_findings


@dataclass(frozen=True)
class Report:
    path: str
    checkpoint: Checkpoint
    detection: Detection
    findings: list[Finding]
    qweight_bytes: int
    runtimes: list[RuntimeVerdict]
    checksums: Any = None    # hub.Checksums, with verify --checksums

    def failed(self, strict: bool = False) -> bool:
        return failed(self.findings, strict)

    def to_json(self, strict: bool = False) -> dict[str, Any]:
        cfg = self.checkpoint.config
        det = self.detection
        return {
            "tool": tool_json(),
            "path": self.path,
            "status": "fail" if self.failed(strict) else "ok",
            "strict": strict,
            "checkpoint_format": checkpoint_format_json(cfg, det,
                                                        effective_declared(self.checkpoint)),
            "modules": [v.to_json() for v in det.modules],
            "runtimes": [v.to_json() for v in self.runtimes],
            "findings": [f.to_json() for f in self.findings],
            "summary": {**summary_counts(self.findings, len(self.checkpoint.modules)),
                        "qweight_bytes": self.qweight_bytes},
            **({"checksums": self.checksums.to_json()} if self.checksums else {}),
        }


@dataclass(frozen=True)
class FormatReport:
    """verify of a compressed-tensors or AWQ checkpoint (formats/checks.py)."""
    path: str
    source: Any
    findings: list[Finding]
    qweight_bytes: int
    checksums: Any = None    # hub.Checksums, with verify --checksums

    def failed(self, strict: bool = False) -> bool:
        return failed(self.findings, strict)

    def to_json(self, strict: bool = False) -> dict[str, Any]:
        return {"tool": tool_json(), "path": self.path,
                "status": "fail" if self.failed(strict) else "ok", "strict": strict,
                "format": self.source.format,
                "findings": [f.to_json() for f in self.findings],
                "summary": {**summary_counts(self.findings, len(self.source.modules)),
                            "qweight_bytes": self.qweight_bytes},
                **({"checksums": self.checksums.to_json()} if self.checksums else {})}


def with_checksums(report, cs):
    """The report with verify --checksums' findings among its own, in the usual order."""
    return replace(report, checksums=cs,
                   findings=sorted(report.findings + cs.findings, key=Finding.sort_key))


@dataclass(frozen=True)
class ConfigCheck:
    """What a commit hook can afford (gptqfmt-pre-commit): the configs, the index and the
    safetensors headers checked against each other; no tensor data beyond g_idx."""
    path: str
    modules: int
    findings: list[Finding]

    def failed(self, strict: bool = False) -> bool:
        return failed(self.findings, strict)


def check_configs(path: str | os.PathLike) -> ConfigCheck:
    """The findings of opening the checkpoint at `path` (the container, index, config and
    shape rules, GQ1xx-GQ3xx), without verify's reading of qweight, qzeros and scales."""
    store = open_store(path)
    sniffed = sniff(store)
    if sniffed.format != GPTQ:
        src = open_source(path, sniffed, store)
        return ConfigCheck(str(path), len(src.modules),
                           sorted(src.findings, key=Finding.sort_key))
    ckpt = open_checkpoint(path, store)
    return ConfigCheck(str(path), len(ckpt.modules), list(ckpt.findings))


def validate_format(path, store, sniffed, progress=None) -> FormatReport:
    """Every check of a compressed-tensors or AWQ checkpoint, one module at a time."""
    src = open_source(path, sniffed, store)
    findings = list(src.findings)
    codes = {m.name: src.store.info(m.tensors["qweight"]).nbytes
             for m in src.modules}
    total = sum(codes.values())
    progress and progress(0, total)
    for m in src.modules:
        findings += format_checks.module_findings(src, m)
        progress and progress(codes[m.name], total)
    findings.sort(key=Finding.sort_key)
    return FormatReport(str(path), src, findings, total)


def validate(path: str | os.PathLike, progress=None, jobs: int | None = None,
             gate: tuple[str, ...] = ()) -> Report | FormatReport:
    """Run every check on the checkpoint at `path`, reading all of its quantized data.

    Modules are checked in `jobs` threads (default: one per CPU this process may use; verify's
    work is large numpy loops over qweight, which release the GIL). `progress(nbytes, total_bytes)` is called after each module with its qweight
    bytes (first with 0, so a progress bar knows its total). `gate`: runtime ids (runtimes.BY_ID)
    whose refusal or wrong decoding is a finding (verify --runtime: GQ601-GQ607).

    A compressed-tensors or AWQ checkpoint gets its format's checks (validate_format): the
    runtime table describes GPTQ checkpoints, so `gate` is refused there."""
    store = open_store(path)
    sniffed = sniff(store)
    if sniffed.format != GPTQ:
        if gate:
            store.close()
            raise UsageError(f"{path}: a {sniffed.format} checkpoint; --runtime judges GPTQ "
                             "checkpoints (the runtime table covers their kernels)")
        return validate_format(path, store, sniffed, progress)
    ckpt = open_checkpoint(path, store)
    findings = list(ckpt.findings)
    modules = [m for m in ckpt.modules if m.valid]
    total = sum(ckpt.store.info(m.tensors["qweight"]).nbytes for m in modules)
    if progress:
        progress(0, total)

    def evidence(m: Module) -> ModuleVerdict:
        v = module_verdict(ckpt, m, full=True)
        ckpt.store.release(m.tensors.values())  # resident memory: one module at a time
        return v

    def check(mv: tuple[Module, ModuleVerdict]) -> list[Finding]:
        m, v = mv
        found = module_findings(ckpt, m, v)
        ckpt.store.release(m.tensors.values())
        return found

    verdicts = []
    with ThreadPoolExecutor(max_workers=jobs or cpus()) as pool:
        for m, v in zip(modules, pool.map(evidence, modules)):
            verdicts.append(v)
            if progress:
                progress(ckpt.store.info(m.tensors["qweight"]).nbytes, total)
        # the findings read each module's verdict in the light of all of them (pooled evidence,
        # misfits against the module count): qzeros and scales only, small beside qweight
        det = combine(verdicts)
        for found in pool.map(check, zip(modules, det.modules)):
            findings += found
    findings += convention_findings(ckpt, det)
    verdicts = assess(ckpt, det, scales=True)
    if gate:
        where = ckpt.config.sources[0] if ckpt.config and ckpt.config.sources else None
        findings += runtime_findings([v for v in verdicts if v.runtime.id in gate], where)
    findings.sort(key=Finding.sort_key)
    return Report(str(path), ckpt, det, findings, total, verdicts)
