"""Progress on stderr, only for a person at a terminal (never in JSON mode or when piped).

The library reports its work in phases (ops.reports.Progress): each starts with its name, its
unit and its total, so a bar shows a percentage and an ETA. A bar appears when the first phase
it is told of starts, and is reset when the next one starts: its rate and ETA are measured from
the start of the phase it shows, never from time spent before (opening, planning, another
phase). Byte counts use tqdm's decimal units (1 MB = 10^6 B), as human_bytes does in the
reports.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ..ops.reports import BYTES, Phase

if TYPE_CHECKING:
    from tqdm import tqdm

# tqdm's bar with the unit on the amounts too: 11.6kB/38.3kB, not 11.6k/38.3k
BYTES_FORMAT = "{l_bar}{bar}| {n_fmt}{unit}/{total_fmt}{unit} [{elapsed}<{remaining}, {rate_fmt}]"


class Progress:
    """One bar at `position`; `desc` and `unit` name what it counts until a phase names its
    own."""

    def __init__(self, enabled: bool, *, unit: str, desc: str, position: int = 0):
        self._on = enabled and sys.stderr.isatty()
        self._unit, self._desc, self._position = unit, desc, position
        self._bar: tqdm | None = None

    def update(self, n: int, total: int | None = None, phase: Phase | None = None) -> None:
        """Advance by `n` of `total`; with `phase`, that phase starts now (over `total`)."""
        if not self._on:
            return
        if phase is not None:
            self._start(phase.name, phase.unit, total)
        elif self._bar is None:   # an unnamed report: the work starts with it
            self._start(self._desc, self._unit, total)
        bar = self._bar
        assert bar is not None
        if total is not None and bar.total != total:
            bar.total = total
            bar.refresh()
        if n:
            bar.update(n)
            if bar.total is not None and bar.n >= bar.total and bar.last_print_n < bar.n:
                bar.refresh()   # a phase done shows as done, however few redraws it had

    def _start(self, desc: str, unit: str, total: int | None) -> None:
        """The bar for work that starts now: created, or reset (its clock too)."""
        fmt = BYTES_FORMAT if unit == BYTES and total is not None else None
        if self._bar is None:
            # imported for a bar only: a run that shows none (piped, --quiet, JSON) is spared
            # its import (tens of milliseconds)
            from tqdm import tqdm
            self._bar = tqdm(file=sys.stderr, total=total, unit=unit, desc=desc,
                             position=self._position, unit_scale=unit == BYTES,
                             unit_divisor=1000, leave=False, dynamic_ncols=True,
                             bar_format=fmt)
            return
        bar = self._bar
        bar.set_description_str(desc, refresh=False)
        bar.unit, bar.unit_scale, bar.bar_format = unit, unit == BYTES, fmt
        if bar.dynamic_miniters:   # what the last phase's steps taught it (64 MB at a time)
            bar.miniters = 0
        bar.reset(total)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.close()
