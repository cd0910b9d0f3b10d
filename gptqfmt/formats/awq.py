"""AutoAWQ GEMM (4-bit): reader into the one model (relayout.py has the nibble order).

AutoAWQ 0.2.9 (awq/modules/linear/gemm.py, WQLinear_GEMM) stores per quantized linear `P`
with weight [N, K] and group size gs:
    P.qweight  I32  [K, N/8]    codes, 8 output channels per word in AWQ_ORDER
    P.qzeros   I32  [K/gs, N/8] zero points, the same packing, stored as Z itself
    P.scales   F16  [K/gs, N]
    P.bias     F16  [N]         optional
and no g_idx; its config (quant_config.json, or config.json `quantization_config` as
transformers' AwqConfig writes it) says quant_method "awq", version "gemm", w_bit/bits 4,
q_group_size/group_size and zero_point.

`zero_point: false` names a symmetric quantizer, not a layout: AutoAWQ writes it only beside
version "marlin" (awq/modules/linear/marlin.py: qweight [K/16, 2N], no qzeros; gemm.py
from_linear asserts zeros, at casper-hansen/AutoAWQ v0.2.9 = 88e4c76b20755db2), while auto-round
writes it beside version "gemm" over GEMM tensors whose every zero point is 2^(bits-1)
(intel/auto-round v0.16.0, PyPI wheel sha256 750904817e750bfb: export_to_awq/export.py
L206-210; export_to_awq/utils.py WQLinear_GEMM.from_linear packs the constant zero). The
version and the tensors decide the layout; the zero points of a symmetric file must be that
constant (GQ403). vLLM reads them as stored: awq_marlin's uint4 needs zero points
(vllm-project/vllm@0322f292b76d, awq_marlin.py is_awq_marlin_compatible; utils/marlin_utils.py
query_marlin_supported_quant_types offers uint4b8 alone without them), so vLLM runs its AWQ
kernels, which always read qzeros.
"""
from __future__ import annotations

import numpy as np

from ..bits import unique
from ..bits.layout import trivial_g_idx
from ..bits.packing import constant_words
from ..findings import Finding
from ..safetensors_io.index import TensorStore
from .model import AWQ, QuantModule, discover
from .relayout import (
    AWQ_BITS,
    Banded,
    awq_qweight_bands,
    awq_qweight_differ,
    awq_qweight_to_gptq,
    awq_qweight_transposed,
    awq_words_to_gptq,
    words_differ,
)
from .source import ExactSource

# AutoAWQ's exllama, exllamav2 and ipex versions store GEMM's tensors and repack at load time;
# gemv, gemv_fast and marlin store other layouts (research: awq/modules/linear/*.py, 0.2.9)
VERSIONS = ("gemm", "exllama", "exllamav2", "ipex")


def parse_config(label: str, doc: dict) -> tuple[dict, list[Finding]]:
    """(bits, group_size, zero_point) of an AWQ config, with GQ210 for what is not GEMM 4-bit."""
    bits = doc.get("bits", doc.get("w_bit"))
    gs = doc.get("group_size", doc.get("q_group_size"))
    version = str(doc.get("version", "gemm")).lower()
    found = []
    hint = "convert it to GEMM with AutoAWQ first"
    if version not in VERSIONS:
        found.append(Finding("GQ210", f"AWQ version is {doc.get('version')!r}; gptqfmt reads the "
                             "GEMM layout (GEMV, Marlin and ExLlama versions pack differently)",
                             file=label, hint=hint))
    if bits not in (None, AWQ_BITS):
        found.append(Finding("GQ210", f"AWQ bits is {bits!r}; the GEMM layout is 4-bit",
                             file=label, hint=hint))
    # auto-round's own AWQ export (packing_format auto_round:auto_awq, open.py) writes sym
    # and no zero_point: sym false is AutoAWQ's zero_point true
    sym = doc.get("sym")
    zero_point = doc.get("zero_point", not sym if isinstance(sym, bool) else True)
    return {"bits": AWQ_BITS, "group_size": gs, "zero_point": zero_point,
            "modules_to_not_convert": doc.get("modules_to_not_convert") or []}, found


def looks_like(store: TensorStore) -> bool:
    """AWQ's shapes: qweight [K, N/8] beside scales [G, N] (GPTQ's qweight is [K*bits/32, N])."""
    for t in store.locations:
        if t.endswith(".qweight"):
            s = t[:-len("qweight")] + "scales"
            if s in store.locations:
                qw, sc = store.info(t).shape, store.info(s).shape
                return len(qw) == 2 and len(sc) == 2 and qw[1] * 8 == sc[1] and qw[1] != sc[1]
    return False


class AwqSource(ExactSource):
    """An AutoAWQ GEMM checkpoint, read module by module into the one model."""
    format = AWQ
    scale_axes = ("group", "column")

    def __init__(self, store: TensorStore, label: str | None, doc: dict,
                 config_files: list[str]):
        self.store, self.root, self.config_files = store, store.root, config_files
        self.path = store.root   # open_source sets the file where one was opened
        self.label = self.declared_by = label
        cfg, found = parse_config(label or "(no config)", doc)
        self.config = cfg
        self.findings = list(store.findings) + found
        self.modules, self.passthrough, any_found = discover(
            store, {r: r for r in ("qweight", "qzeros", "scales")}, self._module)
        self.other_tensors = self.passthrough
        if not any_found:
            self.findings.append(Finding("GQ314", "no tensor named *.qweight", file=label))

    def _module(self, p: str, names: dict[str, str]) -> QuantModule | None:
        st = self.store
        file = st.file_of(names["qweight"])

        def bad(code, msg, tensor=None):
            self.findings.append(Finding(code, msg, file=file, tensor=tensor or names["qweight"]))

        missing = [r for r in ("qzeros", "scales") if r not in names]
        if missing:
            bad("GQ301", f"lacks {', '.join(p + '.' + r for r in missing)}")
            return None
        for role, dts in (("qweight", ("I32",)), ("qzeros", ("I32",)),
                          ("scales", ("F16", "BF16", "F32"))):
            if st.info(names[role]).dtype not in dts:
                bad("GQ302", f"dtype {st.info(names[role]).dtype}; expected {' or '.join(dts)}",
                    names[role])
                return None
        qw, qz, sc = (tuple(st.info(names[r]).shape) for r in ("qweight", "qzeros", "scales"))
        if not (len(qw) == len(qz) == len(sc) == 2):
            bad("GQ303", f"qweight {list(qw)}, qzeros {list(qz)}, scales {list(sc)}: expected 2-D")
            return None
        k, n, groups = qw[0], sc[1], sc[0]
        if qw[1] == n:
            bad("GQ303", f"qweight {list(qw)} and scales {list(sc)} have GPTQ's shapes "
                f"(qweight [K*bits/32, N]), but {self.label or 'the config'} says AutoAWQ, whose "
                "GEMM layout stores qweight [K, N/8]: the label does not match the tensors")
            return None
        if qw[1] * 8 != n or qz != (groups, qw[1]) or 0 in (groups, k, n) or k % groups:
            bad("GQ303", f"qweight {list(qw)}, qzeros {list(qz)}, scales {list(sc)}: AutoAWQ "
                f"GEMM stores [K, N/8], [K/group_size, N/8] and [K/group_size, N]")
            return None
        gs = k // groups if groups > 1 else -1
        declared = self.config["group_size"]
        if groups > 1 and isinstance(declared, int) and declared not in (gs, -1):
            bad("GQ305", f"config group_size {declared}; the shapes say {gs} "
                f"({k} input channels in {groups} groups)")
            return None
        # zero_point false: symmetric, its stored zero points the constant (data_findings)
        sym = self.config["zero_point"] is False
        return QuantModule(p, AWQ_BITS, gs, k, n, sym, False, st.info(names["scales"]).dtype,
                           names)

    def qweight(self, m: QuantModule) -> np.ndarray:
        return awq_qweight_to_gptq(self.store.view(m.tensors["qweight"]))

    def stored_qweight(self, m: QuantModule) -> tuple[np.ndarray, bool]:
        """qweight's transpose, made from the AWQ words in one pass (True): compressed-tensors'
        layout, which a conversion writes and its gate compares word for word, so the words
        are never laid out twice."""
        return awq_qweight_transposed(self.store.view(m.tensors["qweight"])), True

    def qweight_bands(self, m: QuantModule) -> Banded:
        """stored_qweight's words a band at a time, each from its AWQ word columns."""
        return awq_qweight_bands(self.store.view(m.tensors["qweight"]))

    def qweight_differ(self, m: QuantModule, words: np.ndarray, transposed: bool) -> int:
        """Against a transpose (compressed-tensors' layout, a conversion's output), the AWQ
        words are compared in place, never laid out; else (GPTQ's layout, or no compiled
        loops) laid out as GPTQ's qweight, the layout a GPTQ output has as it is."""
        if transposed:
            counted = awq_qweight_differ(self.store.view(m.tensors["qweight"]), words)
            if counted is not None:
                return counted
        return words_differ(self.qweight(m), False, words, transposed)

    def qweight_columns(self, m: QuantModule, cols: np.ndarray) -> np.ndarray:
        """Only the AWQ word columns that hold `cols` are re-laid out: column n of the one
        model is nibble AWQ_INVERSE[n % 8] of word column n // 8, which the word transpose
        puts at 8 x (its place among the word columns read) + n % 8."""
        cols = np.asarray(cols, dtype=np.int64)
        words = unique(cols // 8)
        part = awq_qweight_to_gptq(self.store.columns(m.tensors["qweight"], words))
        return part[:, np.searchsorted(words, cols // 8) * 8 + cols % 8]

    def qzeros(self, m: QuantModule) -> np.ndarray:
        return awq_words_to_gptq(self.store.view(m.tensors["qzeros"]))

    def scales(self, m: QuantModule) -> np.ndarray:
        return self.store.view(m.tensors["scales"])

    def g_idx(self, m: QuantModule) -> np.ndarray:
        return trivial_g_idx(m.in_features, m.group_size).astype(np.int32)

    # -- what inspect and verify say of it -----------------------------------------------
    def data_findings(self, m: QuantModule, full: bool) -> list[Finding]:
        """Every nibble is a valid code or zero point and the shapes were checked; a module
        the config declares symmetric (zero_point false) must store the constant zero point
        2^(bits-1) in every nibble (GQ403). qzeros is small: inspect reads it whole too."""
        if not m.sym:
            return []
        t = m.tensors["qzeros"]
        mid = 1 << (AWQ_BITS - 1)
        words = np.asarray(self.store.view(t)).view(np.uint32)
        # every nibble is the constant exactly when every word is 0x88888888
        off = int(np.count_nonzero(words != np.uint32(constant_words(mid, AWQ_BITS, 32)[0])))
        self.store.release([t])
        if not off:
            return []
        return [Finding("GQ403", f"{self.label or 'the config'} says zero_point=false "
                        f"(symmetric), so every zero point should be {mid}; {off} of "
                        f"{words.size} qzeros words hold others (converted, sym=true would "
                        f"have GPTQ's Marlin decode them as {mid})",
                        file=self.store.file_of(t), tensor=t,
                        hint="set zero_point to true in the config")]

    def describe(self) -> str:
        return f"AutoAWQ GEMM ({self.label or 'no config; from the tensor shapes'})"

