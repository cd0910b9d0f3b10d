"""`inspect`: what a checkpoint holds, as one result object for the text and JSON reporters.

Its findings come from verify's own rules (checks/) fed with what inspect reads: every header,
config, g_idx and qzeros, and a sample of qweight rows. Whatever it finds, verify finds with
the same code and severity; verify may find more (scales, and evidence from the unsampled
rows)."""
from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from ..checks.labels import convention_findings
from ..checks.modules import module_findings, probe_heads, probe_reads
from ..detection.decide import ModuleVerdict
from ..detection.read import detect_checkpoint, module_reads
from ..findings import Finding
from ..formats import open_source
from ..formats.source import Source
from ..parallel import in_child
from ..runtimes.verdicts import assess
from .reports import Result, checkpoint_format_json, failed, files_json, summary_counts, tool_json

# from this many modules on, the module checks run in a forked child beside the runtimes' pass
# (a fork and its answer cost some 20 ms; a module's checks some 5 us)
FORK_MIN_MODULES = 4096


@dataclass(frozen=True)
class InspectResult(Result):
    """What inspect found (reports.Result); `remote`: what was read of a Hub repo, and from
    where (ops/remote.py), for a checkpoint read over HTTP."""
    remote: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not failed(self.findings)

    def to_json(self, rows: bool = True) -> dict[str, Any]:
        """The JSON document (schemas/inspect.schema.json). Without `rows`, for a report
        that shows only how many modules there are (summary.modules): `modules` is None and
        no module's record is built (a mixture of experts has tens of thousands)."""
        src, det = self.source, self.detection
        st = src.store
        ck = src.labelled
        verdicts = {v.name: v for v in det.modules} if det and rows else {}
        doc: dict[str, Any] = {"tool": tool_json(), "path": self.path,
                               "status": "ok" if self.ok else "fail"}
        if det is None:
            doc["format"] = src.format
        doc.update({"files": files_json(st), "sharded": st.index_name is not None,
                    "unreadable_files": st.unreadable_files,
                    "config_sources": src.config_files})
        if det is not None:
            assert ck is not None   # only a labelled checkpoint has a detection
            doc["checkpoint_format"] = checkpoint_format_json(ck.config, det, ck.label)
        doc.update({
            "quantization": src.quantization(),
            "modules": [r.to_json(_zero_point(verdicts.get(r.name))) for r in src.records()]
            if rows else None,
            "other_tensors": {"count": len(src.other_tensors),
                              "bytes": sum(st.info(t).nbytes for t in src.other_tensors),
                              "names": src.other_tensors}})
        if self.runtimes is not None:
            doc["runtimes"] = [v.to_json() for v in self.runtimes]
        doc.update({"findings": [f.to_json() for f in self.findings],
                    "summary": summary_counts(self.findings, src.record_count)})
        if self.remote is not None:
            doc["remote"] = self.remote
        return doc


def reads(src: Source) -> list[tuple[str, list[tuple[int, int]] | None]]:
    """What inspect reads first of each module, for TensorStore.prefetch: detection's first
    round (qzeros, g_idx, the sampled qweight rows) and the probes for empty tensors; detection
    says what its later rounds read itself, and anything else is fetched where it is read."""
    ck = src.labelled
    out = [p for m in src.modules for p in probe_reads(m)]
    if ck is not None:
        out += [p for m in ck.valid_modules for p in module_reads(ck, m, full=False)]
    return out


def _zero_point(v: ModuleVerdict | None) -> dict[str, Any] | None:
    return None if v is None else {"verdict": v.verdict, "confidence": v.confidence,
                                   "evidence": v.evidence, "signatures": v.signatures}


def inspect_checkpoint(path: str | os.PathLike[str]) -> InspectResult:
    """Model the checkpoint at `path`, check what bounded reads allow and, where its zero points
    follow a label, detect their convention (every qzeros, a sample of qweight rows) and what
    each runtime makes of it."""
    src = open_source(path, survey=True)
    try:   # the result holds the source open; a failure closes it (and ends its survey)
        ck = src.labelled
        findings = list(src.findings)
        det = runtimes = None
        if src.store.remote:   # what the reads below take, fetched together (ranges coalesced)
            src.store.prefetch(reads(src))
        if ck is not None:
            det = detect_checkpoint(ck, full=False)
            findings += convention_findings(ck, det)

        def checks() -> list[Finding]:
            verdicts = {v.name: v for v in det.modules} if det else {}
            zero_heads = probe_heads(src, src.modules)
            out: list[Finding] = []
            for m in src.modules:
                out += module_findings(src, m, verdicts.get(m.name), full=False,
                                       zero_heads=zero_heads)
                src.store.release(m.tensors.values())
            return out

        if ck is None or det is None:
            findings += checks()
        else:
            # the module checks (with the probes and the source's module list, which nothing
            # else here needs) and the runtimes' pass are Python over every module, apart from
            # each other: many modules are checked in a forked child (parallel.in_child) while
            # this process judges the runtimes. A store read over HTTP is not forked (its
            # connections and its record of what is fetched are this process's).
            fork = len(ck.valid_modules) >= FORK_MIN_MODULES and not src.store.remote
            if fork:
                src.store.settle()   # the survey's thread ends: this process may fork
            with in_child(checks) if fork else nullcontext(checks) as checked:
                # what each runtime makes of it: counts from qzeros only (no scales: inspect's
                # reads stay bounded, so the largest weight change is verify's); not said of a
                # checkpoint with shards that cannot be read (no runtime loads it)
                runtimes = assess(ck, det, scales=False) if not src.store.unreadable else []
                findings += checked()
        # nothing of the call is left running: the survey has read what the reads above asked
        # of it; a pass nothing asked for is not waited for, and a later read is its own
        src.store.stop_survey()
        return InspectResult(str(src.path), src, det, sorted(findings, key=Finding.sort_key),
                             runtimes)
    except BaseException:
        src.close()
        raise
