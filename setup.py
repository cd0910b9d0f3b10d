"""The package list and the compiled extensions live here; everything else is in
pyproject.toml.

Subpackages of gptqfmt are discovered, never listed by hand (a hand-kept list once shipped a
wheel without gptqfmt.verify, now gptqfmt.numerics). The two data packages are top-level
folders (schemas/, kernels/) mapped into the wheel by pyproject.toml's package-dir, so
discovery cannot see them under gptqfmt/ and they are named here.

gptqfmt.bits._native (kernels/native_module.c over kernels/gptq_sums.h and gptq_relayout.h)
and gptqfmt.safetensors_io._native (kernels/safetensors_native.c: a safetensors header read in
one pass, small ranges surveyed, the journal's CRC-32 over kernels/gq_crc32.h) are optional:
where no C compiler or Python headers are found the build says so and goes on, and gptqfmt
runs the numpy loops (gptqfmt.bits.native), the Python header parser and zlib's CRC-32
instead.
"""
from setuptools import Extension, find_packages, setup

DATA_PACKAGES = ["gptqfmt.schemas", "gptqfmt.kernels"]

NATIVE = Extension(
    "gptqfmt.bits._native",
    sources=["kernels/native_module.c"],
    depends=["kernels/gptq_sums.h", "kernels/gptq_relayout.h", "kernels/gptq_dequant.h"],
    include_dirs=["kernels"],
    extra_compile_args=["-O3"],
    optional=True,
)

SAFETENSORS = Extension(
    "gptqfmt.safetensors_io._native",
    sources=["kernels/safetensors_native.c"],
    depends=["kernels/gq_crc32.h"],
    include_dirs=["kernels"],
    extra_compile_args=["-O3"],
    optional=True,
)

setup(packages=find_packages(include=["gptqfmt", "gptqfmt.*"]) + DATA_PACKAGES,
      ext_modules=[NATIVE, SAFETENSORS])
