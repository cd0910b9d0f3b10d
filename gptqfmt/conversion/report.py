"""What convert did (or, with --dry-run, would do): the result object the reporters print."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..bits.conventions import STORED_OFFSET
from ..detection.pool import Detection
from ..findings import Finding
from ..ops.reports import tool_json
from .gate import GateResult
from .plan import ModulePlan, Plan, relayout


@dataclass(frozen=True)
class ConvertReport:
    src: str
    dst: str
    src_convention: str
    dst_convention: str
    dry_run: bool
    modules: list[ModulePlan]
    detection: Detection | None       # None: a format whose zero points are stored exactly
    findings: list[Finding] = field(default_factory=list)
    gate: GateResult | None = None
    written: bool = False
    backend: str = "cpu"
    in_place: bool = False            # convert --in-place: SRC itself rewritten

    @classmethod
    def of(cls, plan: Plan, src: str, dst: str, dry_run: bool, backend: str,
           in_place: bool = False) -> ConvertReport:
        """The report of a plan, before anything is written."""
        return cls(src, dst, plan.from_, plan.to, dry_run, plan.modules, plan.detection,
                   plan.findings, backend=backend, in_place=in_place)

    @property
    def between_formats(self) -> bool:
        return relayout(self.src_convention, self.dst_convention)

    @property
    def zeros_reencoded(self) -> bool:
        """Whether the source's stored fields are not Z itself (gptq's Z - 1), so the zero
        points are re-encoded on the way rather than carried exactly."""
        return STORED_OFFSET.get(self.src_convention, 0) != 0

    @property
    def totals(self) -> dict[str, int]:
        return {k: sum(getattr(m, k) for m in self.modules)
                for k in ("fields", "changed", "ambiguous", "lossy")}

    def to_json(self) -> dict[str, Any]:
        g = self.gate
        return {
            "tool": tool_json(),
            "status": "ok", "src": self.src, "dst": self.dst,
            "from": self.src_convention, "to": self.dst_convention,
            "dry_run": self.dry_run, "written": self.written, "in_place": self.in_place,
            "backend": self.backend,
            "detected": None if self.detection is None else {
                "verdict": self.detection.verdict, "confidence": self.detection.confidence},
            "totals": self.totals,
            "modules": [m.to_json() for m in self.modules],
            "verified": None if g is None else {
                "method": g.method, "bytes_compared": g.bytes_compared,
                "modules": [c.to_json() for c in g.modules]},
            "findings": [f.to_json() for f in self.findings],
        }
