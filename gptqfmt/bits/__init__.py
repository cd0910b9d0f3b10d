"""The bit-level core: pure functions on numpy arrays, no I/O and no checkpoint. How codes pack
into words (packing.py), the shapes of one quantized linear (layout.py), every predicate on
packed words (swar.py) and the zero-point conventions (conventions.py)."""
from typing import Any

import numpy.typing as npt

# any numpy array, as the typed signatures of the package name it
Array = npt.NDArray[Any]
