"""GPTQ's quantization configs: load every source, normalise synonyms, validate, reconcile,
resolve `dynamic`.

Sources, in the precedence runtimes give them (vLLM and transformers read config.json first):
config.json["quantization_config"], quantize_config.json, quant_config.json, and as a last resort
AutoGPTQ's safetensors __metadata__ (gptq_bits, ...). Disagreements between sources are findings.
auto-round's own config (quant_method "auto-round") is read here too: GPTQ's tensors, the
convention named by its packing_format (AUTOROUND_PACKING), its extra_config as `dynamic`.
"""
from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...bits.conventions import CONVENTIONS, GPTQ, GPTQ_V2
from ...errors import FindingError
from ...findings import Finding
from ...resources import schema_errors
from ..configs import config_documents, fix_label_command

# checkpoint_format / format values that are not GPTQ's own packing.
NOT_GPTQ_FORMATS = {"marlin", "bitblas", "gptq_p", "gemm", "gemv", "gemv_fast", "llm-awq", "qqq",
                    "gguf", "ipex", "qbits", "awq"}
# Keys a loader refuses by name, whatever their value: AutoGPTQ 0.7's `is_marlin_format`
# (0.7.1 writes `false` into every quantize_config.json), which GPTQModel 6.0 and later refuse
# (runtimes/table.py cites it). `true` means Marlin-repacked tensors and is refused here
# (refusal); convert and fix-label drop a `false` one (conversion/configs.py).
LEGACY_KEYS = ("is_marlin_format",)
# Formats recognised by name that gptqfmt cannot read: (what they are, why gptqfmt refuses
# them, the next step), for GQ203's message and hint.
# - gptq_p: ModelCloud/GPTQModel 9df21c4599c4 (#2996, first in v7.3.4),
#   gptqmodel/quantization/config.py FORMAT.GPTQ_P L112-114, utils/planar_packing.py L6-26,
#   docs/gptq_planar.md L18-21 ("Only the config metadata distinguishes a planar checkpoint").
# - vptq: microsoft/VPTQ, read by transformers' VptqConfig (quant_method "vptq").
# - is_marlin_format true: AutoGPTQ 0.7.1 (b8b41270) qlinear_marlin.py MarlinQuantLinear
#   L111-124 (buffers B [in/16, out*2] and s) and modeling/_base.py from_quantized L926-930.
FOREIGN = {
    "gptq_p": (
        "GPTQModel's planar layout (gptq_p: every 32 codes stored as `bits` words of bit "
        "planes, low plane first), not GPTQ's continuous bit stream",
        "its tensors have GPTQ's names and shapes, but at 3 bits its words hold other bits "
        "than GPTQ's (and GPTQ has no 5, 6 or 7-bit layout); only this label tells the two "
        "apart, so gptqfmt, which reads GPTQ's continuous bit stream only, refuses it rather "
        "than misread its codes",
        "load it with GPTQModel 7.3.4 or later; for other runtimes quantize again with format "
        "gptq_v2 at 2, 3, 4 or 8 bits (at 2, 4 and 8 bits GPTQModel documents gptq_p as "
        "gptq_v2's words under another label, so setting format and checkpoint_format to "
        "gptq_v2 there is the whole conversion)"),
    "vptq": (
        "VPTQ (microsoft/VPTQ): vector quantization, not GPTQ's packing",
        "each weight is an index into codebooks (centroids, res_centroids, indices), with no "
        "qweight, qzeros or per-group scales and zero points, so there is nothing gptqfmt "
        "can read or convert",
        "load it with VPTQ (transformers' VptqConfig)"),
    "is_marlin_format": (
        "AutoGPTQ's Marlin repack (each layer's B and s in Marlin's tiled 4-bit layout, no "
        "qweight or qzeros), not GPTQ's packing",
        "gptqfmt reads GPTQ's own packing (and compressed-tensors' and AutoAWQ GEMM's), and "
        "does not undo Marlin's tiling",
        "load it with AutoGPTQ 0.7 (from_quantized(..., use_marlin=True)), or convert the "
        "original GPTQ checkpoint instead"),
}
SYNONYMS = {"w_bit": "bits", "wbits": "bits", "q_group_size": "group_size"}
COMPARED_KEYS = ("bits", "group_size", "sym", "desc_act", "pack_dtype")
OVERRIDE_KEYS = ("bits", "group_size", "sym", "desc_act", "pack_dtype")

# auto-round's own export (intel/auto-round; its default format, that of many published
# models): GPTQ's tensors under quant_method "auto-round" ("intel/auto-round" up to 0.4.7, when
# the key below was `backend`), with the zero-point convention named by `packing_format`.
# Read at intel/auto-round b9f3d0079d014c73a1ff009800c597b9bc3f2a36:
# - auto_round/inference/backend.py L210-212: GPTQ_FORMAT = ["auto_round:auto_gptq"] ("zp+-1":
#   Z - 1 stored, auto_round_extension/torch/qlinear_torch_zp.py L129/143 `zeros -= 1`; the
#   0.16.0 wheel clamps (zeros - 1).clamp_(0, maxq), GQ506), GPTQ_FORMAT_NO_ZP = ["auto_round",
#   "auto_round:gptqmodel"] (Z itself: qlinear_torch.py L144-157; gptqmodel's also stores
#   g_idx = i // group_size, L90-93), AWQ_FORMAT = ["auto_round:auto_awq"] (AutoAWQ's GEMM
#   layout, which formats/awq.py reads: open.py sniffs it so).
# - export/export_to_autoround/export.py L274-280, L288-289, L330: a symmetric "auto_round"
#   export is written as auto_round:auto_gptq; quant_method and packing_format are set there,
#   and no desc_act, checkpoint_format or format; extra_config holds the per-layer overrides.
# - inference/convert_model.py L882-899: packing_format where present, else (with a warning)
#   auto_round:auto_gptq; "auto" and "auto_round:gptq" read as auto_round:auto_gptq.
#   transformers 5.24's AutoRoundConfig defaults packing_format to "auto_round:gptq" (v1).
# Runtimes: vLLM 0.33 (inc.py) and SGLang 0.5.23 (auto_round.py SUPPORTED_FORMATS =
# {"auto_round:auto_gptq", "auto_round:auto_awq"}) refuse auto_round and auto_round:gptqmodel and
# read a missing packing_format as auto_gptq (v1). The runtime table (runtimes/) models GPTQ's
# loaders, which read checkpoint_format and format; the packing_format Declaration is named by
# its own key, so they do not take it for one of theirs.
AUTOROUND_METHODS = ("auto-round", "intel/auto-round")
PACKING_KEY = "packing_format"
AUTOROUND_PACKING = {"auto_round:auto_gptq": GPTQ, "auto_round:gptq": GPTQ, "auto": GPTQ,
                     "auto_round": GPTQ_V2, "auto_round:gptqmodel": GPTQ_V2}
AUTOROUND_AWQ = ("auto_round:auto_awq", "auto_round:awq")   # convert_model.py L896-897
AUTOROUND_DEFAULT = "auto_round:auto_gptq"    # what its loaders read where the key is missing
# a plain layer name in extra_config (an exact match); anything else is one of
# to_standard_regex's patterns (auto_round/utils/common.py L813), matched with re.search
_LAYER_NAME = re.compile(r"[\w.]+")


@dataclass(frozen=True)
class ModuleConfig:
    """The declared quantization of one module (after `dynamic`); None = not declared."""
    bits: int | None = None
    group_size: int | None = None
    sym: bool | None = None
    desc_act: bool | None = None
    pack_dtype: str | None = None


@dataclass(frozen=True)
class DynamicRule:
    key: str            # as written, e.g. "+:.*\\.mlp\\..*"
    exclude: bool       # "-:" rule
    pattern: re.Pattern
    overrides: dict


@dataclass(frozen=True)
class Declaration:
    """One place a config declares the convention: `value` is the convention (gptq, gptq_v2, or
    whatever checkpoint_format or format says); `written`, where the key names it by another
    value (auto-round's packing_format), that value as the file writes it."""
    file: str
    key: str
    value: str
    written: str | None = None

    def to_json(self) -> dict[str, str]:
        out = {"file": self.file, "key": self.key, "value": self.value}
        if self.written is not None:
            out["written"] = self.written
        return out

    def said(self) -> str:
        """key=value as the file says it, for messages."""
        if self.written is not None:
            return f"{self.key}={self.written!r} ({self.value})"
        return f"{self.key}={self.value!r}"


@dataclass
class QuantConfig:
    base: ModuleConfig
    convention: str | None             # declared gptq / gptq_v2; None when no file says
    runtime_convention: str            # what vLLM and ExLlamaV2 read (checkpoint_format)
    declared_in: list[Declaration]
    sources: list[str]                 # where the values came from, in precedence order
    dynamic: list[DynamicRule] = field(default_factory=list)
    static_groups: bool = False
    meta: dict = field(default_factory=dict)
    lm_head: bool | None = None        # the `lm_head` key (GPTQModel, vLLM): None when not set
    # whether its producer's export writes g_idx: auto-round's does only for
    # auto_round:gptqmodel (qlinear_torch.py L90-93), so a module without one is no GQ308
    g_idx_written: bool = True
    # every source's keys as written (after synonyms), by label, in precedence order
    keys: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def legacy_keys(self) -> tuple[tuple[str, str], ...]:
        """(source, key) of each key a loader refuses by name (LEGACY_KEYS; GPTQModel
        compares keys lower-cased)."""
        return tuple((label, k) for label, ks in self.keys.items() for k in ks
                     if k.lower() in LEGACY_KEYS)

    def for_module(self, name: str) -> ModuleConfig | None:
        """The module's declared config, or None when a `-:` rule leaves it unquantized.

        The first matching rule in file order decides (vLLM's get_dynamic_override; GPTQModel
        writes exclusions first); patterns use re.match (anchored at the start only) on the full
        module name.
        """
        for rule in self.dynamic:
            if rule.pattern.match(name):
                if rule.exclude:
                    return None
                o = {k: v for k, v in rule.overrides.items() if k in OVERRIDE_KEYS}
                return ModuleConfig(**{**self.base.__dict__, **o})
        return self.base


def load_config(root: Path, st_metadata: dict[str, str] | None = None
                ) -> tuple[QuantConfig | None, list[Finding]]:
    """Read every config source under `root`. Raises FindingError for a non-GPTQ layout."""
    sources, findings = config_documents(root)
    sources = [(label, _normalise(doc)) for label, doc in sources]
    if not sources and st_metadata and "gptq_bits" in st_metadata:
        sources.append(("__metadata__", _from_st_metadata(st_metadata)))
    if not sources:
        findings.append(Finding("GQ206", "no quantize_config.json, config.json "
                                "quantization_config or quant_config.json; values come from the "
                                "tensor shapes alone"))
        return None, findings
    for label, doc in sources:
        _refuse_non_gptq(label, doc)
    for label, doc in sources:
        for err in sorted(schema_errors("quantize_config", doc),
                          key=lambda e: list(e.path)):
            where = ".".join(str(p) for p in err.path) or "(top level)"
            findings.append(Finding("GQ202", f"{where}: {err.message}", file=label))
    bad = {label for f in findings if f.code == "GQ202" for label in [f.file]}
    usable = [(label, doc) for label, doc in sources if label not in bad] or []
    cfg = _reconcile(sources, usable, findings, root)
    return cfg, findings


def _normalise(doc: dict) -> dict:
    """Apply key synonyms (w_bit, q_group_size, zero_point). Keys and values keep their case:
    vLLM compares checkpoint_format == "gptq_v2" exactly, so "GPTQ_V2" must stay visible."""
    out: dict[str, Any] = {}
    for k, v in doc.items():
        key = SYNONYMS.get(k, k)
        if key == "zero_point" and isinstance(v, bool):
            out.setdefault("sym", not v)
        out.setdefault(key, v)
    return _from_autoround(out) if is_autoround(out) else out


def is_autoround(doc: dict) -> bool:
    """Whether quantization config `doc` is auto-round's own (AUTOROUND_METHODS)."""
    method = doc.get("quant_method")
    return isinstance(method, str) and method.lower() in AUTOROUND_METHODS


def _from_autoround(doc: dict) -> dict:
    """auto-round's config with what its loader reads in GPTQ's words: a missing desc_act as
    false (convert_model.py L871-876 `getattr(quantization_config, "desc_act", False)`; it
    quantizes without act-order), and extra_config as `dynamic` (extra_config_dynamic)."""
    out = dict(doc)
    out.setdefault("desc_act", False)
    rules = extra_config_dynamic(doc.get("extra_config"))
    if rules and "dynamic" not in out:
        out["dynamic"] = rules
    return out


def extra_config_dynamic(extra: object) -> dict[str, dict]:
    """auto-round's extra_config as GPTQModel's `dynamic` (first matching rule decides,
    re.match): as its loader resolves it (convert_model.py get_layer_config, inference/utils.py
    _expand_regex_config), a layer named exactly takes its own entry, and another layer the
    first pattern that re.search finds in its name. So exact names come first, anchored at both
    ends, then the patterns as `.*(?:pattern)`. bits above 8 (16: full precision) exclude the
    layer (`-:`); bits, group_size and sym override; an empty entry is skipped, as there."""
    if not isinstance(extra, dict):
        return {}
    exact: dict[str, dict] = {}
    search: dict[str, dict] = {}
    for name, cfg in extra.items():
        if not isinstance(cfg, dict) or not cfg:
            continue
        bits = cfg.get("bits")
        exclude = isinstance(bits, int) and not isinstance(bits, bool) and bits > 8
        over = {} if exclude else {k: cfg[k] for k in ("bits", "group_size", "sym") if k in cfg}
        if not exclude and not over:
            continue   # data_type or activation settings only: nothing GPTQ's config says
        sign = "-:" if exclude else "+:"
        if _LAYER_NAME.fullmatch(name):
            exact[f"{sign}{re.escape(name)}$"] = over
        else:
            search[f"{sign}.*(?:{name})"] = over
    return {**exact, **search}


def autoround_packing(convention: str, g_idx: bool) -> str:
    """The packing_format auto-round writes for data in `convention`: auto_round:auto_gptq for
    gptq, auto_round:gptqmodel for gptq_v2 with g_idx tensors, auto_round without."""
    if convention == GPTQ:
        return AUTOROUND_DEFAULT
    return "auto_round:gptqmodel" if g_idx else "auto_round"


def label_values(doc: dict, to: str, g_idx: bool) -> dict[str, str]:
    """The label keys a relabel to convention `to` sets in quantization config `doc` (its
    other keys stay): checkpoint_format and format in GPTQ's; in auto-round's, packing_format
    (autoround_packing; `g_idx`: whether the modules store g_idx), and checkpoint_format and
    format only where already present (GQ215 when they disagree with it)."""
    if is_autoround(doc):
        out = {PACKING_KEY: autoround_packing(to, g_idx)}
        out.update({k: to for k in ("checkpoint_format", "format") if k in doc})
        return out
    return {"checkpoint_format": to, "format": to}


def as_gptq(doc: dict) -> tuple[dict, dict]:
    """(quantization config `doc` as GPTQ's, the keys dropped): what convert writes, whatever
    the source. auto-round's gets quant_method "gptq" in its place, desc_act false where
    missing, extra_config's overrides as `dynamic` (extra_config kept; GPTQ's loaders do not
    read it), and loses packing_format and the old `backend`, which GPTQ's loaders do not read
    for the zero points (transformers' GPTQConfig takes `backend` for its kernel); any other
    config is returned as it is."""
    if not is_autoround(doc):
        return dict(doc), {}
    dropped = {k: v for k, v in doc.items() if k in (PACKING_KEY, "backend")}
    out = {k: ("gptq" if k == "quant_method" else v) for k, v in doc.items()
           if k not in dropped}
    return _from_autoround(out), dropped


# AutoGPTQ's save_quantized writes these safetensors __metadata__ keys (str() of each value):
# 0.7.1 (AutoGPTQ/AutoGPTQ v0.7.1 = b8b41270f3dd5d657aee049d7b64538ab5dd244e,
# auto_gptq/modeling/_base.py) format, auto_gptq_version, gptq_bits, gptq_group_size,
# gptq_desc_act, gptq_damp_percent, gptq_is_marlin_format; main
# (9f7d37072917ab3a7545835f23e808294a542153) replaces gptq_is_marlin_format with
# gptq_checkpoint_format and gptq_quant_method. Neither writes
# sym, static_groups or true_sequential (gptq_sym is read should a tool write it); GPTQModel,
# optimum and transformers write only {"format": "pt"} (plus what a caller passes).
ST_METADATA_BOOLS = {"gptq_desc_act": "desc_act", "gptq_is_marlin_format": "is_marlin_format",
                     "gptq_sym": "sym"}


def _from_st_metadata(md: dict[str, str]) -> dict:
    out: dict[str, Any] = {}
    for key, conv in (("bits", int), ("group_size", int)):
        try:
            out[key] = conv(md[f"gptq_{key}"])
        except (KeyError, ValueError):
            pass
    for src, key in ST_METADATA_BOOLS.items():
        if md.get(src) in ("True", "False"):
            out[key] = md[src] == "True"
    if "gptq_checkpoint_format" in md:
        out["checkpoint_format"] = md["gptq_checkpoint_format"].lower()
    if "gptq_quant_method" in md:
        out["quant_method"] = md["gptq_quant_method"]
    return out


def _refuse_non_gptq(label: str, doc: dict) -> None:
    found = refusal(label, doc)
    if found is not None:
        raise FindingError(found)


def refusal(label: str, doc: dict) -> Finding | None:
    """GQ203 when config `doc` (normalised) describes another packing than GPTQ's, else None;
    a format named in FOREIGN is said with what it is and why gptqfmt cannot read it."""
    method = doc.get("quant_method")
    method = method.lower() if isinstance(method, str) else method
    fmt_key = next((k for k in ("checkpoint_format", "format")
                    if isinstance(doc.get(k), str) and doc[k].lower() in NOT_GPTQ_FORMATS), None)
    why = None
    known: str | None = None    # the FOREIGN entry that names it
    packing = doc.get(PACKING_KEY)
    if isinstance(method, str) and method not in ("gptq", "auto_round") + AUTOROUND_METHODS:
        why, known = f"quant_method is {method!r}", method
    elif method in AUTOROUND_METHODS and packing in AUTOROUND_AWQ:
        why = f"{PACKING_KEY} is {packing!r} (AutoAWQ's GEMM layout)"
    elif fmt_key is not None:
        why, known = f"{fmt_key} is {doc[fmt_key]!r}", doc[fmt_key].lower()
    elif doc.get("is_marlin_format") is True:
        why, known = "is_marlin_format is true", "is_marlin_format"
    elif isinstance(doc.get("version"), str) and doc["version"].lower() in NOT_GPTQ_FORMATS:
        why = f"version is {doc['version']!r} (AutoAWQ)"
    elif isinstance(doc.get("bits"), int) and doc["bits"] in (5, 6, 7):
        why, known = (f"bits is {doc['bits']} (GPTQModel stores 5, 6 and 7 bits only in its "
                      "planar layout)"), "gptq_p"
    if known in FOREIGN:
        what, cannot, step = FOREIGN[known]
        return Finding("GQ203", f"{why}: {what}; {cannot}", file=label, hint=step)
    if why and (method in ("compressed-tensors", "awq") or "AutoAWQ" in why):
        # a format gptqfmt reads (formats/): only the GPTQ-only commands end up here
        return Finding("GQ203", f"{why}: not GPTQ's packing, but the checkpoint is read as "
                       "GPTQ here (another config names gptq first, or this command reads "
                       "only GPTQ; inspect, verify and convert read that format too)",
                       file=label, hint="remove a stray config; for a checkpoint in that "
                                        "format, `gptqfmt convert SRC DST --to gptq_v2` writes "
                                        "its GPTQ form")
    if why:
        return Finding("GQ203", f"{why}: not GPTQ's packing; gptqfmt reads GPTQ (gptq, gptq_v2, "
                       "auto-round's GPTQ packings), compressed-tensors pack-quantized and "
                       "AutoAWQ GEMM checkpoints", file=label,
                       hint="convert it to GPTQ with the tool that produced it")
    return None


def not_gptq(root: Path, fmt: str) -> Finding:
    """GQ203 for a checkpoint in format `fmt` that a command reading only GPTQ was given: the
    first config that says so, as load_config refuses it, else the format its tensors show."""
    docs, _ = config_documents(root)
    for label, doc in docs:
        found = refusal(label, _normalise(doc))
        if found is not None:
            return found
    return Finding("GQ203", f"the tensors are stored as {fmt} (no config says so): not GPTQ's "
                   "packing, and this command reads only GPTQ; inspect, verify and convert "
                   "read that format too", hint="for a checkpoint in that format, `gptqfmt "
                   "convert SRC DST --to gptq_v2` writes its GPTQ form")


def _reconcile(sources, usable, findings, root: Path) -> QuantConfig:
    declared: list[Declaration] = []
    packed: dict[str, str | None] = {}   # auto-round's configs: the convention its loaders read
    for label, doc in sources:
        if is_autoround(doc):
            packed[label] = _packing_label(label, doc, declared, findings)
        for key in ("checkpoint_format", "format"):
            if isinstance(doc.get(key), str):
                declared.append(Declaration(label, key, doc[key]))
        cf, f = doc.get("checkpoint_format"), doc.get("format")
        if f == "gptq_v2" and cf is None:
            findings.append(Finding("GQ209", "format is 'gptq_v2' but checkpoint_format is "
                                    "missing: loaders that read only checkpoint_format read the "
                                    "zero points as gptq, those that read format as gptq_v2",
                                    file=label,
                                    hint="add \"checkpoint_format\": \"gptq_v2\""))
        if isinstance(cf, str) and isinstance(f, str) and cf != f:
            findings.append(Finding("GQ204", f"format is {f!r} but checkpoint_format is {cf!r}; "
                                    "GPTQModel follows format, vLLM and transformers "
                                    "checkpoint_format", file=label,
                                    hint="set both to the convention the data has"))
    for d in declared:
        if d.value not in CONVENTIONS:
            extra = (f"; vLLM compares it exactly and reads '{d.value}' as gptq"
                     if d.value.lower() in CONVENTIONS else "")
            findings.append(Finding("GQ202", f"{d.key}: '{d.value}' is not one of "
                                    f"{list(CONVENTIONS)}{extra}", file=d.file))
    for label, doc in usable:
        for key in ("bits", "group_size"):
            if isinstance(doc.get(key), float):
                findings.append(Finding("GQ202", f"{key}: {doc[key]!r} must be an integer",
                                        file=label))
    # vLLM and ExLlamaV2 read checkpoint_format only (config.json first); transformers falls
    # back to format, GPTQModel prefers it (GQ212 names each loader's reading).
    runtime = next((d.value for d in declared if d.key == "checkpoint_format"), None)
    runtime = runtime if runtime in CONVENTIONS else "gptq"
    conv = next((d.value for d in declared if d.key == "checkpoint_format"
                 and d.value in CONVENTIONS), None)
    conv = conv or next((d.value for d in declared if d.value in CONVENTIONS), None)
    g_idx_written = True
    if sources and sources[0][0] in packed:
        # the config loaders read first is auto-round's: they read its packing_format
        # (AUTOROUND_PACKING; None: a value none of them knows, GQ214)
        conv = packed[sources[0][0]]
        runtime = conv or GPTQ
        g_idx_written = sources[0][1].get(PACKING_KEY) == "auto_round:gptqmodel"
    values = {}
    for key in COMPARED_KEYS:
        seen = {label: doc[key] for label, doc in usable if key in doc}
        if len({json.dumps(v) for v in seen.values()}) > 1:
            desc = ", ".join(f"{label} says {v!r}" for label, v in seen.items())
            findings.append(Finding(
                "GQ205", f"{key}: {desc}; vLLM and transformers use config.json",
                file=next(iter(seen)),
                hint=f"`{fix_label_command(root)}` sets {key} in every config "
                     "file to what the data are"))
        if seen:
            values[key] = next(iter(seen.values()))
    # files that declare different conventions: GQ212 (checks/labels.py), which names what
    # each loader reads from the runtime table
    primary = usable[0][1] if usable else {}
    # A missing key matters in a file runtimes read. AutoGPTQ's __metadata__ never records sym
    # (see ST_METADATA_BOOLS), so its absence there says nothing; the data decide.
    config_files = [label for label, _ in usable if label != "__metadata__"]
    for key, why in (("sym", "AutoGPTQ and GPTQModel assume true, TGI false, vLLM refuses"),
                     ("desc_act", "vLLM refuses to load without it")):
        if usable and key not in values and (config_files or key != "sym"):
            findings.append(Finding("GQ208", f"{key} is not set: {why}", file=usable[0][0]))
    dynamic = _dynamic_rules(primary.get("dynamic"), usable[0][0] if usable else None, findings)
    meta = primary["meta"] if isinstance(primary.get("meta"), dict) else {}
    return QuantConfig(
        base=ModuleConfig(**{k: values.get(k) for k in COMPARED_KEYS}),
        convention=conv, runtime_convention=runtime, declared_in=declared,
        sources=[label for label, _ in sources],
        dynamic=dynamic,
        static_groups=bool(primary.get("static_groups") or meta.get("static_groups")),
        meta=meta,
        lm_head=primary["lm_head"] if isinstance(primary.get("lm_head"), bool) else None,
        keys={label: tuple(doc) for label, doc in sources},
        g_idx_written=g_idx_written)


def _packing_label(label: str, doc: dict, declared: list[Declaration],
                   findings: list[Finding]) -> str | None:
    """The convention auto-round's loaders read from config `doc` (see AUTOROUND_PACKING), its
    packing_format appended to `declared`; a missing key reads as auto_round:auto_gptq (GQ213),
    a value no loader knows is GQ214 (None), and checkpoint_format or format saying another
    convention is GQ215."""
    packing = doc.get(PACKING_KEY)
    conv: str | None = None
    if packing is None:
        conv = GPTQ
        old = doc.get("backend")
        findings.append(Finding(
            "GQ213", f"{PACKING_KEY} is not set: auto-round's loader (and vLLM's and SGLang's "
            f"for auto-round) read the zero points as {AUTOROUND_DEFAULT} (gptq)"
            + (f"; the `backend` key ({old!r}, auto-round before 0.5) is not read for them"
               if isinstance(old, str) else ""), file=label,
            hint=f"`gptqfmt fix-label` writes the {PACKING_KEY} the data have"))
    elif isinstance(packing, str) and packing in AUTOROUND_PACKING:
        conv = AUTOROUND_PACKING[packing]
        declared.append(Declaration(label, PACKING_KEY, conv, written=packing))
    elif isinstance(packing, str) and packing not in AUTOROUND_AWQ:
        known = ", ".join(f"{k!r} ({v})" for k, v in AUTOROUND_PACKING.items())
        findings.append(Finding(
            "GQ214", f"{PACKING_KEY} is {packing!r}, which gptqfmt does not know: auto-round's "
            f"GPTQ packings are {known}, and {AUTOROUND_AWQ[0]!r} is AutoAWQ's GEMM layout; "
            "its zero points are read as gptq", file=label,
            hint=f"set {PACKING_KEY} to the packing the tensors have (`gptqfmt fix-label` "
                 "writes the one the data show)"))
    if conv is not None:
        said = f"{PACKING_KEY} {packing!r}" if packing is not None else \
            f"{PACKING_KEY} not set ({AUTOROUND_DEFAULT})"
        other = {k: doc[k] for k in ("checkpoint_format", "format")
                 if isinstance(doc.get(k), str) and doc[k] != conv}
        if other:
            findings.append(Finding(
                "GQ215", f"{said} declares {conv}, but "
                + " and ".join(f"{k} is {v!r}" for k, v in other.items())
                + ": auto-round's loader, vLLM and SGLang read packing_format, a tool that "
                "takes the config for GPTQ's the others", file=label,
                hint="set them to one convention, the data's: `gptqfmt fix-label PATH`"))
    return conv


def _dynamic_rules(dynamic, label, findings) -> list[DynamicRule]:
    if not isinstance(dynamic, dict):
        return []
    rules = []
    for key, overrides in dynamic.items():
        exclude = key.startswith("-:")
        text = key[2:] if exclude or key.startswith("+:") else key
        try:
            with warnings.catch_warnings():  # a pattern from a file must not print to stderr
                warnings.simplefilter("ignore")
                pattern = re.compile(text)
        except (re.error, OverflowError, RecursionError, ValueError) as e:
            findings.append(Finding("GQ207", f"dynamic key {key!r}: {e}", file=label))
            continue
        rules.append(DynamicRule(key, exclude, pattern, overrides if isinstance(overrides, dict)
                                 else {}))
    return rules
