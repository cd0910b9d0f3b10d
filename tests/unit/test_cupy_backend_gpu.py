"""The CuPy backend on a GPU: the same bits as the CPU twin on every fixture.

Marked `gpu`: skipped without a CUDA device and CuPy, and failed instead when
GPTQFMT_REQUIRE_GPU=1 (scripts/gpu-check.sh sets it, so a broken CuPy cannot hide as skips).
"""
import numpy as np
import pytest

from gptqfmt.bits.conventions import ZeroRule
from gptqfmt.formats.gptq.checkpoint import open_checkpoint
from gptqfmt.formats.model import F16, F32
from gptqfmt.numerics.cpu import CpuBackend
from tests.support import CKPT, SPECS

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu():
    from gptqfmt.numerics.cupy_backend import CupyBackend
    return CupyBackend()


@pytest.mark.parametrize("name", sorted(SPECS))
def test_gpu_equals_cpu_on_every_fixture(gpu, name):
    """Every fixture (int8/16/64 words are repacked to the kernel's int32 on the host)."""
    cpu = CpuBackend()
    rng = np.random.default_rng(0)
    with open_checkpoint(CKPT / name) as ck:
        for m in ck.modules:
            t = ck.module_tensors(m)
            for x_kind in (F32, F16):
                x = rng.standard_normal((4, m.in_features)).astype(np.float32)
                if x_kind == F16:
                    x = x.astype(np.float16).view(np.uint16)
                for rule in ZeroRule:
                    a = gpu.gemm(x, x_kind, t, rule)
                    b = cpu.gemm(x, x_kind, t, rule)
                    assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), (m.name, rule)
                    wa = gpu.dequant(t, rule)
                    wb = cpu.dequant(t, rule)
                    assert np.array_equal(wa.view(np.uint32), wb.view(np.uint32))


def test_gpu_backend_checks_arguments(gpu):
    from gptqfmt.errors import UsageError
    with open_checkpoint(CKPT / "b4-sym-act-gptq-sharded") as ck:
        m = ck.modules[0]
        t = ck.module_tensors(m)
        with pytest.raises(UsageError):
            gpu.gemm(np.zeros((17, m.in_features), np.float32), F32, t, 0)
        with pytest.raises(UsageError):
            gpu.gemm(np.zeros((2, m.in_features + 1), np.float32), F32, t, 0)


def test_verify_against_on_gpu(run_cli, tmp_path):
    from gptqfmt.conversion import convert
    convert(CKPT / "b4-sym-act-gptq-sharded", tmp_path / "o")
    r = run_cli("verify", CKPT / "b4-sym-act-gptq-sharded", "--against", tmp_path / "o",
                "--backend", "cupy")
    assert r.exit_code == 0 and "backend cupy" in r.stdout


def test_convert_gate_on_gpu(tmp_path):
    from gptqfmt.conversion import convert
    rep = convert(CKPT / "b4-asym-act-gptq_v2-sharded", tmp_path / "o", to="gptq_v2",
                  backend="cupy")
    assert rep.backend == "cupy" and rep.gate.ok and "CUDA kernel" in rep.gate.method


@pytest.mark.parametrize("src, to", [("ckpt/b3-asym-noact-gptq_v2-sharded", "compressed-tensors"),
                                     ("formats/awq-b4-g32", "gptq_v2"),
                                     ("formats/ct-b4-asym-actorder-g32", "gptq_v2")])
def test_convert_between_formats_gate_on_gpu(tmp_path, run_cli, src, to):
    """The gate between formats runs the kernel on every column of both sides' one model."""
    from gptqfmt.conversion import convert
    from tests.support import FIXTURES
    rep = convert(FIXTURES / src, tmp_path / "o", to=to, backend="cupy")
    assert rep.backend == "cupy" and rep.gate.ok and "CUDA kernel" in rep.gate.method
    r = run_cli("verify", FIXTURES / src, "--against", tmp_path / "o", "--backend", "cupy")
    assert r.exit_code == 0 and "backend cupy" in r.stdout
