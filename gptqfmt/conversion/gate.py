"""The verify gate: prove that DST computes what SRC computed before DST becomes visible.

Exact CPU path:
1. every shard's header and every byte outside qzeros are identical to SRC (checked by reading
   what was written, not trusted from the copy);
2. per module, the effective zero point of every cell is the same under each file's convention
   (vLLM's reading: gptq Z = s + 1, gptq_v2 Z = s), except the cells the report lists as lossy;
   with qweight, scales and g_idx byte-identical this is equality of the dequantized weights;
3. an independent confirmation with runtime semantics: Y = X @ W for a random X over a sample of
   output columns, W dequantized from each file's own tensors in fp32, compared bitwise.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..gptq.checkpoint import Checkpoint, Module
from ..gptq.detect import stored_fields
from ..gptq.evidence import module_g_idx
from ..gptq.packing import unpack
from ..safetensors_io.dtypes import bf16_to_f32

GEMM_COLUMNS = 16
GEMM_ROWS = 4
CMP_CHUNK = 16 << 20


def effective_zeros(stored: np.ndarray, convention: str) -> np.ndarray:
    return stored.astype(np.int32) + (1 if convention == "gptq" else 0)


@dataclass
class ModuleCheck:
    name: str
    cells: int
    lossy_cells: int
    zeros_equal: bool
    gemm_equal: bool
    max_abs_err: float = 0.0
    rel_err: float = 0.0

    def to_json(self):
        return dict(self.__dict__)


@dataclass
class GateResult:
    method: str
    bytes_compared: int = 0
    modules: list[ModuleCheck] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def compare_bytes(src: Checkpoint, dst: Checkpoint, result: GateResult) -> None:
    """Headers and all non-qzeros bytes identical, file by file."""
    for name, fs in src.store.files.items():
        fd = dst.store.files.get(name)
        if fd is None or fd.size != fs.size:
            result.failures.append(f"{name}: missing or of another size in the output")
            continue
        skip = sorted((fs.header.data_start + i.begin, fs.header.data_start + i.end)
                      for t, i in fs.tensors.items() if t.endswith(".qzeros"))
        a, b = np.frombuffer(fs._map(), np.uint8), np.frombuffer(fd._map(), np.uint8)
        pos = 0
        for lo, hi in skip + [(fs.size, fs.size)]:
            for start in range(pos, lo, CMP_CHUNK):
                stop = min(lo, start + CMP_CHUNK)
                if not np.array_equal(a[start:stop], b[start:stop]):
                    result.failures.append(f"{name}: bytes {start}..{stop} differ outside qzeros")
                    break
            result.bytes_compared += lo - pos
            pos = hi


def check_module(src: Checkpoint, dst: Checkpoint, m: Module, src_conv: str, dst_conv: str,
                 lossy_expected: np.ndarray | None, rng: np.random.Generator) -> ModuleCheck:
    s_src = stored_fields(src.view(m.tensors["qzeros"]), m.bits)
    s_dst = stored_fields(dst.view(m.tensors["qzeros"]), m.bits)
    z_src, z_dst = effective_zeros(s_src, src_conv), effective_zeros(s_dst, dst_conv)
    differ = z_src != z_dst
    lossy = lossy_expected if lossy_expected is not None else np.zeros_like(differ)
    zeros_equal = bool(np.array_equal(differ, lossy))
    cols = _columns(m.out_features, np.flatnonzero(lossy.any(axis=0)), rng)
    x = rng.standard_normal((GEMM_ROWS, m.in_features)).astype(np.float32)
    y_src = x @ dequant_columns(src, m, z_src, cols)
    y_dst = x @ dequant_columns(dst, m, z_dst, cols)
    err = np.abs(y_dst - y_src)
    norm = float(np.linalg.norm(y_src)) or 1.0
    return ModuleCheck(m.name, int(differ.size), int(lossy.sum()), zeros_equal,
                       bool(np.array_equal(y_src, y_dst)), float(err.max(initial=0.0)),
                       float(np.linalg.norm(y_dst - y_src)) / norm)


def _columns(n: int, must: np.ndarray, rng) -> np.ndarray:
    picked = set(must[:GEMM_COLUMNS // 2].tolist())
    picked |= set(rng.choice(n, size=min(n, GEMM_COLUMNS), replace=False).tolist())
    return np.array(sorted(picked))


def dequant_columns(ckpt: Checkpoint, m: Module, zeros: np.ndarray,
                    cols: np.ndarray) -> np.ndarray:
    """W[:, cols] in fp32 from the file's qweight, scales and g_idx: scale * (q - Z)."""
    qw = ckpt.view(m.tensors["qweight"])[:, cols]
    q = unpack(np.ascontiguousarray(qw), m.bits, axis=0).astype(np.float32)
    sc_raw = ckpt.view(m.tensors["scales"])[:, cols]
    sc = bf16_to_f32(sc_raw) if ckpt.store.info(m.tensors["scales"]).dtype == "BF16" \
        else sc_raw.astype(np.float32)
    g = module_g_idx(ckpt, m)
    return sc[g] * (q - zeros[:, cols][g].astype(np.float32))
