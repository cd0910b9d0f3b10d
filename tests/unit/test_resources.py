"""The data shipped with the package (gptqfmt/resources.py): the kernels' limits read from their
header."""
import pytest

from tests.support import ROOT


def test_kernel_limits_are_read_from_the_header():
    from gptqfmt.resources import kernel_constant
    header = (ROOT / "kernels" / "gptq_dequant.h").read_text()
    assert kernel_constant("GQ_MAX_M") == 16 and "#define GQ_MAX_M 16" in header
    for f in ("gptq_gemm.cu", "host_shim.c"):  # both use the one definition
        text = (ROOT / "kernels" / f).read_text()
        assert "GQ_MAX_M" in text and "#define GQ_MAX_M" not in text and "acc[16]" not in text
    with pytest.raises(LookupError, match="defines no integer GQ_NOPE"):
        kernel_constant("GQ_NOPE")
