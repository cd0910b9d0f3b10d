"""kernels/gptq_dequant.h compiled for the host: its arithmetic against the numpy core, in CI."""
import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from gptqfmt.gptq.packing import unpack
from gptqfmt.resources import data_dir

CC = shutil.which("g++") or shutil.which("cc")


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if CC is None:
        pytest.skip("no host C/C++ compiler")
    src = data_dir("kernels") / "host_shim.c"
    out = tmp_path_factory.mktemp("k") / "libgq.so"
    lang = ["-x", "c++"] if CC.endswith("g++") else []
    subprocess.run([CC, *lang, "-O2", "-shared", "-fPIC", "-I", str(src.parent), str(src), "-o",
                    str(out)], check=True)
    return ctypes.CDLL(str(out))


def ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_field_extraction_matches_numpy_unpack(lib, bits):
    rng = np.random.default_rng(bits)
    words = rng.integers(0, 2**32, size=3 * 8, dtype=np.uint64).astype(np.uint32)
    n = words.size * 32 // bits
    out = np.zeros(n, np.uint32)
    lib.gq_host_fields(ptr(words), ctypes.c_int64(n), ctypes.c_int(bits), ptr(out))
    assert np.array_equal(out, unpack(words.view(np.int32)[:, None], bits, axis=0)[:, 0])


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize(("rule", "expect"), [
    (0, lambda s, m: s), (1, lambda s, m: s + 1), (2, lambda s, m: (s + 1) & m)])
def test_zero_rules(lib, bits, rule, expect):
    maxq = 2**bits - 1
    stored = np.arange(maxq + 1, dtype=np.uint32)
    out = np.zeros_like(stored, dtype=np.int32)
    lib.gq_host_zeros(ptr(stored), ctypes.c_int64(stored.size), ctypes.c_int(bits),
                      ctypes.c_int(rule), ptr(out))
    assert out.tolist() == [expect(int(s), maxq) for s in stored]
    if rule == 1:
        assert out[-1] == 2**bits  # "no-wrap": stored maxq reads as 2^bits
    if rule == 2:
        assert out[-1] == 0  # "wrap": stored maxq reads as 0
