"""GPTQ's quantization configs: load every source, normalise synonyms, validate, reconcile,
resolve `dynamic`.

Sources, in the precedence runtimes give them (vLLM and transformers read config.json first):
config.json["quantization_config"], quantize_config.json, quant_config.json, and as a last resort
AutoGPTQ's safetensors __metadata__ (gptq_bits, ...). Disagreements between sources are findings.
"""
from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...bits.conventions import CONVENTIONS
from ...errors import FindingError
from ...findings import Finding
from ...resources import validator
from ..configs import config_documents

# checkpoint_format / format values that are not GPTQ's own packing.
NOT_GPTQ_FORMATS = {"marlin", "bitblas", "gptq_p", "gemm", "gemv", "gemv_fast", "llm-awq", "qqq",
                    "gguf", "ipex", "qbits", "awq"}
SYNONYMS = {"w_bit": "bits", "wbits": "bits", "q_group_size": "group_size"}
COMPARED_KEYS = ("bits", "group_size", "sym", "desc_act", "pack_dtype")
OVERRIDE_KEYS = ("bits", "group_size", "sym", "desc_act", "pack_dtype")


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
    file: str
    key: str
    value: str

    def to_json(self) -> dict[str, str]:
        return {"file": self.file, "key": self.key, "value": self.value}


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
        for err in sorted(validator("quantize_config").iter_errors(doc),
                          key=lambda e: list(e.path)):
            where = ".".join(str(p) for p in err.path) or "(top level)"
            findings.append(Finding("GQ202", f"{where}: {err.message}", file=label))
    bad = {label for f in findings if f.code == "GQ202" for label in [f.file]}
    usable = [(label, doc) for label, doc in sources if label not in bad] or []
    cfg = _reconcile(sources, usable, findings)
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
    return out


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
    """GQ203 when config `doc` (normalised) describes another packing than GPTQ's, else None."""
    method = doc.get("quant_method")
    method = method.lower() if isinstance(method, str) else method
    fmt = next((doc[k] for k in ("checkpoint_format", "format")
                if isinstance(doc.get(k), str) and doc[k].lower() in NOT_GPTQ_FORMATS), None)
    why = None
    if isinstance(method, str) and method not in ("gptq", "auto_round"):
        why = f"quant_method is {method!r}"
    elif fmt is not None:
        why = f"checkpoint_format/format is {fmt!r}"
    elif doc.get("is_marlin_format") is True:
        why = "is_marlin_format is true"
    elif isinstance(doc.get("version"), str) and doc["version"].lower() in NOT_GPTQ_FORMATS:
        why = f"version is {doc['version']!r} (AutoAWQ)"
    elif isinstance(doc.get("bits"), int) and doc["bits"] in (5, 6, 7):
        why = f"bits is {doc['bits']} (planar gptq_p packing)"
    if why and (method in ("compressed-tensors", "awq") or "AutoAWQ" in why):
        # a format gptqfmt reads (formats/): only the GPTQ-only commands end up here
        return Finding("GQ203", f"{why}: not GPTQ's packing, but the checkpoint is read as "
                       "GPTQ here (another config names gptq first, or this command reads "
                       "only GPTQ; inspect, verify and convert read that format too)",
                       file=label, hint="remove a stray config; for a checkpoint in that "
                                        "format, `gptqfmt convert SRC DST --to gptq_v2` writes "
                                        "its GPTQ form")
    if why:
        return Finding("GQ203", f"{why}: not GPTQ's packing; gptqfmt reads only gptq and "
                       "gptq_v2 checkpoints", file=label,
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


def _reconcile(sources, usable, findings) -> QuantConfig:
    declared: list[Declaration] = []
    for label, doc in sources:
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
    values = {}
    for key in COMPARED_KEYS:
        seen = {label: doc[key] for label, doc in usable if key in doc}
        if len({json.dumps(v) for v in seen.values()}) > 1:
            desc = ", ".join(f"{label} says {v!r}" for label, v in seen.items())
            findings.append(Finding("GQ205", f"{key}: {desc}; vLLM and transformers use "
                                    "config.json", file=next(iter(seen))))
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
        lm_head=primary["lm_head"] if isinstance(primary.get("lm_head"), bool) else None)


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
