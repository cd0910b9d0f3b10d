"""convert between formats: gptq / gptq_v2 -> compressed-tensors, compressed-tensors / AWQ ->
gptq_v2. Every module is read into the one model (formats/model.py) and written in the target's
tensors; every other tensor is copied byte for byte.

Flow, as for gptq <-> gptq_v2 (run.py): plan and refuse before anything is written (plan.py;
GQ419 where the target has no lossless form of a module, no_form here; a gptq source's zero
points through the same per-field rules as gptq -> gptq_v2), then shard by shard into a staging
directory, at most two tensors in memory (weight_packed, the largest, made a band at a time into
a few reused buffers), then the gate (reformat_gate.py) proves the staged
output equal to SRC, and only then does the directory appear as DST. What differs between
target formats is their Writer's (formats/model.py).
"""
from __future__ import annotations

import json
from collections import deque
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np

from .. import faults
from ..findings import Finding
from ..formats import Banded, QuantModule, Source, Writer
from ..formats.configs import CONFIG_FILES, CONFIG_JSON, CONFIG_KEY
from ..formats.model import outside_words
from ..ops.reports import WRITE, Progress, start
from ..parallel import cpus
from ..safetensors_io.dtypes import DTYPES, nbytes
from ..safetensors_io.index import INDEX_NAME
from ..safetensors_io.writer import Entry, layout
from . import atomic
from .configs import dumps
from .write import copy_other_files, copy_range


def no_form(src: Source, writer: Writer) -> list[Finding]:
    """GQ419 for every module the target cannot hold losslessly, with the reason."""
    out = []
    for m in src.modules:
        if not m.listed:
            t = m.tensors["qweight"]
            out.append(Finding("GQ419", f"{m.name} is quantized but the config's `dynamic` "
                               "excludes it (GQ313): no config of the target can describe it; "
                               "nothing was written", file=src.store.file_of(t), tensor=t,
                               hint="fix the source's dynamic rules (or drop the module), then "
                                    "convert again"))
    for m in src.modules:
        # every conversion goes through the one model
        why = (outside_words(m) or writer.no_form(m)) if m.listed else None
        if why:
            t = m.tensors["qweight"]
            out.append(Finding("GQ419", f"{why}; nothing was written",
                               file=src.store.file_of(t), tensor=t, hint=writer.hint))
    return out


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
        n = nbytes(self.dtype, int(np.prod(self.shape, dtype=np.int64)))
        assert n is not None   # every dtype written fills whole bytes
        return n


def out_shards(src: Source, w: Writer) -> dict[str, list[OutTensor]]:
    """Every output tensor, in the shard of SRC that holds its module's (or its own) data."""
    st = src.store
    shards: dict[str, list[OutTensor]] = {name: [] for name in st.files}
    for m in src.modules:
        home = st.file_of(next(iter(m.tensors.values())))
        for name, dtype, shape, role in w.entries(m):
            shards[home].append(OutTensor(name, dtype, shape, m, role))
    for t in src.passthrough:
        if not w.keeps(t):
            continue
        info = st.info(t)
        shards[st.file_of(t)].append(OutTensor(t, info.dtype, tuple(info.shape), None))
    # a source shard whose tensors all went with their modules to another shard is not written
    return {s: ts for s, ts in shards.items() if ts}


def name_clashes(src: Source, w: Writer) -> list[Finding]:
    """GQ419 for an output name written twice: a tensor outside the modules named like one the
    target writes for a module (a stray `x.qweight` beside compressed-tensors' `x.weight_*`)."""
    seen: dict[str, str] = {}
    out = []
    for ts in out_shards(src, w).values():
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


def shard_layout(src: Source, shard: str, tensors: list[OutTensor], w: Writer
                 ) -> tuple[bytes, list[Entry]]:
    """An output shard's prefix (length and header) and its entries in data order; the SRC
    shard's __metadata__ as the target keeps it."""
    meta = w.metadata(src.store.files[shard].metadata)
    return layout([Entry(t.name, t.dtype, t.shape, t.nbytes) for t in tensors], meta)


# Bands in flight while a Banded tensor is written: one being made, two being written
RING = 3


def write_shard(src: Source, shard: str, tensors: list[OutTensor], w: Writer, out: Path,
                index: int, advance: Callable[[int], Any] | None = None) -> int:
    """Write one output shard (shard_layout); `advance(n)` as each n of its bytes are written.
    Returns the bytes written."""
    f = src.store.files[shard]
    prefix, ordered = shard_layout(src, shard, tensors, w)
    by_name = {t.name: t for t in tensors}
    written = len(prefix)
    # a module tensor is written by a second thread while the next one is built (the write
    # releases the GIL): at most two tensors in memory; a Banded one a few bands at a time
    pending: list[tuple[Any, int, int]] = []

    def settle() -> None:
        for fut, i, n in pending:
            fut.result()
            if advance:
                advance(n)
            faults.point("mid-shard", index, i)
        pending.clear()

    workers = cpus()
    with open(f.path, "rb") as fin, atomic.create(out) as fout, ThreadPoolExecutor(1) as io, \
            ThreadPoolExecutor(workers) as makers:
        fout.write(prefix)
        if advance:
            advance(len(prefix))
        for i, e in enumerate(ordered):
            t = by_name[e.name]
            if t.module is None:
                settle()
                info = f.tensors[t.name]
                copy_range(fin, fout, f.header.data_start + info.begin, info.nbytes, advance)
                faults.point("mid-shard", index, i)
                written += e.nbytes
                continue
            assert t.role is not None
            built = w.tensor(t.role, src, t.module)
            planned(t, built.shape, 4 if isinstance(built, Banded) else built.dtype.itemsize)
            settle()
            if isinstance(built, Banded):
                write_banded(built, fout, io, makers, workers, advance)
                faults.point("mid-shard", index, i)
            else:
                arr = np.ascontiguousarray(built)
                if arr.size:   # (a zero-size array has no bytes, and no buffer to cast)
                    pending.append((io.submit(fout.write, arr.data.cast("B")), i, e.nbytes))
            src.store.release(t.module.tensors.values())
            written += e.nbytes
        settle()
    return written


def planned(t: OutTensor, shape: tuple[int, ...], itemsize: int) -> None:
    """A built tensor has the shape and element size its header entry was written with."""
    if shape != t.shape or itemsize != DTYPES[t.dtype].numpy.itemsize:
        raise AssertionError(f"{t.name}: built {itemsize}-byte elements {list(shape)}, "
                             f"planned {t.dtype}{list(t.shape)}")


def write_banded(t: Banded, fout: BinaryIO, io: Executor, makers: Executor, parts: int,
                 advance: Callable[[int], Any] | None = None) -> None:
    """Write `t` band by band: each band is made on `makers` (up to `parts` spans at once)
    into one of RING reused buffers, and written by `io` in order while the next is made; a
    buffer is made into again only once its write has returned. `advance(n)` as each band is
    written."""
    bands = t.bands(parts)
    if not bands:
        return
    rows = max(b[-1][1] - b[0][0] for b in bands)
    ring = [np.empty((rows, t.shape[1]), dtype=np.int32) for _ in range(min(RING, len(bands)))]
    writing: deque[tuple[Future[Any], int]] = deque()

    def done() -> None:
        fut, n = writing.popleft()
        fut.result()
        if advance:
            advance(n)
    for j, spans in enumerate(bands):
        if len(writing) == len(ring):
            done()
        r0 = spans[0][0]
        buf = ring[j % len(ring)][:spans[-1][1] - r0]
        for fut in [makers.submit(t.fill, buf[a - r0:b - r0], a, b) for a, b in spans]:
            fut.result()
        writing.append((io.submit(fout.write, buf.data.cast("B")), buf.nbytes))
    while writing:
        done()


def write_index(src: Source, shards: dict[str, list[OutTensor]], tmp: Path) -> None:
    """model.safetensors.index.json for a sharded SRC: the new names, the new total size."""
    if src.store.index_name is None:
        return
    weight_map = {t.name: s for s, ts in shards.items() for t in ts}
    total = sum(t.nbytes for ts in shards.values() for t in ts)
    doc = {"metadata": {"total_size": total},
           "weight_map": dict(sorted(weight_map.items()))}
    with atomic.create(tmp / INDEX_NAME) as f:
        f.write(dumps(doc))


def write_configs(src: Source, w: Writer, tmp: Path, prov: dict[str, Any]) -> list[str]:
    """The target's quantization config, in the files its writer names: config.json as SRC's
    own with the new quantization_config (where SRC has one, or the target always writes it),
    quantize_config.json as the config itself."""
    universe = sorted({m.name for m in src.modules} | set(_weight_modules(src)))
    unquantized = sorted(_weight_modules(src))
    qcfg = w.config(src.modules, universe, unquantized, prov)
    root = src.root
    base: dict[str, Any] = {}
    if (root / CONFIG_JSON).is_file():
        doc = json.loads((root / CONFIG_JSON).read_bytes().decode("utf-8"))
        base = doc if isinstance(doc, dict) else {}
    written = []
    for name, always in w.config_files:
        if name == CONFIG_JSON:
            if not (base or always):
                continue
            content = {**base, CONFIG_KEY: qcfg}
        else:
            content = qcfg
        with atomic.create(tmp / name) as f:
            f.write(dumps(content))
        written.append(name)
    return written


def _weight_modules(src: Source) -> list[str]:
    """Modules stored unquantized: 2-D `.weight` tensors outside the quantized modules."""
    out = []
    for t in src.passthrough:
        if t.endswith(".weight") and len(src.store.info(t).shape) == 2:
            out.append(t[:-len(".weight")])
    return out


def write_all(src: Source, w: Writer, tmp: Path, prov: dict[str, Any],
              progress: Progress | None = None,
              written: Callable[[Path], Any] | None = None) -> dict[str, list[OutTensor]]:
    """Every output file into `tmp`; `written(path)` after each shard (convert flushes it to
    disk in the background while the next one is built). `progress` hears of WRITE, over the
    bytes of the output's shards."""
    shards = out_shards(src, w)
    total = sum(len(shard_layout(src, name, ts, w)[0]) + sum(t.nbytes for t in ts)
                for name, ts in shards.items())
    advance = start(progress, WRITE, total) if progress else None
    for i, (name, tensors) in enumerate(sorted(shards.items())):
        write_shard(src, name, tensors, w, tmp / name, i, advance)
        written and written(tmp / name)
    faults.point("shards-written")
    write_index(src, shards, tmp)
    skip = set(src.store.files) | set(CONFIG_FILES) | {INDEX_NAME}
    copy_other_files(src.root, tmp, skip)
    write_configs(src, w, tmp, prov)
    return shards

