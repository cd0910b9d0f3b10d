"""What the tests share: paths and fixture data, and the slow bit-by-bit packing reference.
Tests import from here, never from each other nor from conftest.py (which keeps only pytest hooks
and fixtures).
"""
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
CKPT = FIXTURES / "ckpt"


def load_generator(name: str = "make_fixtures"):
    """A fixture generator script under fixtures/, imported as a module."""
    if str(FIXTURES) not in sys.path:
        sys.path.insert(0, str(FIXTURES))  # the generators import each other
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, FIXTURES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


GEN = load_generator()
SPECS = {s.name: s for s in GEN.specs()}
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())


def gpu_available() -> bool:
    try:
        import cupy  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


# ------------------------------------- the slow bit-by-bit packing reference (packing, convert)

def slow_pack_column(values, bits, word_bits):
    """One Python integer as the bit stream: value k at bit k*bits, then cut into words."""
    stream = 0
    for k, v in enumerate(values):
        for b in range(bits):
            if (int(v) >> b) & 1:
                stream |= 1 << (k * bits + b)
    n_words = len(values) * bits // word_bits
    return [(stream >> (i * word_bits)) & ((1 << word_bits) - 1) for i in range(n_words)]


def slow_unpack_column(words, bits, word_bits):
    stream = 0
    for i, w in enumerate(words):
        stream |= (int(w) & ((1 << word_bits) - 1)) << (i * word_bits)
    n = len(words) * word_bits // bits
    return [(stream >> (k * bits)) & ((1 << bits) - 1) for k in range(n)]
