"""What the tests share: paths and fixture data, the slow bit-by-bit packing reference and the
checkpoint builders of the convert fault tests. Tests import from here, never from each other nor
from conftest.py (which keeps only pytest hooks and fixtures).
"""
import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

from gptqfmt.gptq.detect import sym_field
from gptqfmt.gptq.packing import pack
from gptqfmt.safetensors_io import save_file

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


# ------------------------------------ the checkpoints of the convert fault tests (faults, signals)

TMP_TAG = ".gptqfmt-tmp-"


def build(d, shards=4, k=2048, n=4096):
    """A symmetric 4-bit gptq checkpoint in `shards` files, 2 modules each (~34 MB with the
    defaults)."""
    d.mkdir()
    rng = np.random.default_rng(0)
    wm = {}
    for s in range(shards):
        t = {}
        for j in range(2):
            p = f"model.layers.{s * 2 + j}.mlp.up_proj"
            t[f"{p}.qweight"] = rng.integers(-2**31, 2**31, (k // 8, n), dtype=np.int64) \
                .astype(np.int32)
            t[f"{p}.qzeros"] = pack(np.full((k // 128, n), sym_field(4, "gptq")), 4, 32, 1)
            t[f"{p}.scales"] = np.full((k // 128, n), 0.01, np.float16)
            t[f"{p}.g_idx"] = (np.arange(k) // 128).astype(np.int32)
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(t, d / name)
        wm.update({x: name for x in t})
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    (d / "quantize_config.json").write_text(json.dumps(
        {"bits": 4, "group_size": 128, "sym": True, "desc_act": False,
         "checkpoint_format": "gptq"}))
    (d / "tokenizer.json").write_text("{}")


def digest(d):
    return {p.name: digest_file(p) for p in sorted(d.iterdir())}


def digest_file(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def staging_dirs(parent):
    return sorted(p for p in parent.iterdir() if TMP_TAG in p.name)
