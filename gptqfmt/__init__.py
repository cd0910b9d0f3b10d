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
from __future__ import annotations

import os
import sys
import types
from typing import TYPE_CHECKING, Any

from .version import __version__

if TYPE_CHECKING:
    from .bits.packing import pack, unpack
    from .conversion import ConvertReport, NotRepresentable, convert, convert_qzeros
    from .detection.decide import ModuleVerdict
    from .detection.pool import Detection
    from .doctor import Diagnosis, doctor, doctor_remote
    from .errors import FindingError, GptqfmtError, RemoteError, UsageError
    from .findings import CATALOGUE, Finding
    from .formats.gptq.checkpoint import Checkpoint, Module, open_checkpoint
    from .ops.inspect import InspectResult
    from .ops.inspect import inspect_checkpoint as inspect
    from .ops.remote import inspect_remote
    from .ops.scan import ScanResult, scan
    from .ops.verify import Report, validate

# Each export but detect and __version__: (module, name there). Imported on first use, so that
# `import gptqfmt` (and the command line's start) does not load numpy and the whole library.
_LAZY: dict[str, tuple[str, str]] = {
    "pack": (".bits.packing", "pack"), "unpack": (".bits.packing", "unpack"),
    **{n: (".conversion", n) for n in ("ConvertReport", "NotRepresentable", "convert",
                                        "convert_qzeros")},
    "ModuleVerdict": (".detection.decide", "ModuleVerdict"),
    "Detection": (".detection.pool", "Detection"),
    **{n: (".doctor", n) for n in ("Diagnosis", "doctor", "doctor_remote")},
    **{n: (".errors", n) for n in ("FindingError", "GptqfmtError", "RemoteError",
                                    "UsageError")},
    "CATALOGUE": (".findings", "CATALOGUE"), "Finding": (".findings", "Finding"),
    **{n: (".formats.gptq.checkpoint", n) for n in ("Checkpoint", "Module", "open_checkpoint")},
    "InspectResult": (".ops.inspect", "InspectResult"),
    "inspect": (".ops.inspect", "inspect_checkpoint"),
    "inspect_remote": (".ops.remote", "inspect_remote"),
    **{n: (".ops.scan", n) for n in ("ScanResult", "scan")},
    "Report": (".ops.verify", "Report"), "validate": (".ops.verify", "validate"),
}


def __getattr__(name: str) -> Any:
    """An export, imported from its module the first time it is asked for."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module, attr = _LAZY[name]
    value = getattr(importlib.import_module(module, __name__), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """This package as a module object: importing the submodule gptqfmt.doctor binds the name
    `doctor` here to the function it defines, the export, and not to the submodule."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _LAZY.get(name, ("", ""))[0] == f".{name}":
            value = getattr(value, _LAZY[name][1])
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


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
           "convert", "convert_qzeros", "doctor", "doctor_remote", "Finding", "FindingError",
           "GptqfmtError", "InspectResult", "Module", "ModuleVerdict", "RemoteError", "Report",
           "ScanResult", "UsageError", "__version__", "detect", "inspect", "inspect_remote",
           "open_checkpoint", "pack", "unpack", "scan", "validate"]
