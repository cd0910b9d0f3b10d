"""The CuPy backend's host-side logic (argument checks, repacking, padding, launch arguments) in
CI, with a stand-in `cupy` module whose kernels are the host build of the same kernel bodies
(kernels/host_shim.c). The real GPU run is
tests/unit/test_cupy_backend_gpu.py."""
import ctypes
import shutil
import subprocess
import sys
import types
from dataclasses import replace

import numpy as np
import pytest

from gptqfmt.bits.conventions import ZeroRule
from gptqfmt.bits.packing import pack
from gptqfmt.errors import UsageError
from gptqfmt.formats.model import F16, F32, ModuleTensors
from gptqfmt.numerics.cpu import TILE_K, CpuBackend
from gptqfmt.resources import data_dir

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")


def fake_cupy(lib):
    def ptr(a):
        return np.ascontiguousarray(a).ctypes.data_as(ctypes.c_void_p)

    def launch(name):
        def gemm_tiles(grid, block, a):
            x, xk, qw, qz, sc, sk, g, partial, m, k, n, bits, rule = a
            assert grid[1] == partial.shape[0] == -(-int(k) // TILE_K)  # one grid row a tile
            lib.gq_host_gemm_tiles(ptr(x), ctypes.c_int(int(xk)), ptr(qw), ptr(qz), ptr(sc),
                                   ctypes.c_int(int(sk)), ptr(g), partial.ctypes.data_as(
                                       ctypes.c_void_p), ctypes.c_int(int(m)),
                                   ctypes.c_int64(int(k)), ctypes.c_int64(int(n)),
                                   ctypes.c_int(int(bits)), ctypes.c_int(int(rule)))

        def sum_tiles(grid, block, a):
            partial, y, tiles, m, n = a
            lib.gq_host_sum_tiles(partial.ctypes.data_as(ctypes.c_void_p),
                                  y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(int(tiles)),
                                  ctypes.c_int(int(m)), ctypes.c_int64(int(n)))

        def count_differences(grid, block, a):
            (qa, za, sa, ska, ga, ra, qb, zb, sb, skb, gb, rb, k, n, bits, counts) = a
            assert grid[1] == -(-int(k) // TILE_K)
            lib.gq_host_count_differences(
                ptr(qa), ptr(za), ptr(sa), ctypes.c_int(int(ska)), ptr(ga), ctypes.c_int(int(ra)),
                ptr(qb), ptr(zb), ptr(sb), ctypes.c_int(int(skb)), ptr(gb), ctypes.c_int(int(rb)),
                ctypes.c_int64(int(k)), ctypes.c_int64(int(n)), ctypes.c_int(int(bits)),
                counts.ctypes.data_as(ctypes.c_void_p))

        def dequant(grid, block, a):
            qw, qz, sc, sk, g, w, k, n, bits, rule = a
            lib.gq_host_dequant(ptr(qw), ptr(qz), ptr(sc), ctypes.c_int(int(sk)), ptr(g),
                                w.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(int(k)),
                                ctypes.c_int64(int(n)), ctypes.c_int(int(bits)),
                                ctypes.c_int(int(rule)))
        return {"gptq_gemm_tiles": gemm_tiles, "gptq_sum_tiles": sum_tiles,
                "gptq_count_differences": count_differences, "gptq_dequant": dequant}[name]

    class RawModule:
        def __init__(self, code, options):
            assert "gptq_gemm_tiles" in code and "--fmad=false" in options

        def get_function(self, name):
            return launch(name)

    mod = types.ModuleType("cupy")
    mod.asarray, mod.asnumpy, mod.empty, mod.float32 = np.asarray, np.asarray, np.empty, np.float32
    mod.zeros, mod.uint64 = np.zeros, np.uint64
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
@pytest.mark.parametrize("k", [96, 1152])  # one tile; three (512, 512, 128)
def test_backend_equals_cpu_twin(backend, bits, word_bits, cols, k):
    rng = np.random.default_rng(bits)
    n, g = 64, 3
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
    # the fused comparison: zero fields moved in two groups, under every pair of rules
    from gptqfmt.bits.packing import unpack
    f = unpack(qz, bits, axis=1).astype(np.int64)
    f[0, 3] = (f[0, 3] + 1) % 2**bits
    f[2, 40] = (f[2, 40] + 2) % 2**bits
    t2 = replace(t, qzeros=pack(f, bits, word_bits, 1))
    for ra in ZeroRule:
        for rb in ZeroRule:
            got = backend.count_differences(t, ra, t2, rb)
            want = CpuBackend().count_differences(t, ra, t2, rb)
            assert got.dtype == want.dtype == np.uint64 and np.array_equal(got, want)
            if ra == rb:  # exactly the channels of the two moved cells (scales are > 0)
                assert got[3] == np.count_nonzero(gi == 0) and got[40] == np.count_nonzero(
                    gi == 2) and got.sum() == got[3] + got[40]


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
    real = cupy_backend.CupyBackend.count_differences

    def one_off(self, a, rule_a, b, rule_b):
        counts = real(self, a, rule_a, b, rule_b)
        counts[0] += rule_a == ZeroRule.V1_WRAP  # the device sees one weight differ there
        return counts
    monkeypatch.setattr(cupy_backend.CupyBackend, "count_differences", one_off)
    with pytest.raises(FindingError) as e:
        convert(CKPT / "b4-sym-noact-gptq-single", tmp_path / "o", backend="cupy")
    assert e.value.finding.code == "GQ503" and not (tmp_path / "o").exists()
