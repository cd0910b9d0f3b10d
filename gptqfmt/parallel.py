"""How many threads the work may use: the CPUs this process may run on. A leaf module (the
standard library only), so that any layer can ask, from the container reader up."""
from __future__ import annotations

import os


def cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
