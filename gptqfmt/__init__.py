"""gptqfmt: inspect, verify and convert GPTQ checkpoints stored as safetensors.

Library entry points:
    inspect(path)                       -> InspectResult (call .to_json() for the JSON document)
    detect(path, full=False)            -> Detection: gptq / gptq_v2 / ambiguous, with evidence
    validate(path)                      -> Report: every finding of `gptqfmt verify`
    convert(src, dst, to="gptq_v2")     -> ConvertReport (streamed, verified, atomic)
    doctor(path, runtime="vllm")        -> Diagnosis: will that runtime compute the right
                                        weights, and the plan (fix=True, dst=...: carried out)
    convert_qzeros(qzeros, bits, src, dst)  2-D int8..int64 numpy array or torch tensor in,
                                        same type out (UsageError otherwise)
    open_checkpoint(path)               -> Checkpoint (modules, config, zero-copy tensor views)
    pack(codes, bits, word_bits, axis)  / unpack(words, bits, axis)
"""
import os

from .bits.packing import pack, unpack
from .conversion import ConvertReport, NotRepresentable, convert, convert_qzeros
from .detection.decide import ModuleVerdict
from .detection.pool import Detection
from .doctor import Diagnosis, doctor
from .errors import FindingError, GptqfmtError, UsageError
from .findings import CATALOGUE, Finding
from .formats.gptq.checkpoint import Checkpoint, Module, open_checkpoint
from .ops.inspect import InspectResult
from .ops.inspect import inspect_checkpoint as inspect
from .ops.verify import Report, validate
from .version import __version__


def detect(path: str | os.PathLike[str], full: bool = False) -> Detection:
    """The zero-point convention of the checkpoint at `path`, from its data.

    `full=False` reads every qzeros and a sample of qweight (what inspect does); `full=True`
    reads all of qweight (what verify does)."""
    from .detection.read import detect_checkpoint
    from .formats.open import open_labelled

    src, ckpt = open_labelled(path)
    try:
        return detect_checkpoint(ckpt, full=full)
    finally:
        src.close()


__all__ = ["CATALOGUE", "Checkpoint", "ConvertReport", "Detection", "Diagnosis", "NotRepresentable",
           "convert", "convert_qzeros", "doctor", "Finding", "FindingError", "GptqfmtError",
           "InspectResult", "Module", "ModuleVerdict", "Report", "UsageError", "__version__",
           "detect", "inspect", "open_checkpoint", "pack", "unpack", "validate"]
