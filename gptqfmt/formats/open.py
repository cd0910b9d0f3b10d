"""The one open: a path becomes a Source. The tensor store is opened (an in-place convert that a
kill interrupted is finished or undone first: safetensors_io.index.open_store), its configs say
which format it is in (sniff), and that format's reader models it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import FindingError
from ..findings import Finding
from ..safetensors_io.index import TensorStore, open_store
from . import awq, ct
from .configs import CONFIG_JSON, config_documents
from .gptq.checkpoint import SURVEY, Checkpoint, open_checkpoint
from .gptq.config import AUTOROUND_AWQ, AUTOROUND_METHODS, PACKING_KEY, not_gptq
from .gptq.source import GptqSource
from .model import AWQ, COMPRESSED_TENSORS, GPTQ
from .source import Source


@dataclass(frozen=True)
class Sniffed:
    format: str            # "gptq" for either GPTQ convention (detection tells which)
    label: str | None      # the config that says so, e.g. "config.json:quantization_config"
    doc: dict[str, Any]
    config_files: list[str]
    findings: list[Finding]


def sniff(store: TensorStore) -> Sniffed:
    """Which format the checkpoint is in, from its configs first (quant_method) and its tensor
    names and shapes otherwise; GPTQ where nothing says another."""
    docs, found = config_documents(store.root)
    files = sorted({label.split(":")[0] for label, _ in docs})
    for label, doc in docs:   # the first config that names a method decides, as loaders read
        method = str(doc.get("quant_method", "")).lower()
        if method == ct.METHOD:
            return Sniffed(COMPRESSED_TENSORS, label, doc, files, found)
        if method == "awq" or (method == "" and "zero_point" in doc and
                               str(doc.get("version", "")).lower() in
                               awq.VERSIONS + ("gemv", "gemv_fast", "marlin")):
            return Sniffed(AWQ, label, doc, files, found)
        if method in AUTOROUND_METHODS and doc.get(PACKING_KEY) in AUTOROUND_AWQ:
            # auto-round's own export in AutoAWQ's GEMM layout (gptq/config.py
            # AUTOROUND_PACKING); its other packings are GPTQ's tensors
            return Sniffed(AWQ, label, doc, files, found)
        if method:
            break
    if not docs:
        if any(t.endswith(".weight_packed") for t in store.locations):
            return Sniffed(COMPRESSED_TENSORS, None, {}, files, found)
        if awq.looks_like(store):
            return Sniffed(AWQ, None, {}, files, found)
    return Sniffed(GPTQ, None, {}, files, found)


def open_source(path: str | os.PathLike[str], survey: bool = False) -> Source:
    """The checkpoint at `path` (a directory or one .safetensors file) as a Source in its own
    format (see the module docstring). Raises UsageError for a path that is not one, and
    FindingError where nothing can be read. `survey`: for a caller about to read every small
    g_idx and qzeros and probe every module (inspect), a GPTQ checkpoint starts those reads on
    a second thread as it is opened (open_checkpoint)."""
    store = open_store(path, SURVEY if survey else None)
    try:
        return _reader(path, store, sniff(store), survey)
    except BaseException:
        store.close()
        raise


def open_labelled(path: str | os.PathLike[str]) -> tuple[Source, Checkpoint]:
    """open_source for the commands that read a label's zero points (fix-label, verify
    --reference, convert --in-place): the source and its GPTQ model. A checkpoint in a format
    that stores its zero points exactly is refused with GPTQ's GQ203, naming the config that says
    what it is (or the format its tensors show), before its reader is built."""
    store = open_store(path)
    try:
        fmt = sniff(store).format
        if fmt != GPTQ:
            raise FindingError(not_gptq(store.root, fmt))
        src = GptqSource(open_checkpoint(path, store))
    except BaseException:
        store.close()
        raise
    return src, src.ckpt


def _reader(path: str | os.PathLike[str], store: TensorStore, s: Sniffed,
            survey: bool = False) -> Source:
    src: ct.CtSource | awq.AwqSource
    if s.format == COMPRESSED_TENSORS:
        if s.label is None:
            raise FindingError(*s.findings, Finding(
                "GQ210", "tensors are stored pack-quantized (*.weight_packed) but no config "
                "says with which scheme (bits, strategy, symmetry)", file=CONFIG_JSON,
                hint="restore config.json with its quantization_config"))
        src = ct.CtSource(store, ct.parse_config(s.label, s.doc), s.config_files)
    elif s.format == AWQ:
        src = awq.AwqSource(store, s.label, s.doc, s.config_files)
    else:   # GPTQ reads its configs itself (load_config: its own findings, GQ201/GQ202 too)
        return GptqSource(open_checkpoint(path, store, survey))
    store.stop_survey()   # started as the store opened, for a GPTQ checkpoint's reads
    src.findings[:0] = s.findings   # config files that could not be read (GQ201, GQ202)
    src.path = store.root if Path(path).is_dir() else Path(path)
    return src
