"""The bit-level core: pure functions on numpy arrays, no I/O and no checkpoint. How codes pack
into words (packing.py), the shapes of one quantized linear (layout.py), every predicate on
packed words (swar.py) and the zero-point conventions (conventions.py)."""
from typing import Any

import numpy as np
import numpy.typing as npt

# any numpy array, as the typed signatures of the package name it
Array = npt.NDArray[Any]


def unique(a: npt.ArrayLike) -> Array:
    """np.unique(a): its distinct values, sorted, flattened. numpy's asks first whether `a` is
    a masked array, which imports numpy.ma (15 to 40 ms here) in every process that calls it
    first, each of detection's forked workers too.

    Worked example: unique([3, 1, 3, 2]) is [1, 2, 3]."""
    s = np.sort(np.asarray(a), axis=None)
    return s[np.concatenate(([True], s[1:] != s[:-1]))] if s.size else s
