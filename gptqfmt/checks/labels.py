"""Declared convention against detected, and the config files against each other: the
findings both inspect and verify report."""
from __future__ import annotations

import shlex

from ..bits.conventions import GPTQ, GPTQ_V2
from ..detection.decide import AMBIGUOUS
from ..detection.pool import Detection
from ..findings import Finding
from ..formats.configs import fix_label_command
from ..formats.gptq.checkpoint import Checkpoint
from ..runtimes.table import RUNTIMES
from ..runtimes.verdicts import DEFAULT_CAPABILITY, config_facts


def convention_findings(ckpt: Checkpoint, det: Detection) -> list[Finding]:
    """GQ401, GQ402, GQ404: the label the runtimes read against what the data are; GQ212:
    the config files against each other (files_disagree)."""
    cfg = ckpt.config
    where = cfg.declared_in[0].file if cfg and cfg.declared_in else (
        cfg.sources[0] if cfg and cfg.sources else None)
    declared = ckpt.label
    out: list[Finding] = files_disagree(ckpt)
    if not det.modules:
        return out  # nothing to detect from (GQ314 or geometry findings say why)
    if det.verdict == AMBIGUOUS:
        if any(e.endswith("modules disagree") for e in det.evidence):
            mix = {c: [v.name for v in det.modules if v.verdict == c] for c in (GPTQ, GPTQ_V2)}
            out.append(Finding("GQ404", f"{len(mix[GPTQ])} modules read as gptq (e.g. "
                               f"{mix[GPTQ][0]}), {len(mix[GPTQ_V2])} as gptq_v2 (e.g. "
                               f"{mix[GPTQ_V2][0]}); one label cannot be right for both",
                               file=where))
        else:
            out.append(Finding("GQ402", "the data do not decide between gptq and gptq_v2: "
                               + "; ".join(det.evidence), file=where))
    elif det.verdict != declared:
        label = (f"declares {declared}" if cfg and cfg.convention == declared else
                 "declares no usable checkpoint_format, so runtimes read gptq")
        path = shlex.quote(str(ckpt.path))
        fix = fix_label_command(ckpt.path)
        hint = (f"`{fix}` sets checkpoint_format and format to "
                f"{det.verdict} in every config (no tensor touched); `gptqfmt doctor {path} "
                "--runtime ID` says what one runtime needs")
        # a key that names the convention by another value (auto-round's packing_format)
        named = next((d for d in cfg.declared_in if d.written is not None), None) if cfg \
            else None
        if named is not None and cfg is not None and cfg.convention == declared:
            label = f"declares {declared} ({named.key}={named.written!r})"
            hint = (f"`{fix}` sets {named.key} to the data's "
                    f"{det.verdict} (no tensor touched)")
        out.append(Finding(
            "GQ401", f"config {label}, but the data are {det.verdict} (confidence "
            f"{det.confidence:.4f}); every zero point will be read off by one",
            file=where, hint=hint,
            details={"declared": declared, "detected": det.verdict,
                     "confidence": det.confidence}))
    return out


def files_disagree(ckpt: Checkpoint) -> list[Finding]:
    """GQ212 when the config files declare different conventions (`checkpoint_format` and
    `format`; a file that declares neither says gptq, every loader's default for it), naming
    what each loader that reads a label reads, from which file and key (runtimes/table.py:
    the first of its config files present, the first of its label keys set there).

    Loaders take different files: GPTQModel quantize_config.json first, transformers, vLLM,
    SGLang, ExLlamaV2 and llama.cpp config.json's quantization_config. A file-by-file
    disagreement therefore splits them; optimum 2.3 writes one (config.json format gptq_v2,
    quantize_config.json format gptq, gptq data: make_fixtures.py optimum_quantize_config)."""
    cfg = ckpt.config
    if cfg is None:
        return []
    files = [f for f in cfg.sources if f != "__metadata__"]
    said = {f: {d.key: d.value for d in cfg.declared_in if d.file == f} for f in files}
    if not any(said.values()) or len({frozenset(v.values()) or frozenset([GPTQ])
                                       for v in said.values()}) < 2:
        return []
    facts = config_facts(ckpt, DEFAULT_CAPABILITY)
    readers: dict[tuple[str, str], list[str]] = {}
    reads: dict[str, dict[str, str | None]] = {}
    for r in RUNTIMES:
        source = r.config_file(facts)
        if not r.label_keys or source is None:
            continue
        key = next((k for k in r.label_keys if k in said.get(source, {})), None)
        conv = r.convention_read(facts)
        where = f"{source} {key}" if key else f"{source}, no {' or '.join(r.label_keys)}"
        readers.setdefault((conv, where), []).append(r.name)
        reads[r.id] = {"convention": conv, "file": source, "key": key}
    declared = "; ".join(f"{f}: " + (", ".join(f"{k}={v!r}" for k, v in d.items()) or
                                     "neither key (gptq)") for f, d in said.items())
    by = "; ".join(f"{conv} by {', '.join(names)} ({where})"
                   for (conv, where), names in sorted(readers.items()))
    return [Finding("GQ212", f"the config files declare different conventions ({declared}); "
                    f"loaders read {by}", file=files[0],
                    hint="set checkpoint_format and format to the data's convention in every "
                         f"config file: `{fix_label_command(ckpt.path)}`",
                    details={"declared": said, "reads": reads})]
