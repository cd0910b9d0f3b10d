"""The CuPy backend's host-side logic (argument checks, repacking, padding, launch arguments) in
CI, with a stand-in `cupy` module whose kernels are the host build of the same kernel bodies
(kernels/host_shim.c). The real GPU run is tests/test_gpu.py."""
import ctypes
import shutil
import subprocess
import sys
import types
from dataclasses import replace

import numpy as np
import pytest

from gptqfmt.conventions import ZeroRule
from gptqfmt.errors import UsageError
from gptqfmt.gptq.packing import pack
from gptqfmt.resources import data_dir
from gptqfmt.numerics import F16, F32, ModuleTensors
from gptqfmt.numerics.cpu import CpuBackend

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")


def fake_cupy(lib):
    def ptr(a):
        return np.ascontiguousarray(a).ctypes.data_as(ctypes.c_void_p)

    def launch(name):
        def gemm(grid, block, a):
            x, xk, qw, qz, sc, sk, g, y, m, k, n, bits, rule = a
            lib.gq_host_gemm(ptr(x), ctypes.c_int(int(xk)), ptr(qw), ptr(qz), ptr(sc),
                             ctypes.c_int(int(sk)), ptr(g), y.ctypes.data_as(ctypes.c_void_p),
                             ctypes.c_int(int(m)), ctypes.c_int64(int(k)), ctypes.c_int64(int(n)),
                             ctypes.c_int(int(bits)), ctypes.c_int(int(rule)))

        def dequant(grid, block, a):
            qw, qz, sc, sk, g, w, k, n, bits, rule = a
            lib.gq_host_dequant(ptr(qw), ptr(qz), ptr(sc), ctypes.c_int(int(sk)), ptr(g),
                                w.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(int(k)),
                                ctypes.c_int64(int(n)), ctypes.c_int(int(bits)),
                                ctypes.c_int(int(rule)))
        return {"gptq_dequant_gemm": gemm, "gptq_dequant": dequant}[name]

    class RawModule:
        def __init__(self, code, options):
            assert "gptq_dequant_gemm" in code and "--fmad=false" in options

        def get_function(self, name):
            return launch(name)

    mod = types.ModuleType("cupy")
    mod.asarray, mod.asnumpy, mod.empty, mod.float32 = np.asarray, np.asarray, np.empty, np.float32
    mod.RawModule = RawModule
    mod.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: 1))
    return mod


@pytest.fixture
def backend(tmp_path, monkeypatch):
    src = data_dir("kernels") / "host_shim.c"
    so = tmp_path / "shim.so"
    subprocess.run(["g++", "-x", "c++", "-O2", "-ffp-contract=off", "-shared", "-fPIC", "-I",
                    str(src.parent), str(src), "-o", str(so)], check=True)
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(ctypes.CDLL(str(so))))
    monkeypatch.delitem(sys.modules, "gptqfmt.numerics.cupy_backend", raising=False)
    from gptqfmt.numerics import cupy_backend
    monkeypatch.setattr(cupy_backend, "_module", None)
    yield cupy_backend.CupyBackend()
    # the module is bound to the stand-in: forget it, in sys.modules and on its package
    sys.modules.pop("gptqfmt.numerics.cupy_backend", None)
    import gptqfmt.numerics
    if hasattr(gptqfmt.numerics, "cupy_backend"):
        delattr(gptqfmt.numerics, "cupy_backend")


@pytest.mark.parametrize(("bits", "word_bits"), [(4, 32), (3, 32), (4, 8), (2, 64), (8, 16)])
@pytest.mark.parametrize("cols", [None, np.arange(5, 37)])
def test_backend_equals_cpu_twin(backend, bits, word_bits, cols):
    rng = np.random.default_rng(bits)
    k, n, g = 96, 64, 3
    qw = pack(rng.integers(0, 2**bits, (k, n)), bits, word_bits, 0)
    qz = pack(rng.integers(0, 2**bits, (g, n)), bits, word_bits, 1)
    sc = (rng.random((g, n)) * 0.1).astype(np.float16)
    gi = rng.permutation(np.repeat(np.arange(g), k // g)).astype(np.int32)
    x = rng.standard_normal((3, k)).astype(np.float32)
    t = ModuleTensors(qw, qz, sc, F16, gi, bits)
    for rule in ZeroRule:
        a = backend.gemm(x, F32, t, rule, cols)
        b = CpuBackend().gemm(x, F32, t, rule, cols)
        assert np.array_equal(a, b)
        wa = backend.dequant(t, rule, cols)
        wb = CpuBackend().dequant(t, rule, cols)
        assert np.array_equal(wa, wb)


def test_backend_checks_arguments(backend):
    qw = pack(np.zeros((64, 32), np.uint8), 4, 32, 0)
    qz = pack(np.zeros((2, 32), np.uint8), 4, 32, 1)
    sc = np.ones((2, 32), np.float16)
    g = (np.arange(64) // 32).astype(np.int32)
    x = np.zeros((2, 64), np.float32)
    t = ModuleTensors(qw, qz, sc, F16, g, 4)
    with pytest.raises(UsageError, match="does not match kind"):
        backend.gemm(x.astype(np.float64), F32, t, 0)
    with pytest.raises(UsageError, match="does not match kind"):
        backend.gemm(x, F32, replace(t, scales=sc.astype(np.float32)), 0)
    with pytest.raises(UsageError, match="g_idx values span"):
        backend.gemm(x, F32, replace(t, g_idx=g + 5), 0)
    with pytest.raises(UsageError, match="at most 16 rows"):
        backend.gemm(np.zeros((17, 64), np.float32), F32, t, 0)


def test_convert_runs_the_gpu_gate_when_cupy_is_chosen(backend, tmp_path):
    from gptqfmt.conversion import convert
    from tests.support import CKPT
    rep = convert(CKPT / "b3-sym-act-gptq-sharded", tmp_path / "o", backend="cupy")
    assert rep.backend == "cupy" and rep.gate.ok and "CUDA kernel" in rep.gate.method
    rep = convert(CKPT / "int8-b4-asym-gptq_v2", tmp_path / "p", backend="auto")
    assert rep.backend == "cupy" and rep.gate.ok  # auto takes a usable device


def test_gpu_gate_failure_blocks_the_commit(backend, tmp_path, monkeypatch):
    from gptqfmt.conversion import convert
    from gptqfmt.errors import FindingError
    from gptqfmt.numerics import cupy_backend
    from tests.support import CKPT
    real = cupy_backend.CupyBackend.gemm

    def off_by_a_bit(self, *a, **k):
        y = real(self, *a, **k)
        return y + np.float32(1e-3) * (a[-2] == 0)  # outputs under the gptq_v2 rule drift
    monkeypatch.setattr(cupy_backend.CupyBackend, "gemm", off_by_a_bit)
    with pytest.raises(FindingError) as e:
        convert(CKPT / "b4-sym-noact-gptq-single", tmp_path / "o", backend="cupy")
    assert e.value.finding.code == "GQ503" and not (tmp_path / "o").exists()
