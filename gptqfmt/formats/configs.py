"""The quantization configs beside a checkpoint's weights: their file names, spelled here only,
and reading them (every format reads its configs through config_documents; the format decides
what they say).

In the precedence runtimes give them (vLLM and transformers read config.json first):
config.json["quantization_config"], quantize_config.json (AutoGPTQ, GPTQModel, optimum),
quant_config.json (AutoAWQ). A config is labelled by where it sits: "config.json:quantization_
config" for the key inside config.json, the file name for the others.
"""
from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from ..findings import Finding

CONFIG_JSON, QUANTIZE_CONFIG, QUANT_CONFIG = (
    "config.json", "quantize_config.json", "quant_config.json")
CONFIG_KEY = "quantization_config"      # config.json's key that holds the config
CONFIG_JSON_LABEL = f"{CONFIG_JSON}:{CONFIG_KEY}"
# (file, key inside it or None), in precedence order
FILES = ((CONFIG_JSON, CONFIG_KEY), (QUANTIZE_CONFIG, None), (QUANT_CONFIG, None))
# the config files a conversion or a relabel writes, in the order it writes them (config.json
# counts only when it holds a quantization_config; quant_config.json is read by AutoGPTQ and
# GPTQModel when quantize_config.json is missing, so a stale label there misleads too)
CONFIG_FILES = (QUANTIZE_CONFIG, CONFIG_JSON, QUANT_CONFIG)
# TGI's config as scalar tensors beside GPTQ's modules (its loader reads bits, group size and
# sym there): GPTQ's own, not carried into another format
TGI_SCALARS = ("gptq_bits", "gptq_groupsize", "gptq_sym")


def config_documents(root: Path) -> tuple[list[tuple[str, dict[str, Any]]], list[Finding]]:
    """The quantization configs under `root` as (label, parsed object), in precedence order
    (config.json's quantization_config labelled `config.json:quantization_config`), with the
    findings of files that cannot be read or are not JSON objects. Every format reads its
    configs through here (formats/open.py decides which format they describe)."""
    findings: list[Finding] = []
    sources: list[tuple[str, dict[str, Any]]] = []
    for fname, subkey in FILES:
        doc = _read_json(root / fname, fname, findings)
        if doc is None:
            continue
        label = f"{fname}:{subkey}" if subkey else fname
        if subkey:
            if not isinstance(doc, dict):
                findings.append(Finding("GQ202", f"expected a JSON object; got "
                                        f"{type(doc).__name__}", file=fname))
                continue
            doc = doc.get(subkey)
            if doc is None:
                continue
        if not isinstance(doc, dict):
            findings.append(Finding("GQ202", f"expected a JSON object; got {type(doc).__name__}",
                                    file=label))
            continue
        sources.append((label, doc))
    return sources, findings


def _read_json(path: Path, label: str, findings: list[Finding]):
    if not path.exists():
        return None
    if not path.is_file():
        findings.append(Finding("GQ201", "is not a regular file", file=label))
        return None
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        findings.append(Finding("GQ118", f"cannot read: {e.strerror or e}", file=label))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        findings.append(Finding("GQ201", f"not valid JSON: {reason}", file=label))
    return None


def fix_label_command(path: str | os.PathLike[str]) -> str:
    """The command that relabels the checkpoint at `path`, with the user's path:
    `gptqfmt fix-label PATH`; where its configs are links into a Hugging Face cache's blobs
    (which fix-label will not rewrite: every snapshot with the same file shares the blob), a
    copy first, named after the repo (models--org--name/snapshots/REV: ./name).

        fix_label_command("ckpt")  ->  "gptqfmt fix-label ckpt"
    """
    p = Path(path)
    root = p if p.is_dir() else p.parent
    if not any((root / n).is_symlink() for n in CONFIG_FILES):
        return f"gptqfmt fix-label {shlex.quote(str(path))}"
    repo = root.parent.parent.name
    name = repo.rsplit("--", 1)[-1] if repo.startswith("models--") else root.name
    copy = shlex.quote(f"./{name}")
    return f"cp -rL {shlex.quote(str(root))} {copy} && gptqfmt fix-label {copy}"
