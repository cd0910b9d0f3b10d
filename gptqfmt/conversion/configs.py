"""Rewrite the convention in configs, keeping every other key, their order and `meta`."""
from __future__ import annotations

import json
from pathlib import Path

from ..version import __version__
from .atomic import create

CONFIG_FILES = ("quantize_config.json", "config.json")


def set_convention(doc: dict, to: str, provenance: dict) -> dict:
    """A copy of a quantization config with checkpoint_format and format set to `to`."""
    out = dict(doc)  # insertion order kept: existing keys stay where they are
    for key in ("checkpoint_format", "format"):
        out[key] = to
    meta = dict(out["meta"]) if isinstance(out.get("meta"), dict) else (
        {} if out.get("meta") is None else {"original": out["meta"]})
    meta["gptqfmt"] = provenance
    out["meta"] = meta
    return out


def provenance(src: str, dst: str, counts: dict) -> dict:
    return {"converter": "gptqfmt", "version": __version__, "from": src, "to": dst, **counts}


def rewrite_configs(src_dir: Path, out_dir: Path, to: str, prov: dict) -> list[str]:
    """Write converted copies of the config files present in src_dir; return their names."""
    written = []
    for name in CONFIG_FILES:
        p = src_dir / name
        if not p.is_file():
            continue
        doc = json.loads(p.read_text(encoding="utf-8"))
        if name == "config.json":
            if not isinstance(doc, dict) or not isinstance(doc.get("quantization_config"), dict):
                with open(p, "rb") as fin, create(out_dir / name) as fout:  # as it is
                    fout.write(fin.read())
                written.append(name)
                continue
            doc = dict(doc)
            doc["quantization_config"] = set_convention(doc["quantization_config"], to, prov)
        else:
            doc = set_convention(doc, to, prov)
        with create(out_dir / name) as f:
            f.write((json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
        written.append(name)
    return written
