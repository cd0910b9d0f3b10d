"""Only the package list lives here; everything else is in pyproject.toml.

Subpackages of gptqfmt are discovered, never listed by hand (a hand-kept list once shipped a
wheel without gptqfmt.verify, now gptqfmt.numerics). The two data packages are top-level
folders (schemas/, kernels/) mapped into the wheel by pyproject.toml's package-dir, so
discovery cannot see them under gptqfmt/ and they are named here.
"""
from setuptools import find_packages, setup

DATA_PACKAGES = ["gptqfmt.schemas", "gptqfmt.kernels"]

setup(packages=find_packages(include=["gptqfmt", "gptqfmt.*"]) + DATA_PACKAGES)
