"""Checkpoint formats as readers and writers of one module model (model.py).

    gptq, gptq_v2        GPTQ's packing in its two zero-point conventions (gptq/)
    compressed-tensors   pack-quantized WnA16 (ct.py)
    awq                  AutoAWQ GEMM, read only (awq.py)

open_source (open.py) is the one way a command reads a checkpoint. A new format is one module
with a Source class (and a Writer to write it), a line in open.py's sniff and reader, and, when
it is written, one entry in WRITERS.
"""
from __future__ import annotations

from ..bits.conventions import CONVENTIONS
from .ct import CtWriter
from .gptq.writer import GptqWriter
from .model import AWQ, COMPRESSED_TENSORS, FORMATS, GPTQ, GPTQ_V2, QuantModule
from .open import open_source
from .relayout import Banded
from .source import Source, Writer, module_tensors

# The formats convert re-lays a module out into (its tensors, its config); between gptq and
# gptq_v2 only the zero points change (conversion/write.py).
WRITERS: dict[str, Writer] = {w.format: w for w in (GptqWriter(), CtWriter())}
TARGETS = CONVENTIONS + tuple(f for f in WRITERS if f not in CONVENTIONS)  # what convert writes

__all__ = ["AWQ", "COMPRESSED_TENSORS", "FORMATS", "GPTQ", "GPTQ_V2", "TARGETS", "WRITERS",
           "Banded", "QuantModule", "Source", "Writer", "module_tensors", "open_source"]
