"""`verify`: every check over all the data, collected into one Report (findings are data).

The per-module rules live once, in checks/modules.py. inspect runs those its bounded reads can
feed; verify runs them all, on verdicts from every row, plus the scales. So inspect may see
less than verify, never something else."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from ..checks.labels import convention_findings, files_disagree
from ..checks.modules import module_findings
from ..detection.decide import ModuleVerdict
from ..detection.pool import Detection, combine
from ..detection.read import module_verdict
from ..errors import UsageError
from ..findings import Finding
from ..formats import QuantModule, open_source
from ..parallel import bounded_map, cpus
from ..runtimes.verdicts import assess, runtime_findings
from ..safetensors_io.hub import Checksums
from .reports import (
    CHECK,
    RUNTIMES,
    VERIFY,
    Progress,
    Result,
    checkpoint_format_json,
    failed,
    rounds,
    start,
    summary_counts,
    tool_json,
)


@dataclass(frozen=True)
class Report(Result):
    """What verify found (reports.Result), over `qweight_bytes` of codes."""
    qweight_bytes: int
    checksums: Checksums | None = None    # with verify --checksums

    @property
    def module_count(self) -> int:
        return len(self.source.records())

    def failed(self, strict: bool = False) -> bool:
        return failed(self.findings, strict)

    def to_json(self, strict: bool = False) -> dict[str, Any]:
        det, ck = self.detection, self.source.labelled
        doc: dict[str, Any] = {"tool": tool_json(), "path": self.path,
                               "status": "fail" if self.failed(strict) else "ok",
                               "strict": strict}
        if det is None or ck is None:
            doc["format"] = self.source.format
            layout = self.source.quantization().get("pack_layout")
            if layout is not None:   # compressed-tensors: which packing its shapes show
                doc["pack_layout"] = layout
        else:
            doc["checkpoint_format"] = checkpoint_format_json(ck.config, det, ck.label)
            doc["modules"] = [v.to_json() for v in det.modules]
            doc["runtimes"] = [v.to_json() for v in self.runtimes or []]
        doc["findings"] = [f.to_json() for f in self.findings]
        doc["summary"] = {**summary_counts(self.findings, self.module_count),
                          "qweight_bytes": self.qweight_bytes}
        if self.checksums:
            doc["checksums"] = self.checksums.to_json()
        return doc


def with_checksums(report: Report, cs: Checksums) -> Report:
    """The report with verify --checksums' findings among its own, in the usual order."""
    return replace(report, checksums=cs,
                   findings=sorted(report.findings + cs.findings, key=Finding.sort_key))


@dataclass(frozen=True)
class ConfigCheck:
    """What a commit hook can afford (gptqfmt-pre-commit): the configs, the index and the
    safetensors headers checked against each other; no tensor data beyond g_idx."""
    path: str
    module_count: int
    findings: list[Finding]

    def failed(self, strict: bool = False) -> bool:
        return failed(self.findings, strict)


def check_configs(path: str | os.PathLike[str]) -> ConfigCheck:
    """The findings of opening the checkpoint at `path` (the container, index, config and
    shape rules, GQ1xx-GQ3xx), without verify's reading of qweight, qzeros and scales."""
    src = open_source(path)
    try:
        found = src.findings + (files_disagree(src.labelled) if src.labelled else [])
        return ConfigCheck(str(path), len(src.records()), sorted(found, key=Finding.sort_key))
    finally:
        src.close()


def validate(path: str | os.PathLike[str], progress: Progress | None = None,
             jobs: int | None = None, gate: tuple[str, ...] = ()) -> Report:
    """Run every check on the checkpoint at `path`, reading all of its quantized data.

    Modules are checked in `jobs` threads (default: one per CPU this process may use; verify's
    work is large numpy loops over qweight, which release the GIL). `progress` hears of the
    phases (reports.Progress): VERIFY, every qweight row read (a module's qweight bytes as
    it is done), then for a GPTQ checkpoint CHECK, the checks of each module's verdict.
    `gate`: runtime ids (runtimes.BY_ID) whose refusal or wrong decoding is a finding (verify
    --runtime: GQ601-GQ607); refused for a checkpoint the runtime table does not describe (zero
    points stored exactly)."""
    src = open_source(path)
    ck = src.labelled
    if gate and ck is None:
        src.close()
        raise UsageError(f"{path}: a {src.format} checkpoint; --runtime judges GPTQ "
                         "checkpoints (the runtime table covers their kernels)")
    findings = list(src.findings)
    modules = src.modules
    sizes = [src.store.info(m.tensors["qweight"]).nbytes for m in modules]
    total = sum(sizes)

    def evidence(m: QuantModule) -> ModuleVerdict:
        assert ck is not None
        mod = ck.module(m.name)
        v = module_verdict(ck, mod, full=True)
        src.store.release(m.tensors.values())  # resident memory: one module at a time
        return v

    def check(m: QuantModule, v: ModuleVerdict | None) -> list[Finding]:
        found = module_findings(src, m, v)
        src.store.release(m.tensors.values())
        return found

    det: Detection | None = None
    verdicts: list[ModuleVerdict | None] = [None] * len(modules)
    with ThreadPoolExecutor(max_workers=jobs or cpus()) as pool:
        if ck is not None:
            # the zero points' evidence, every qweight row (the large read), then the checks
            # that read each module's verdict in the light of all of them (pooled evidence,
            # misfits against the module count): qzeros and scales only, small beside qweight
            read = []
            advance = start(progress, VERIFY, total)
            for size, v in zip(sizes, bounded_map(pool, evidence, modules)):
                read.append(v)
                advance(size)
            det = combine(read)
            verdicts = list(det.modules)
            # the checks of each verdict read qzeros and scales: counted in modules
            steps, advance = [1] * len(modules), start(progress, CHECK, len(modules))
        else:  # the checks read the codes: verify's read of all of qweight
            steps, advance = sizes, start(progress, VERIFY, total)
        for step, found in zip(steps, bounded_map(pool, check, modules, verdicts)):
            findings += found
            advance(step)
    runtimes = None
    if ck is not None and det is not None:
        findings += convention_findings(ck, det)
        # no runtime loads a checkpoint with shards that cannot be read: nothing to assess
        runtimes = assess(ck, det, scales=True, progress=rounds(progress, RUNTIMES)) \
            if not src.store.unreadable else []
        if gate:
            where = ck.config.sources[0] if ck.config and ck.config.sources else None
            findings += runtime_findings([v for v in runtimes if v.runtime.id in gate], where)
    findings.sort(key=Finding.sort_key)
    return Report(str(path), src, det, findings, runtimes, total)
