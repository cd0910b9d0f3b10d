"""kernels/gptq_dequant.h compiled for the host: its arithmetic against the numpy core, in CI."""
import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from gptqfmt.bits.packing import unpack
from gptqfmt.numerics.cpu import TILE_K
from gptqfmt.resources import data_dir

CC = shutil.which("g++") or shutil.which("cc")


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if CC is None:
        pytest.skip("no host C/C++ compiler")
    src = data_dir("kernels") / "host_shim.c"
    out = tmp_path_factory.mktemp("k") / "libgq.so"
    lang = ["-x", "c++"] if CC.endswith("g++") else []
    subprocess.run([CC, *lang, "-O2", "-ffp-contract=off", "-shared", "-fPIC", "-I",
                    str(src.parent), str(src), "-o", str(out)], check=True)
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


def test_half_and_bfloat16_widening_is_exact_for_every_value(lib):
    bits = np.arange(1 << 16, dtype=np.uint16)
    for kind, want in ((1, bits.view(np.float16).astype(np.float32)),
                       (2, (bits.astype(np.uint32) << 16).view(np.float32))):
        out = np.zeros(bits.size, np.float32)
        lib.gq_host_load(ptr(bits), ctypes.c_int64(bits.size), ctypes.c_int(kind), ptr(out))
        assert np.array_equal(out.view(np.uint32)[~np.isnan(want)],
                              want.view(np.uint32)[~np.isnan(want)])
        assert np.isnan(out[np.isnan(want)]).all()


def random_module(rng, bits, k=96, n=64, groups=3, act=True):
    from gptqfmt.bits.packing import pack
    codes = rng.integers(0, 2**bits, (k, n))
    zeros = rng.integers(0, 2**bits, (groups, n))
    g = np.repeat(np.arange(groups), k // groups).astype(np.int32)
    if act:
        g = rng.permutation(g).astype(np.int32)
    return (pack(codes, bits, 32, 0), pack(zeros, bits, 32, 1),
            (rng.random((groups, n)) * 0.1).astype(np.float32), g)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("rule", [0, 1, 2])
@pytest.mark.parametrize(("scale_kind", "x_kind"), [(0, 0), (1, 1), (2, 2), (1, 0)])
@pytest.mark.parametrize("k", [96, 864])  # 864 = 512 + 352: a second tile, short
def test_kernel_gemm_body_equals_cpu_twin_bitwise(lib, bits, rule, scale_kind, x_kind, k):
    """The tiled kernel's bodies (tiles summed in k order, then added in tile order) against
    the CPU twin, bit for bit: one tile, and two with the second short."""
    from gptqfmt.numerics.cpu import CpuBackend
    rng = np.random.default_rng(bits * 10 + rule)
    qw, qz, sc, g = random_module(rng, bits, k=k)
    to_raw = {0: lambda a: a.astype(np.float32),
              1: lambda a: a.astype(np.float16).view(np.uint16),
              2: lambda a: (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)}
    scales = np.ascontiguousarray(to_raw[scale_kind](sc))
    x = np.ascontiguousarray(to_raw[x_kind](rng.standard_normal((3, qw.shape[0] * 32 // bits))))
    k, n = x.shape[1], qw.shape[1]
    y = np.zeros((3, n), np.float32)
    tiles = -(-k // TILE_K)
    partial = np.zeros((tiles, 3, n), np.float32)
    qwu, qzu = np.ascontiguousarray(qw.view(np.uint32)), np.ascontiguousarray(qz.view(np.uint32))
    lib.gq_host_gemm_tiles(ptr(x), ctypes.c_int(x_kind), ptr(qwu), ptr(qzu), ptr(scales),
                           ctypes.c_int(scale_kind), ptr(g), ptr(partial), ctypes.c_int(3),
                           ctypes.c_int64(k), ctypes.c_int64(n), ctypes.c_int(bits),
                           ctypes.c_int(rule))
    lib.gq_host_sum_tiles(ptr(partial), ptr(y), ctypes.c_int64(tiles), ctypes.c_int(3),
                          ctypes.c_int64(n))
    from gptqfmt.formats.model import Kind, ModuleTensors
    twin = CpuBackend().gemm(x, Kind(x_kind), ModuleTensors(qw, qz, scales, Kind(scale_kind), g,
                                                            bits), rule)
    assert np.array_equal(y.view(np.uint32), twin.view(np.uint32))
    # and the twin against a slow, obviously right float64 reference (rounding only)
    from gptqfmt.bits.packing import unpack
    zz = unpack(qz, bits, 1).astype(np.int64)
    zz = {0: zz, 1: zz + 1, 2: (zz + 1) & (2**bits - 1)}[rule]
    w = np.zeros((k, n))
    q = unpack(qw, bits, 0)
    from gptqfmt.numerics.cpu import to_f32
    s = to_f32(scales, scale_kind).astype(np.float64)
    for kk in range(k):
        w[kk] = s[g[kk]] * (q[kk].astype(np.int64) - zz[g[kk]])
    ref = to_f32(x, x_kind).astype(np.float64) @ w
    assert np.allclose(twin, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_cuda_kernel_compiles_without_fused_multiply_add(tmp_path):
    """The GPU build must round like the CPU twin: no FMA in the PTX of gptq_gemm.cu."""
    kdir = data_dir("kernels")
    ptx = tmp_path / "k.ptx"
    subprocess.run(["nvcc", "-std=c++14", "--fmad=false", "-I", str(kdir), "--ptx",
                    str(kdir / "gptq_gemm.cu"), "-o", str(ptx)], check=True, timeout=600)
    text = ptx.read_text()
    for name in ("gptq_gemm_tiles", "gptq_sum_tiles", "gptq_count_differences",
                 "gptq_dequant"):
        assert f".entry {name}" in text
    assert "fma." not in text and "mul.rn.f32" in text and "add.rn.f32" in text
