"""Checkpoint formats as readers and writers of one module model (model.py).

    gptq, gptq_v2        GPTQ's packing in its two zero-point conventions (gptq.py over
                         gptq/checkpoint.py)
    compressed-tensors   pack-quantized WnA16 (ct.py)
    awq                  AutoAWQ GEMM, read only (awq.py)

`sniff` says which format a checkpoint is in, from its configs first (quant_method) and its
tensor names and shapes otherwise; `open_source` opens it as a model.Source. A new format is one
module with a Source class, `entries`/`tensor` to write it and `config` to describe it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import FindingError
from ..findings import Finding
from ..gptq.config import config_documents
from ..safetensors_io.index import TensorStore, open_store
from . import awq, ct, gptq
from .model import AWQ, COMPRESSED_TENSORS, FORMATS, GPTQ, GPTQ_V2, TARGETS, QuantModule, \
    Source, module_tensors

__all__ = ["AWQ", "COMPRESSED_TENSORS", "FORMATS", "GPTQ", "GPTQ_V2", "TARGETS", "Sniffed",
           "QuantModule", "Source", "module_tensors", "open_source", "sniff", "writer"]


@dataclass(frozen=True)
class Sniffed:
    format: str            # "gptq" for either GPTQ convention (gptq/detect.py tells which)
    label: str | None      # the config that says so, e.g. "config.json:quantization_config"
    doc: dict
    config_files: list[str]
    findings: list[Finding]


def sniff(store: TensorStore) -> Sniffed:
    docs, found = config_documents(store.root)
    files = sorted({label.split(":")[0] for label, _ in docs})
    for label, doc in docs:   # the first config that names a method decides, as loaders read
        method = str(doc.get("quant_method", "")).lower()
        if method == ct.METHOD:
            return Sniffed(COMPRESSED_TENSORS, label, doc, files, found)
        if method == "awq" or (method == "" and "zero_point" in doc and
                               str(doc.get("version", "")).lower() in
                               awq.VERSIONS + ("gemv", "gemv_fast", "marlin", "exllama")):
            return Sniffed(AWQ, label, doc, files, found)
        if method:
            break
    if not docs:
        if any(t.endswith(".weight_packed") for t in store.locations):
            return Sniffed(COMPRESSED_TENSORS, None, {}, files, found)
        if awq.looks_like(store):
            return Sniffed(AWQ, None, {}, files, found)
    return Sniffed(GPTQ, None, {}, files, found)


def open_source(path: str | os.PathLike, sniffed: Sniffed | None = None,
                store: TensorStore | None = None):
    """A compressed-tensors or AWQ checkpoint as a Source (GPTQ ones open through
    gptq/checkpoint.py and formats.gptq.GptqSource, which need the convention)."""
    store = store or open_store(path)
    s = sniffed or sniff(store)
    if s.format == COMPRESSED_TENSORS:
        if s.label is None:
            store.close()
            raise FindingError(*s.findings, Finding(
                "GQ210", "tensors are stored pack-quantized (*.weight_packed) but no config "
                "says with which scheme (bits, strategy, symmetry)", file="config.json",
                hint="restore config.json with its quantization_config"))
        src = ct.CtSource(store, ct.parse_config(s.label, s.doc), s.config_files)
    elif s.format == AWQ:
        src = awq.AwqSource(store, s.label, s.doc, s.config_files)
    else:
        store.close()
        raise ValueError(f"{path}: a GPTQ checkpoint; open it with open_checkpoint")
    src.findings[:0] = s.findings   # config files that could not be read (GQ201, GQ202)
    return src


def writer(target: str):
    """The module (entries, tensor, config) that writes `target`."""
    return ct if target == COMPRESSED_TENSORS else gptq
