"""gptqfmt: inspect, verify and convert GPTQ checkpoints stored as safetensors.

Library entry points:
    inspect(path)                       -> InspectResult (call .to_json() for the JSON document)
    open_checkpoint(path)               -> Checkpoint (modules, config, zero-copy tensor views)
    pack(codes, bits, word_bits, axis)  / unpack(words, bits, axis)
"""
from .errors import FindingError, GptqfmtError, UsageError
from .findings import CATALOGUE, Finding
from .gptq.checkpoint import Checkpoint, Module, open_checkpoint
from .gptq.packing import pack, unpack
from .inspection import InspectResult
from .inspection import inspect_checkpoint as inspect
from .version import __version__

__all__ = ["CATALOGUE", "Checkpoint", "Finding", "FindingError", "GptqfmtError", "InspectResult",
           "Module", "UsageError", "__version__", "inspect", "open_checkpoint", "pack", "unpack"]
