"""JSON blocks that more than one report carries, built in one place (the schemas in schemas/
are the contract for their shape)."""
from __future__ import annotations

from typing import Any

from .findings import ERROR, WARNING, Finding
from .gptq.config import QuantConfig
from .gptq.detect import Detection
from .version import __version__


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


def files_json(store) -> list[dict[str, Any]]:
    """inspect's `files`: each safetensors file with its size and tensor count."""
    return [{"name": n, "size": f.size, "tensors": len(f.tensors)}
            for n, f in sorted(store.files.items())]


def summary_counts(findings: list[Finding], modules: int) -> dict[str, int]:
    out = {"modules": modules, "errors": 0, "warnings": 0, "infos": 0}
    for f in findings:
        out[{"error": "errors", "warning": "warnings", "info": "infos"}[f.severity]] += 1
    return out
