"""The runtimes that load GPTQ checkpoints: the vocabulary of their rules (rules.py), the
runtimes as data (table.py), how each kernel path reads stored zero points (readings.py), the
table grouped by reading (groups.py), and the rules applied to a checkpoint (verdicts.py)."""
from __future__ import annotations

from .table import BY_ID, RUNTIMES

__all__ = ["BY_ID", "RUNTIMES"]
