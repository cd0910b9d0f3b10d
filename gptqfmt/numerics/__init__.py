"""Numerical equivalence: dequant + GEMM with the runtimes' zero-point semantics.

Backends: `cpu` (numpy, exact twin of the kernel's arithmetic and order) and `cupy` (the
RawKernel in kernels/gptq_gemm.cu). CuPy is imported only when asked for; everything works
without it.
"""
from __future__ import annotations

from ..errors import UsageError
from .backend import Backend

__all__ = ["Backend", "get_backend"]


def get_backend(name: str = "auto") -> Backend:
    """The backend object for `name` (auto: cupy when a CUDA device is usable, else cpu)."""
    from . import cpu

    if name == "cpu":
        return cpu.CpuBackend()
    if name in ("cupy", "auto"):
        try:
            from .cupy_backend import CupyBackend

            return CupyBackend()
        except Exception as e:  # noqa: BLE001 - no CuPy, no driver, no device: all "unavailable"
            if name == "cupy":
                raise UsageError(f"backend cupy is unavailable: {_why_unavailable(e)}") from None
            return cpu.CpuBackend()
    raise UsageError(f"unknown backend {name!r}; expected auto, cpu or cupy")


def _why_unavailable(e: Exception) -> str:
    """What went wrong with CuPy, and the next step."""
    if isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] == "cupy":
        return ("CuPy is not installed; install the extra that matches your CUDA: "
                "pip install 'gptqfmt[cuda12]' (or 'gptqfmt[cuda13]'), or use --backend cpu")
    return (f"{type(e).__name__}: {e}; check that a CUDA device and driver are visible "
            "(nvidia-smi), or use --backend cpu")
