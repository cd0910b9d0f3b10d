"""The catalogue of stable finding codes, and the Finding record.

Codes never change meaning once released. Ranges: GQ1xx container and index, GQ2xx configs,
GQ3xx tensors and shapes, GQ4xx zero points and conversion, GQ5xx numerical, GQ6xx runtimes.
The README's catalogue table is checked against this module by the tests.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ERROR, WARNING, INFO = "error", "warning", "info"


@dataclass(frozen=True)
class Code:
    code: str
    severity: str
    title: str
    hint: str | None = None    # the next step, where one is the same for every finding of it


_CATALOGUE = [
    # GQ1xx: safetensors container (one code per rule of the reference reader) and sharding
    Code("GQ101", ERROR, "file shorter than the 8-byte header length"),
    Code("GQ102", ERROR, "header length above the 100,000,000-byte limit"),
    Code("GQ103", ERROR, "header extends past the end of the file"),
    Code("GQ104", ERROR, "header is not valid UTF-8"),
    Code("GQ105", ERROR, "header is not valid JSON"),
    Code("GQ106", ERROR, "header JSON does not have the safetensors structure"),
    Code("GQ107", ERROR, "duplicate key in header"),
    Code("GQ108", ERROR, "unknown dtype"),
    Code("GQ109", ERROR, "invalid shape"),
    Code("GQ110", ERROR, "invalid data_offsets"),
    Code("GQ111", ERROR, "shape times dtype size overflows"),
    Code("GQ112", ERROR, "data_offsets span differs from shape times dtype size"),
    Code("GQ113", ERROR, "tensor data not contiguous (hole, overlap or alias)"),
    Code("GQ114", ERROR, "tensor data extends past the end of the file (truncated)"),
    Code("GQ115", ERROR, "trailing bytes after the last tensor"),
    Code("GQ116", ERROR, "__metadata__ is not a map of strings to strings"),
    Code("GQ117", ERROR, "file is a git-LFS pointer, not safetensors data"),
    Code("GQ118", ERROR, "file cannot be read"),
    Code("GQ120", ERROR, "index file is not valid JSON or lacks weight_map"),
    Code("GQ121", ERROR, "index names a shard by an unsafe path"),
    Code("GQ122", ERROR, "index names a shard that does not exist"),
    Code("GQ123", ERROR, "tensor is not in the shard the index names"),
    Code("GQ124", ERROR, "tensor in a shard is missing from the index"),
    Code("GQ125", WARNING, "shard not referenced by the index"),
    Code("GQ126", ERROR, "tensor stored in more than one shard"),
    Code("GQ127", WARNING, "index total_size differs from the sum of tensor sizes"),
    Code("GQ128", ERROR, "no safetensors file found"),
    Code("GQ129", ERROR, "file differs from the hash its Hugging Face cache entry records"),
    Code("GQ130", ERROR, "file is in another format (GGUF, PyTorch, pickle, ZIP), not safetensors"),
    Code("GQ131", ERROR, "one shard of an indexed checkpoint given alone (pass the directory)"),
    Code("GQ132", ERROR, "Hugging Face repo cannot be read over HTTP (access, missing, network)"),
    # GQ2xx: configs
    Code("GQ201", ERROR, "config file is not valid JSON"),
    Code("GQ202", ERROR, "config violates its schema"),
    Code("GQ203", ERROR, "not a GPTQ-packed checkpoint"),
    Code("GQ204", ERROR, "format and checkpoint_format disagree"),
    Code("GQ205", ERROR, "config files disagree"),
    Code("GQ206", WARNING, "no quantization config found"),
    Code("GQ207", ERROR, "invalid dynamic override pattern"),
    Code("GQ208", WARNING, "config key missing; runtimes disagree on its default"),
    Code("GQ209", ERROR, "format set without checkpoint_format; loaders that read only "
         "checkpoint_format read gptq"),
    Code("GQ210", ERROR, "compressed-tensors or AWQ config is not a scheme gptqfmt reads"),
    Code("GQ211", ERROR, "a pack-quantized module is not targeted by a config group, or ignored"),
    Code("GQ212", ERROR, "config files declare different zero-point conventions; loaders read "
         "different ones"),
    Code("GQ213", INFO, "auto-round packing_format not set; its loaders read auto_round:auto_gptq "
         "(gptq)"),
    Code("GQ214", ERROR, "auto-round packing_format is not one gptqfmt knows"),
    Code("GQ215", ERROR, "auto-round packing_format and checkpoint_format/format disagree"),
    # GQ3xx: tensors and shapes
    Code("GQ301", ERROR, "quantized module lacks a tensor"),
    Code("GQ302", ERROR, "tensor has the wrong dtype"),
    Code("GQ303", ERROR, "tensor shapes of a module are inconsistent"),
    Code("GQ304", ERROR, "declared bits differ from the shapes"),
    Code("GQ305", ERROR, "declared group_size differs from the shapes"),
    Code("GQ306", ERROR, "declared desc_act differs from g_idx"),
    Code("GQ307", ERROR, "declared pack_dtype differs from the word dtype"),
    Code("GQ308", WARNING, "g_idx missing; treated as trivial"),
    Code("GQ309", ERROR, "g_idx invalid"),
    Code("GQ310", ERROR, "3-bit packing needs int32 words"),
    Code("GQ311", INFO, "quantized lm_head; many runtimes refuse it"),
    Code("GQ312", WARNING, "in or out features not a multiple of 32"),
    Code("GQ313", WARNING, "module quantized although dynamic excludes it"),
    Code("GQ314", ERROR, "no quantized module found"),
    Code("GQ315", WARNING, "desc_act is true but g_idx is trivial"),
    Code("GQ316", INFO, "quantized router gate; many runtimes refuse it"),
    Code("GQ317", ERROR, "bits set past the last value of a packed stream (another layout)"),
    Code("GQ318", ERROR, "qweight or scales of a module is all zeros"),
    Code("GQ319", ERROR, "compressed-tensors packed shapes fit both layouts (padded <= 0.17, "
         "dense >= 0.18) and nothing decides"),
    Code("GQ320", WARNING, "compressed-tensors padded layout (<= 0.17) at 3/5/6/7 bits: vLLM "
         "expects the dense one and refuses it"),
    # GQ4xx: zero points
    Code("GQ401", ERROR, "declared zero-point convention contradicts the data"),
    Code("GQ402", WARNING, "zero-point convention not decidable from the data"),
    Code("GQ403", ERROR, "sym is true but zero points are not the symmetric constant"),
    Code("GQ404", ERROR, "modules disagree on the zero-point convention"),
    Code("GQ405", ERROR, "zero points corrupted by a known writer bug"),
    Code("GQ406", WARNING, "gptq zero-point fields at maxq: runtimes read them differently"),
    Code("GQ407", INFO, "gptq_v2 zero points of 0: not representable in gptq"),
    Code("GQ408", ERROR, "convert --from auto: the declared convention contradicts the data"),
    Code("GQ409", ERROR, "gptq fields at maxq: no lossless gptq_v2 value (needs --allow-lossy)"),
    Code("GQ410", ERROR, "gptq_v2 zero points of 0: no gptq encoding (needs --allow-lossy)"),
    Code("GQ411", WARNING, "lossy conversion performed (--allow-lossy)"),
    Code("GQ412", ERROR, "a module's zero points match neither convention"),
    Code("GQ413", WARNING, "convert --from names a convention the data contradict"),
    Code("GQ414", WARNING, "a module's zero points sit unusually far from either convention"),
    Code("GQ415", ERROR, "convert: no config, and the modules' shapes disagree on one config"),
    Code("GQ416", ERROR, "fix-label: the data's convention is undecidable"),
    Code("GQ417", ERROR, "fix-label: --to names a convention the data contradict"),
    Code("GQ418", ERROR, "compressed-tensors codes clamped to the signed range (exporter bug)"),
    Code("GQ419", ERROR, "convert: the target format has no lossless form for a module"),
    Code("GQ420", WARNING, "an interrupted in-place convert was rolled back or forward"),
    Code("GQ421", ERROR, "an in-place convert's journal cannot be applied"),
    Code("GQ422", ERROR, "convert --from names a convention the data contradict (refused)"),
    Code("GQ423", WARNING, "maxq fields above a zero of 0 whose codes cannot clear a writer bug"),
    Code("GQ424", WARNING, "inspect's sample of the codes cannot clear a writer bug (run verify)"),
    # GQ5xx: numerical
    Code("GQ501", ERROR, "scales NaN, infinite or zero"),
    Code("GQ502", ERROR, "dequantized weights overflow float16"),
    Code("GQ503", ERROR, "converted output failed verification; nothing was written"),
    Code("GQ504", ERROR, "verify --against: a module computes another Y = X @ W"),
    Code("GQ505", ERROR, "verify --reference: a module's runtime output is inconsistent"),
    Code("GQ506", WARNING, "gptq zero points of 0 stored as 0 (read as 1) by a clamping writer"),
    Code("GQ507", ERROR, "verify --against: a tensor outside the modules or a config differs"),
    # GQ6xx: runtimes (verify --runtime): one code per reason a named runtime fails
    Code("GQ601", ERROR, "runtime would not load the checkpoint"),
    Code("GQ602", ERROR, "runtime reads the zero points as the other convention",
         "run `gptqfmt fix-label PATH` to set the label the data have"),
    Code("GQ603", ERROR, "runtime ignores qzeros that are not the symmetric constant",
         "set sym=false so that no runtime takes Marlin, or re-export"),
    Code("GQ604", ERROR, "runtime reads stored maxq fields as another Z than the data mean",
         "convert to gptq_v2 (`gptqfmt convert`), which stores Z = 0 exactly"),
    Code("GQ605", ERROR,
         "runtime's zero-point arithmetic corrupts fields (carries, borrows, masks)",
         "convert to gptq_v2 (`gptqfmt convert`): this runtime then reads the fields as they "
         "are"),
    Code("GQ606", WARNING, "another path of the runtime (other GPU or option) would fail"),
    Code("GQ607", WARNING, "runtime's decoding not decidable: the data's convention is not"),
]

CATALOGUE: dict[str, Code] = {c.code: c for c in _CATALOGUE}


@dataclass(frozen=True)
class Finding:
    code: str
    message: str
    file: str | None = None
    tensor: str | None = None
    hint: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.code not in CATALOGUE:
            raise ValueError(f"unknown finding code {self.code}")

    @property
    def severity(self) -> str:
        return CATALOGUE[self.code].severity

    def sort_key(self) -> tuple[str, str, str, str]:
        return (self.file or "", self.tensor or "", self.code, self.message)

    def one_line(self) -> str:
        where = self.file or ""
        if self.tensor:
            where = f"{where}::{self.tensor}" if where else self.tensor
        prefix = f"{where}: " if where else ""
        return f"{prefix}{self.code} {self.message}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "severity": self.severity, "file": self.file,
               "tensor": self.tensor, "message": self.message}
        if self.hint:
            out["hint"] = self.hint
        if self.details:
            out["details"] = self.details
        return out
