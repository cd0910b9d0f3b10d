"""The output's configs: they must say what the output holds.

A source config (quantize_config.json, config.json["quantization_config"], quant_config.json) is
rewritten with `checkpoint_format` and `format` set to the target, keeping every other key, their
order and `meta`, except AutoGPTQ's `is_marlin_format: false`, which GPTQModel 6.0 and later refuse
by name: it is dropped, and `meta.gptqfmt.removed` says so. A source without any config file gets
a quantize_config.json derived from what the checkpoint declares (AutoGPTQ's safetensors
`__metadata__`) and from its shapes and zero points; when no single config can describe the
checkpoint, convert refuses instead.

auto-round's own config (quant_method "auto-round", its convention in `packing_format`) is
written as GPTQ's, like any GPTQ source's output: quant_method "gptq" in its place,
packing_format dropped, desc_act false where missing and extra_config's overrides as `dynamic`
(formats/gptq/config.py as_gptq). fix-label keeps it auto-round's and sets its packing_format.

What loaders read (why both keys, and why these keys):
- vLLM's GPTQConfig.from_config reads `bits`, `group_size`, `desc_act` (required: a missing one
  raises) and `checkpoint_format`, and GPTQLinearMethod takes gptq_v2 only for
  `checkpoint_format == "gptq_v2"` exactly (vllm/model_executor/layers/quantization/gptq.py after
  PR 26092). Its newest AutoGPTQConfig (auto_gptq.py, vllm-project/vllm 055e47c2) also requires
  `sym` and claims the model only with `quant_method == "gptq"`. Both fall back to
  quantize_config.json when config.json has no quantization_config (get_config_filenames).
- GPTQModel (gptqmodel/quantization/config.py, ModelCloud/GPTQModel 007b7930) reads
  quantize_config.json, then quant_config.json, then config.json (from_pretrained); in
  from_quant_config `format` decides and `checkpoint_format` counts only without it; to_dict
  writes both keys (its comment: vLLM and SGLang read only `checkpoint_format`), plus
  `pack_dtype`, `lm_head` and `sym`.
- transformers' GPTQConfig lets `checkpoint_format` override `format`; llama.cpp's converter and
  ExLlamaV2 read `checkpoint_format` only (docs/runtimes.md).
- AutoGPTQ 0.7.1 (BaseQuantizeConfig.from_pretrained) takes its own fields from
  quantize_config.json and logs the others as ignored; it has no gptq_v2 reading at all.
So the derived file carries `quant_method`, `bits`, `group_size`, `desc_act`, `sym`, `lm_head`,
`pack_dtype`, and `checkpoint_format` and `format` both set to the target.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..bits.layout import n_groups
from ..findings import Finding
from ..formats.configs import CONFIG_FILES, CONFIG_JSON, CONFIG_KEY, QUANTIZE_CONFIG
from ..formats.gptq.checkpoint import Checkpoint, Module
from ..formats.gptq.config import LEGACY_KEYS, as_gptq, label_values
from ..formats.model import is_lm_head
from ..version import __version__
from .atomic import create

DERIVED_FILE = QUANTIZE_CONFIG    # what a source without any config file gets


def set_convention(doc: dict, to: str, provenance: dict, relabel: bool = False,
                   g_idx: bool = False) -> dict:
    """A copy of a quantization config with checkpoint_format and format set to `to`, and
    the keys loaders refuse by name dropped where they say nothing (legacy_dropped); the
    provenance records them under `removed`.

    A producer's own config (auto-round's: formats/gptq/config.py) becomes GPTQ's in what
    convert writes (as_gptq: quant_method gptq, its packing_format dropped, also recorded under
    `removed`); with `relabel` (fix-label) it stays the producer's, with the label keys its
    loaders read set instead (label_values; `g_idx`: whether the modules store g_idx)."""
    # insertion order kept: existing keys stay where they are
    out, removed = (dict(doc), {}) if relabel else as_gptq(doc)
    out.update(label_values(out, to, g_idx))
    removed.update({k: out.pop(k) for k in legacy_dropped(out)})
    meta = dict(out["meta"]) if isinstance(out.get("meta"), dict) else (
        {} if out.get("meta") is None else {"original": out["meta"]})
    meta["gptqfmt"] = {**provenance, "removed": removed} if removed else provenance
    out["meta"] = meta
    return out


def legacy_dropped(doc: dict) -> list[str]:
    """The keys of quantization config `doc` that convert and fix-label drop: AutoGPTQ's
    `is_marlin_format: false` (LEGACY_KEYS), which GPTQModel 6.0 and later refuse by name
    (quantization/config.py from_quant_config) and which says only what the data are not
    (`true` is refused on reading: Marlin-repacked tensors)."""
    return [k for k, v in doc.items() if k.lower() in LEGACY_KEYS and v is False]


def relabelled(name: str, doc: dict, to: str, provenance: dict, relabel: bool = False,
               g_idx: bool = False) -> dict:
    """A copy of config file `name`'s parsed document with its quantization config set to
    `to` (set_convention; in config.json, its quantization_config)."""
    if name == CONFIG_JSON:
        return {**doc, CONFIG_KEY: set_convention(doc[CONFIG_KEY], to, provenance, relabel,
                                                  g_idx)}
    return set_convention(doc, to, provenance, relabel, g_idx)


def dumps(doc) -> bytes:
    """A config file's bytes as gptqfmt writes them (indent 2, UTF-8, a final newline)."""
    return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def provenance(src: str | None, dst: str, totals: dict[str, int] | None = None, *,
               command: str = "convert", previous: dict | None = None) -> dict:
    """The record `meta.gptqfmt` that convert and fix-label write into each config they write,
    one shape for both: `tool` (gptqfmt), `version`, `command` (convert or fix-label), `from`
    and `to`, then the command's own field. `from`: for convert, the source's format (the
    convention its zero points are stored in); for fix-label, the label the file carried
    (None where it named none). `to`: the format written. convert's `totals`: its zero-point
    fields (fields, changed, ambiguous, lossy; the totals of its report); fix-label's
    `previous`: each key it set in the file, with the value it had (None where absent).
    set_convention adds `removed` (the keys dropped, with their values), and convert `config:
    "derived"` to a config it derived."""
    record: dict = {"tool": "gptqfmt", "version": __version__, "command": command,
                    "from": src, "to": dst}
    if totals is not None:
        record["totals"] = dict(totals)
    if previous is not None:
        record["previous"] = dict(previous)
    return record


def _read(p: Path):
    return json.loads(p.read_bytes().decode("utf-8"))


def quant_config(name: str, doc: object) -> dict | None:
    """The quantization config that the parsed config file `name` holds (what load_config
    reads), or None."""
    if name == CONFIG_JSON:
        q = doc.get(CONFIG_KEY) if isinstance(doc, dict) else None
        return q if isinstance(q, dict) else None
    return doc if isinstance(doc, dict) else None


def declaring_configs(src_dir: Path) -> list[str]:
    """The config files in src_dir that hold a quantization config: the ones rewrite_configs
    relabels. Empty means the output needs a derived quantize_config.json."""
    return [n for n in CONFIG_FILES
            if (src_dir / n).is_file() and quant_config(n, _read(src_dir / n)) is not None]


def rewrite_configs(src_dir: Path, out_dir: Path, to: str, prov: dict,
                    derived: dict | None = None) -> list[str]:
    """Write converted copies of the config files present in src_dir, plus `derived` (see
    derive_config) as quantize_config.json; return the names written."""
    written = []
    for name in CONFIG_FILES:
        p = src_dir / name
        if not p.is_file() or (derived is not None and name == DERIVED_FILE):
            continue  # the derived file replaces one that holds no config (`null`)
        doc = _read(p)
        if quant_config(name, doc) is None:
            with open(p, "rb") as fin, create(out_dir / name) as fout:  # as it is
                fout.write(fin.read())
            written.append(name)
            continue
        _write_json(out_dir / name, relabelled(name, doc, to, prov))
        written.append(name)
    if derived is not None:
        _write_json(out_dir / DERIVED_FILE, set_convention(derived, to, {**prov,
                                                                          "config": "derived"}))
        written.append(DERIVED_FILE)
    return written


def _write_json(path: Path, doc) -> None:
    with create(path) as f:
        f.write(dumps(doc))


def derive_config(ckpt: Checkpoint, src_conv: str, to: str) -> tuple[dict | None, list[Finding]]:
    """The quantize_config.json for a source without a config file, and the findings about it:
    a GQ206 warning saying what is written and where each value comes from, or the errors that
    refuse the conversion (no single config describes the modules).

    Values declared by the checkpoint (AutoGPTQ's `__metadata__`, as config.py reads it) are
    kept: verify has checked them against the shapes already (GQ304-GQ306); shapes that no one
    config describes are refused (GQ415). The others come from
    the shapes: bits and word size per module, group size from g_idx, desc_act true when any
    g_idx is non-trivial, sym true exactly when every zero point is 2^(bits-1) (a checkpoint that
    says sym must hold the constant: Marlin ignores qzeros), lm_head when an lm_head is
    quantized."""
    modules = ckpt.valid_modules
    cfg = ckpt.config
    decl = cfg.base if cfg is not None else None
    found: list[Finding] = []
    declared: dict = {}
    if decl is not None:
        declared = {k: getattr(decl, k) for k in ("bits", "group_size", "desc_act", "sym",
                                                  "pack_dtype") if getattr(decl, k) is not None}
    from_shapes = data_values(ckpt, src_conv, found)
    if found:
        return None, found
    values = {**from_shapes, **declared}
    body = {"bits": values["bits"], "group_size": values["group_size"],
            "desc_act": values["desc_act"], "sym": values["sym"]}
    if cfg is not None and cfg.static_groups:
        body["static_groups"] = True
    body.update({"lm_head": any(is_lm_head(m.name) for m in modules),
                 "pack_dtype": values["pack_dtype"], "quant_method": "gptq",
                 "checkpoint_format": to, "format": to})
    shaped = [k for k in from_shapes if k not in declared]
    where = (f"{' and '.join(cfg.sources)} ({', '.join(declared)}) and "
             if declared and cfg is not None else "")
    summary = ", ".join(f"{k}={json.dumps(v)}" for k, v in body.items())
    found.append(Finding(
        "GQ206", f"no quantize_config.json, config.json quantization_config or "
        f"quant_config.json: DST gets a {DERIVED_FILE} derived from {where}the tensor shapes "
        f"and zero points ({', '.join(shaped)}): {summary}",
        hint="check the derived values; the safetensors files and their __metadata__ are "
             "left unchanged",
        details={"written": body, "declared": sorted(declared), "from_shapes": shaped}))
    return body, found


def data_values(ckpt: Checkpoint, convention: str, found: list[Finding],
                keys=("bits", "pack_dtype", "group_size", "desc_act", "sym")) -> dict:
    """What the data say each quantization key is, for the modules as stored in `convention`:
    bits and word size per module, group size from the shapes, desc_act true when any g_idx
    reorders, sym true exactly when every zero point is 2^(bits-1) (Marlin ignores qzeros, so
    sym true on any other zero would decode wrong). A key the modules disagree on is left out,
    with a GQ415 in `found`. sym reads every qzeros; the others only the headers."""
    modules = ckpt.valid_modules
    values: dict = {}
    for key in keys:
        before = len(found)
        if key == "bits":
            v = _one(modules, lambda m: m.bits, "bits", found)
        elif key == "pack_dtype":
            v = _one(modules, lambda m: m.pack_dtype, "pack_dtype", found)
        elif key == "group_size":
            v = _group_size(modules, found)
        elif key == "desc_act":
            v = any(m.act_order for m in modules)
        else:
            v = all(ckpt.symmetric_pattern(m) == convention for m in modules)
        if len(found) == before:
            values[key] = v
    return values


def _one(modules: list[Module], value, key: str, found: list[Finding]):
    """The value every module has, or a refusal naming the groups that differ."""
    groups: dict = {}
    for m in modules:
        groups.setdefault(value(m), []).append(m.name)
    if len(groups) <= 1:
        return next(iter(groups), None)
    unit = {"bits": " bits", "pack_dtype": " words"}.get(key, "")
    parts = "; ".join(f"{v}{unit} in {len(names)} module{'s' if len(names) != 1 else ''} "
                      f"({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                      for v, names in sorted(groups.items(), key=lambda kv: str(kv[0])))
    found.append(Finding(
        "GQ415", f"no config file declares {key}, and the modules' shapes disagree: {parts}. One "
        f"{DERIVED_FILE} without `dynamic` cannot describe them, and convert does not invent "
        "`dynamic` rules (vLLM matches them against its fused module names, not these); nothing "
        "was written",
        hint=f"put a {DERIVED_FILE} with the base values and `dynamic` overrides for the other "
             "modules into the source, then convert again",
        details={key: {str(v): names for v, names in groups.items()}}))
    return None


def _group_size(modules: list[Module], found: list[Finding]) -> int | None:
    """The group size of the modules with several groups (a one-group module fits any group size
    at least its in_features, and -1); -1 when every module has one group."""
    multi = [m for m in modules if m.groups > 1]
    if not multi:
        return -1
    gs = _one(multi, lambda m: m.group_size, "group_size", found)
    if gs is None:
        return None
    misfit = [m.name for m in modules if n_groups(m.in_features, gs) != m.groups]
    if misfit:
        found.append(Finding(
            "GQ415", f"no config file declares group_size, and no single one fits the shapes: "
            f"group_size={gs} from {multi[0].name}, but {', '.join(misfit[:3])} "
            f"{'has' if len(misfit) == 1 else 'have'} another group count; nothing was written",
            hint=f"put a {DERIVED_FILE} with `dynamic` overrides into the source, then convert "
                 "again"))
        return None
    return gs

