"""Progress on stderr, only for a person at a terminal (never in JSON mode or when piped).

Bars know their total (the library reports it with the first update), so they show a
percentage and an ETA. Byte counts use tqdm's decimal units (1 MB = 10^6 B), as human_bytes
does in the reports.
"""
from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    def __init__(self, enabled: bool, *, unit: str, desc: str, position: int = 0):
        self._bar = None
        if enabled and sys.stderr.isatty():
            self._bar = tqdm(file=sys.stderr, unit=unit, desc=desc, position=position,
                             unit_scale=unit == "B", unit_divisor=1000, leave=False,
                             dynamic_ncols=True)

    def update(self, n: int, total: int | None = None) -> None:
        """Advance by `n`; `total`, when given, is the whole amount of work."""
        if self._bar is None:
            return
        if total is not None and self._bar.total != total:
            self._bar.total = total
            self._bar.refresh()
        if n:
            self._bar.update(n)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.close()
