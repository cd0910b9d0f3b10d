"""What inspect and verify both report (Result), and the JSON blocks more than one report
carries, built in one place (the schemas in schemas/ are the contract for their shape); the
progress protocol every command reports its phases through (Progress, Phase)."""
from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..detection.pool import Detection
from ..findings import ERROR, WARNING, Finding
from ..formats.gptq.checkpoint import Checkpoint
from ..formats.gptq.config import QuantConfig
from ..formats.source import Source
from ..runtimes.verdicts import RuntimeVerdict
from ..safetensors_io.index import TensorStore
from ..version import __version__

BYTES, MODULES = "B", "module"   # what a phase counts


@dataclass(frozen=True)
class Phase:
    """One stretch of a command's work as its progress callback hears of it: `name` says what
    is being done, `unit` what is counted (BYTES or MODULES)."""
    name: str
    unit: str


DETECT = Phase("detect", MODULES)    # the convention: every qzeros, a sample of qweight
CHECK = Phase("check", MODULES)      # every module's checks (qzeros, scales, g_idx)
PLAN = Phase("plan", MODULES)        # convert's per-field plan of every module's zero points
VERIFY = Phase("verify", BYTES)      # verify's read of every qweight row
WRITE = Phase("write", BYTES)        # the output's shards; in place, the qzeros ranges
GATE = Phase("verify", MODULES)      # convert's proof, module by module, before commit
GPU_GATE = Phase("verify on GPU", MODULES)
COMPARE = Phase("compare", BYTES)    # the tensors outside the modules, byte for byte
SYNC = Phase("sync", BYTES)          # written shards still on their way to the disk
RUNTIMES = Phase("runtimes", MODULES)  # each runtime's reading of every module (verify)


class Progress(Protocol):
    """A command's progress callback: `progress(0, total, phase)` as a phase's work starts (a
    bar measures its rate and ETA from that call on), then `progress(n, total)` each time n
    more of its `total` units are done; the n of a phase add up to its total. A callback
    of (done, total) only is called without the phase (start)."""

    def __call__(self, done: int, total: int, phase: Phase | None = None, /) -> Any: ...


def start(progress: Progress | None, phase: Phase, total: int) -> Callable[[int], Any]:
    """Start `phase` over `total` units now; the function to call with each n units done
    (it does nothing where no progress is wanted)."""
    if progress is None:
        return _nothing
    if _takes_phase(progress):
        progress(0, total, phase)
    else:   # a caller's callback of (done, total) only: told the start without the name
        progress(0, total)
    return lambda n: progress(n, total)


def _takes_phase(callback: Callable[..., Any]) -> bool:
    """Whether `callback` takes a third positional argument (the phase)."""
    try:
        params = list(inspect.signature(callback).parameters.values())
    except (TypeError, ValueError):   # a builtin without a signature: assume the protocol
        return True
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return True
    return len([p for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                  inspect.Parameter.POSITIONAL_OR_KEYWORD)]) >= 3


def rounds(progress: Progress | None, phase: Phase
           ) -> Callable[[int], Callable[[int], Any]] | None:
    """For work done in rounds whose sizes are known only as each begins (detection): called
    with a round's total as it starts, it starts `phase` again over that round."""
    if progress is None:
        return None
    return lambda total: start(progress, phase, total)


def _nothing(n: int) -> None:
    return None


@dataclass(frozen=True)
class Result:
    """What a command that reads a checkpoint found. `detection` and `runtimes` are None for a
    checkpoint whose zero points are stored exactly (compressed-tensors, AWQ): nothing to
    detect, and the runtime table describes GPTQ's kernels."""
    path: str
    source: Source
    detection: Detection | None
    findings: list[Finding]
    runtimes: list[RuntimeVerdict] | None

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The GPTQ model of a labelled checkpoint (formats/gptq/checkpoint.py)."""
        return self.source.labelled


def tool_json() -> dict[str, str]:
    """Which tool wrote the document."""
    return {"name": "gptqfmt", "version": __version__}


def checkpoint_format_json(cfg: QuantConfig | None, det: Detection,
                           effective: str) -> dict[str, Any]:
    """What the configs declare, what runtimes read (`effective`: Checkpoint.label, which
    differs where `format` says gptq_v2 and `checkpoint_format` is missing), beside what the
    data say."""
    return {"declared": cfg.convention if cfg else None,
            "declared_in": [d.to_json() for d in cfg.declared_in] if cfg else [],
            "effective": effective, **det.to_json()}


def failed(findings: list[Finding], strict: bool = False) -> bool:
    """Whether findings fail a report: errors, and with `strict` warnings too."""
    bad = {ERROR, WARNING} if strict else {ERROR}
    return any(f.severity in bad for f in findings)


def files_json(store: TensorStore) -> list[dict[str, Any]]:
    """inspect's `files`: each safetensors file with its size and tensor count."""
    return [{"name": n, "size": f.size, "tensors": len(f.tensors)}
            for n, f in sorted(store.files.items())]


def summary_counts(findings: list[Finding], modules: int | None) -> dict[str, Any]:
    counts = {"errors": 0, "warnings": 0, "infos": 0}
    for f in findings:
        counts[{"error": "errors", "warning": "warnings", "info": "infos"}[f.severity]] += 1
    return {"modules": modules, **counts}
