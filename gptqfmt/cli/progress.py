"""Progress on stderr, only for a person at a terminal (never in JSON mode or when piped)."""
from __future__ import annotations

import sys


class Progress:
    def __init__(self, enabled: bool, **kwargs):
        self._bar = None
        if enabled and sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:  # tqdm is optional for progress only
                return
            self._bar = tqdm(file=sys.stderr, unit_scale=True, leave=False, **kwargs)

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.close()
