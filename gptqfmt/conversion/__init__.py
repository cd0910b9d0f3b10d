"""Lossless zero-point conversion between gptq and gptq_v2 (and back, with an exact loss report)."""
from ..bits.conventions import convert_fields
from ..errors import NotRepresentable
from .fields import convert_qzeros
from .report import ConvertReport
from .run import convert

__all__ = ["ConvertReport", "NotRepresentable", "convert", "convert_fields", "convert_qzeros"]
