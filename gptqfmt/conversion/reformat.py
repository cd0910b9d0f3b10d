"""convert between formats: gptq / gptq_v2 -> compressed-tensors, compressed-tensors / AWQ ->
gptq_v2. Every module is read into the one model (formats/model.py) and written in the target's
tensors; every other tensor is copied byte for byte.

Flow, as for gptq <-> gptq_v2 (run.py): plan and refuse before anything is written (GQ419 where
the target has no lossless form of a module; a gptq source's zero points through the same
per-field rules as gptq -> gptq_v2), then shard by shard into a staging directory, at most two
tensors in memory, then the gate (reformat_gate.py) proves the staged output equal to SRC, and
only then does the directory appear as DST.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import faults, formats
from ..conventions import CONVENTIONS, GPTQ_V2
from ..errors import FindingError, UsageError
from ..findings import ERROR, Finding
from ..formats import COMPRESSED_TENSORS, QuantModule
from ..formats.model import outside_words
from ..formats.checks import module_findings
from ..formats.gptq import GptqSource
from ..safetensors_io.dtypes import DTYPES, nbytes
from ..safetensors_io.index import INDEX_NAME
from ..safetensors_io.writer import Entry, layout
from . import atomic
from .configs import CONFIG_FILES, dumps, provenance
from .plan import ModulePlan, open_and_plan
from .write import copy_other_files, copy_range

TGI_SCALARS = ("gptq_bits", "gptq_groupsize", "gptq_sym")  # GPTQ-only tensors, not carried over


@dataclass
class Opened:
    source: object                  # a formats Source
    from_: str                      # the source's format (gptq, gptq_v2, compressed-tensors, awq)
    plans: list[ModulePlan]
    findings: list[Finding]
    detection: object = None        # gptq sources only


def open_for_convert(src_path: Path, sniffed, requested: str, to: str,
                     allow_lossy: bool) -> Opened:
    """The source in the one model, its per-module plan and the findings that refuse or report
    the conversion (raises FindingError on invalid input, UsageError for a --from or --to that
    does not apply)."""
    if sniffed.format == formats.GPTQ:
        if requested not in CONVENTIONS + ("auto",):
            raise UsageError(f"{src_path}: a GPTQ checkpoint, not --from {requested}")
        # the zero points move exactly as gptq -> gptq_v2 moves them: the same refusals
        ckpt, det, from_, plans, found = open_and_plan(src_path, requested, GPTQ_V2,
                                                       allow_lossy)
        src = GptqSource(ckpt, from_, allow_lossy)
        return Opened(src, from_, plans, found + no_form(src, to) + name_clashes(src, to), det)
    src = formats.open_source(src_path, sniffed)
    try:
        if requested not in ("auto", src.format):
            raise UsageError(f"{src_path}: a {src.format} checkpoint "
                             f"({sniffed.label or 'from its tensors'}), not --from {requested}")
        if to == src.format:
            raise UsageError(f"{src_path} is already {src.format}")
        if to == formats.GPTQ:
            raise UsageError(f"{src.format} converts to gptq_v2 (--to gptq_v2), where every zero "
                             "point is stored exactly; convert that to gptq afterwards if you "
                             "need v1 (it reports what v1 cannot hold)")
        blocking = [f for f in src.findings if f.severity == ERROR]
        if not blocking:  # verify's checks, module by module
            for m in src.modules:
                blocking += [f for f in module_findings(src, m) if f.severity == ERROR]
        if blocking:
            raise FindingError(*blocking)
    except BaseException:
        src.close()
        raise
    plans = [ModulePlan(m.name, m.bits, m.groups * m.out_features, 0, 0, 0, []) for m in
             src.modules]
    return Opened(src, src.format, plans, no_form(src, to) + name_clashes(src, to))


def no_form(src, to: str) -> list[Finding]:
    """GQ419 for every module the target cannot hold losslessly, with the reason."""
    out = []
    for name, t in getattr(src, "unlisted", {}).items():
        out.append(Finding("GQ419", f"{name} is quantized but the config's `dynamic` excludes "
                           "it (GQ313): no config of the target can describe it; nothing was "
                           "written", file=src.store.file_of(t), tensor=t,
                           hint="fix the source's dynamic rules (or drop the module), then "
                                "convert again"))
    for m in src.modules:
        why = _no_form(m, to)
        if why:
            t = m.tensors["qweight"]
            out.append(Finding("GQ419", f"{why}; nothing was written",
                               file=src.store.file_of(t), tensor=t, hint=why_hint(to)))
    return out


def _no_form(m: QuantModule, to: str) -> str | None:
    outside = outside_words(m)   # every conversion goes through the one model
    if outside:
        return outside
    if to == COMPRESSED_TENSORS:
        if m.act_order:
            return ("act-order (a non-trivial g_idx): vLLM 0.30 and later refuse compressed-"
                    "tensors' actorder 'group' (compressed_tensors.py: 'activation ordering ... "
                    "is no longer supported') and compressed-tensors 0.19 and later no longer "
                    "parse it (quant_args.py, 'removed 2026/08/27'); only vLLM 0.29 and older "
                    "loaded weight_g_idx. Without it pack-quantized groups are contiguous runs "
                    "of input channels, and dropping the g_idx would change the weights")
        if m.group_size != -1 and m.in_features % m.group_size:
            return (f"in_features {m.in_features} is not a multiple of group_size "
                    f"{m.group_size}: compressed-tensors' group strategy has no partial last "
                    "group (forward_helpers._process_group: 'tensor column shape must be "
                    "divisible by the given group_size')")
    return None


def why_hint(to: str) -> str:
    return ("keep this checkpoint in GPTQ: gptq_v2 keeps its g_idx and loads in GPTQModel "
            "and transformers (vLLM: 4/8-bit symmetric through Marlin)"
            if to == COMPRESSED_TENSORS else
            "keep it in compressed-tensors; vLLM loads it as it is")


# -- writing ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class OutTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    module: QuantModule | None       # None: copied from SRC as it is
    role: str | None = None

    @property
    def nbytes(self) -> int:
        return nbytes(self.dtype, int(np.prod(self.shape, dtype=np.int64)))


def out_shards(src, to: str) -> dict[str, list[OutTensor]]:
    """Every output tensor, in the shard of SRC that holds its module's (or its own) data."""
    w = formats.writer(to)
    st = src.store
    shards: dict[str, list[OutTensor]] = {name: [] for name in st.files}
    for m in src.modules:
        home = st.file_of(next(iter(m.tensors.values())))
        for name, dtype, shape, role in w.entries(m):
            shards[home].append(OutTensor(name, dtype, shape, m, role))
    for t in src.passthrough:
        if to == COMPRESSED_TENSORS and t in TGI_SCALARS:
            continue
        info = st.info(t)
        shards[st.file_of(t)].append(OutTensor(t, info.dtype, tuple(info.shape), None))
    # a source shard whose tensors all went with their modules to another shard is not written
    return {s: ts for s, ts in shards.items() if ts}


def name_clashes(src, to: str) -> list[Finding]:
    """GQ419 for an output name written twice: a tensor outside the modules named like one the
    target writes for a module (a stray `x.qweight` beside compressed-tensors' `x.weight_*`)."""
    seen: dict[str, str] = {}
    out = []
    for ts in out_shards(src, to).values():
        for t in ts:
            if t.name in seen:
                out.append(Finding("GQ419", f"{t.name} would be written twice: the target "
                                   f"writes it for module {seen[t.name]}, and SRC also has a "
                                   "tensor of that name; nothing was written",
                                   file=src.store.file_of(t.name) if t.name in
                                   src.store.locations else None, tensor=t.name,
                                   hint="remove the stray tensor from the source"))
            seen[t.name] = t.module.name if t.module else "(none)"
    return out


def write_shard(src, shard: str, tensors: list[OutTensor], to: str, out: Path,
                index: int) -> int:
    """Write one output shard; the SRC shard's __metadata__ is kept (GPTQ keys dropped when the
    target is not GPTQ). Returns the bytes written."""
    w = formats.writer(to)
    f = src.store.files[shard]
    meta = f.metadata
    if meta is not None and to == COMPRESSED_TENSORS:
        meta = {k: v for k, v in meta.items() if not k.startswith("gptq_")}
    prefix, ordered = layout([Entry(t.name, t.dtype, t.shape, t.nbytes) for t in tensors], meta)
    by_name = {t.name: t for t in tensors}
    written = len(prefix)
    # a module tensor is written by a second thread while the next one is built (the write
    # releases the GIL): at most two tensors in memory
    pending: list = []

    def settle():
        for fut, i in pending:
            fut.result()
            faults.point("mid-shard", index, i)
        pending.clear()

    with open(f.path, "rb") as fin, atomic.create(out) as fout, ThreadPoolExecutor(1) as io:
        fout.write(prefix)
        for i, e in enumerate(ordered):
            t = by_name[e.name]
            if t.module is None:
                settle()
                info = f.tensors[t.name]
                copy_range(fin, fout, f.header.data_start + info.begin, info.nbytes)
                faults.point("mid-shard", index, i)
            else:
                arr = np.ascontiguousarray(w.tensor(t.role, src, t.module))
                want = DTYPES[t.dtype].numpy
                if arr.shape != t.shape or arr.dtype.itemsize != want.itemsize:
                    raise AssertionError(f"{t.name}: built {arr.dtype}{list(arr.shape)}, "
                                         f"planned {t.dtype}{list(t.shape)}")
                settle()
                if arr.size:   # (a zero-size array has no bytes, and no buffer to cast)
                    pending.append((io.submit(fout.write, memoryview(arr).cast("B")), i))
                src.store.release(t.module.tensors.values())
            written += e.nbytes
        settle()
    return written


def write_index(src, shards: dict[str, list[OutTensor]], tmp: Path) -> None:
    """model.safetensors.index.json for a sharded SRC: the new names, the new total size."""
    if src.store.index_name is None:
        return
    weight_map = {t.name: s for s, ts in shards.items() for t in ts}
    total = sum(t.nbytes for ts in shards.values() for t in ts)
    doc = {"metadata": {"total_size": total},
           "weight_map": dict(sorted(weight_map.items()))}
    with atomic.create(tmp / INDEX_NAME) as f:
        f.write(dumps(doc))


def write_configs(src, to: str, tmp: Path, prov: dict) -> list[str]:
    """The target's quantization config: compressed-tensors in config.json only (GPTQModel reads
    quantize_config.json first, so none is written); gptq_v2 in quantize_config.json and, when
    SRC has a config.json, in its quantization_config."""
    w = formats.writer(to)
    universe = sorted({m.name for m in src.modules} | set(_weight_modules(src)))
    unquantized = sorted(_weight_modules(src))
    qcfg = w.config(src.modules, universe, unquantized, prov)
    root = src.root
    base = {}
    if (root / "config.json").is_file():
        base = json.loads((root / "config.json").read_bytes().decode("utf-8"))
        if not isinstance(base, dict):
            base = {}
    written = []
    if base or to == COMPRESSED_TENSORS:
        with atomic.create(tmp / "config.json") as f:
            f.write(dumps({**base, "quantization_config": qcfg}))
        written.append("config.json")
    if to != COMPRESSED_TENSORS:
        with atomic.create(tmp / "quantize_config.json") as f:
            f.write(dumps(qcfg))
        written.append("quantize_config.json")
    return written


def _weight_modules(src) -> list[str]:
    """Modules stored unquantized: 2-D `.weight` tensors outside the quantized modules."""
    out = []
    for t in src.passthrough:
        if t.endswith(".weight") and len(src.store.info(t).shape) == 2:
            out.append(t[:-len(".weight")])
    return out


def write_all(src, to: str, tmp: Path, prov: dict, progress=None,
              written=None) -> dict[str, list[OutTensor]]:
    """Every output file into `tmp`; `written(path)` after each shard (convert flushes it to
    disk in the background while the next one is built)."""
    shards = out_shards(src, to)
    total = sum(t.nbytes for ts in shards.values() for t in ts)
    progress and progress(0, total)
    for i, (name, tensors) in enumerate(sorted(shards.items())):
        n = write_shard(src, name, tensors, to, tmp / name, i)
        written and written(tmp / name)
        progress and progress(n, total)
    faults.point("shards-written")
    write_index(src, shards, tmp)
    skip = set(src.store.files) | set(CONFIG_FILES) | {INDEX_NAME}
    copy_other_files(src.root, tmp, skip)
    write_configs(src, to, tmp, prov)
    return shards


def prov(from_: str, to: str, plans: list[ModulePlan]) -> dict:
    counts = {k: sum(getattr(p, k) for p in plans) for k in ("fields", "changed", "ambiguous",
                                                             "lossy")}
    return provenance(from_, to, counts)
