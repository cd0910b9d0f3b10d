"""What inspect and verify both report (Result), and the JSON blocks more than one report
carries, built in one place (the schemas in schemas/ are the contract for their shape)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..detection.pool import Detection
from ..findings import ERROR, WARNING, Finding
from ..formats.gptq.checkpoint import Checkpoint
from ..formats.gptq.config import QuantConfig
from ..formats.source import Source
from ..runtimes.verdicts import RuntimeVerdict
from ..safetensors_io.index import TensorStore
from ..version import __version__

# a command's progress callback: (done, total), first called with done=0 so a bar knows its total
Progress = Callable[[int, int], Any]


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
                           effective: str | None = None) -> dict[str, Any]:
    """What the configs declare (and, for verify, what runtimes read: `effective`) beside what
    the data say."""
    out: dict[str, Any] = {
        "declared": cfg.convention if cfg else None,
        "declared_in": [d.to_json() for d in cfg.declared_in] if cfg else []}
    if effective is not None:
        out["effective"] = effective
    return {**out, **det.to_json()}


def failed(findings: list[Finding], strict: bool = False) -> bool:
    """Whether findings fail a report: errors, and with `strict` warnings too."""
    bad = {ERROR, WARNING} if strict else {ERROR}
    return any(f.severity in bad for f in findings)


def files_json(store: TensorStore) -> list[dict[str, Any]]:
    """inspect's `files`: each safetensors file with its size and tensor count."""
    return [{"name": n, "size": f.size, "tensors": len(f.tensors)}
            for n, f in sorted(store.files.items())]


def summary_counts(findings: list[Finding], modules: int) -> dict[str, int]:
    out = {"modules": modules, "errors": 0, "warnings": 0, "infos": 0}
    for f in findings:
        out[{"error": "errors", "warning": "warnings", "info": "infos"}[f.severity]] += 1
    return out
