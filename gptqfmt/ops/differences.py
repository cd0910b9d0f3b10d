"""What differs between two checkpoints, field by field: the primitives `verify --against` and
convert's gate between formats share (one place for what "the same" means).

Each function reads one tensor (or one module) at a time, in bounded chunks, and releases the
pages it mapped: comparing two 100 GB checkpoints holds one chunk of each in memory.

A difference is said in words, SRC's side first: "bits 4 vs 8", "only in DST",
"64 of 4096 bytes differ".
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..formats import QuantModule, Source
from ..formats.configs import CONFIG_JSON, CONFIG_KEY, TGI_SCALARS

CMP_CHUNK = 4 << 20    # bytes of each side compared per step
SIDES = ("SRC", "DST")
# config.json keys that name where a file came from, not what a model computes
PROVENANCE_KEYS = frozenset({"_name_or_path", "transformers_version", "_commit_hash"})
# a module's scheme as runtimes read it, in the words a difference names it by. Not sym: it
# picks the kernel (Marlin reads the symmetric constant instead of qzeros), not the zero
# points, so with the same zero point in every cell, compared below, both sides compute the
# same; a sym=true over other zero points is verify's GQ403 on that side
SCHEME = (("bits", "bits"), ("group_size", "group_size"), ("in_features", "in_features"),
          ("out_features", "out_features"), ("scale_dtype", "scales dtype"))
# the quantization config's fields that change what a runtime computes beyond each module's
# tensors (bits and group size are read per module too; these decide kernels and lm_head)
CONFIG_FIELDS = ("bits", "group_size", "desc_act", "lm_head")


def vs(a: Any, b: Any) -> str:
    return f"{a} vs {b}"


def scheme_differences(m: QuantModule, mb: QuantModule) -> list[str]:
    """How the two modules' geometry and scheme differ ("bits 4 vs 8"); empty when alike."""
    return [f"{word} {vs(getattr(m, attr), getattr(mb, attr))}" for attr, word in SCHEME
            if getattr(m, attr) != getattr(mb, attr)]


def codes_differ(src: Source, m: QuantModule, out: Source, mo: QuantModule) -> int:
    """How many 32-bit words of qweight differ (the one model's [K*bits/32, N]; -1 when the
    shapes differ): `out`'s words as it stores them, against `src`'s in that layout
    (Source.qweight_differ: relayout.words_differ, in blocks, one block in memory)."""
    return src.qweight_differ(m, *out.stored_qweight(mo))


def field_differences(src: Source, m: QuantModule, out: Source, mo: QuantModule,
                      codes: int | None = None,
                      scales: tuple[np.ndarray, np.ndarray] | None = None
                      ) -> list[str]:
    """The fields of two modules of the same scheme that differ, other than the zero points:
    codes word for word, scales bit for bit, g_idx entry for entry. `codes`: codes_differ's
    answer for these modules, and `scales` their scales(), where the caller has them
    already."""
    why = []
    n = codes_differ(src, m, out, mo) if codes is None else codes
    if n:
        why.append("qweight shapes differ" if n < 0 else
                   f"qweight: {n} of {m.in_features * m.bits // 32 * m.out_features} words "
                   "differ")
    sa, sb = (np.asarray(src.scales(m)), np.asarray(out.scales(mo))) if scales is None \
        else scales
    # the same scheme: the same scales dtype (F16, BF16 or F32), compared as unsigned integers,
    # bit for bit, a value a step
    n = count_differ(sa.view(f"u{sa.itemsize}"), sb.view(f"u{sb.itemsize}"))
    if n:
        why.append(f"scales: {n} of {sa.size} values differ")
    ga, gb = np.asarray(src.g_idx(m)), np.asarray(out.g_idx(mo))
    n = count_differ(ga, gb)
    if n:
        why.append(f"g_idx: {n} of {ga.size} entries differ")
    return why


def count_differ(a: np.ndarray, b: np.ndarray) -> int:
    """How many elements differ; -1 when the shapes differ."""
    if a.shape != b.shape:
        return -1
    return int(np.count_nonzero(a != b))


def bytes_differ(src: Source, out: Source, t: str) -> tuple[str | None, int]:
    """(How tensor `t` differs between the two sides, None when it does not; its size in
    bytes): dtype and shape, then its bytes, CMP_CHUNK at a time, counted."""
    a, b = src.store.info(t), out.store.info(t)
    if (a.dtype, tuple(a.shape)) != (b.dtype, tuple(b.shape)):
        return f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}", a.nbytes
    va = src.store.view(t).reshape(-1).view(np.uint8)
    vb = out.store.view(t).reshape(-1).view(np.uint8)
    n = 0
    try:
        for lo in range(0, va.size, CMP_CHUNK):
            n += int(np.count_nonzero(va[lo:lo + CMP_CHUNK] != vb[lo:lo + CMP_CHUNK]))
    finally:
        src.store.release([t])
        out.store.release([t])
    return (f"{n} of {va.size} bytes differ" if n else None), va.size


def tensor_differences(a: Source, b: Source
                       ) -> tuple[list[tuple[str, str]], int, int, int]:
    """Every tensor outside the quantized modules, on both sides, byte for byte: ([(tensor, how
    it differs)], tensors both sides have, of them identical, bytes compared). TGI's scalar
    config tensors are GPTQ's own: not looked for in a side of another format."""
    pa, pb = set(a.passthrough), set(b.passthrough)
    if (a.labelled is None) != (b.labelled is None):
        pa, pb = pa - set(TGI_SCALARS), pb - set(TGI_SCALARS)
    out = [(t, f"only in {side}") for side, only in zip(SIDES, (pa - pb, pb - pa))
           for t in sorted(only)]
    nbytes = identical = 0
    for t in sorted(pa & pb):
        why, size = bytes_differ(a, b, t)
        nbytes += size
        if why:
            out.append((t, why))
        else:
            identical += 1
    return sorted(out), len(pa & pb), identical, nbytes


def config_differences(a: Source, b: Source) -> list[tuple[str, str]]:
    """What the two sides' configs say differently, as far as it changes what a runtime
    computes: config.json's model keys (all but provenance and the quantization config, whose
    format-specific spelling differs between formats of the same weights), and the fields of
    the quantization scheme each side declares (CONFIG_FIELDS). [(where, how)]."""
    out = []
    ca, cb = _model_config(a), _model_config(b)
    if (ca is None) != (cb is None):
        out.append((CONFIG_JSON, f"only in {SIDES[ca is None]}"))
    elif ca is not None and cb is not None:
        for k in sorted(set(ca) | set(cb)):
            if k not in cb or k not in ca:
                out.append((f"{CONFIG_JSON} {k}", f"only in {SIDES[k not in ca]}"))
            elif ca[k] != cb[k]:
                out.append((f"{CONFIG_JSON} {k}", vs(_short(ca[k]), _short(cb[k]))))
    qa, qb = a.quantization(), b.quantization()
    for k in CONFIG_FIELDS:
        if qa.get(k) is not None and qb.get(k) is not None and qa[k] != qb[k]:
            out.append((f"quantization {k}", vs(qa[k], qb[k])))
    return out


def _model_config(src: Source) -> dict[str, Any] | None:
    """config.json beside the weights without provenance and its quantization config; None
    where there is none (or it is not a JSON object: verify of that side says so)."""
    p = src.root / CONFIG_JSON
    try:
        doc = json.loads(p.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    return {k: v for k, v in doc.items() if k not in PROVENANCE_KEYS and k != CONFIG_KEY}


def _short(v: Any, limit: int = 40) -> str:
    s = json.dumps(v, sort_keys=True)
    return s if len(s) <= limit else s[:limit - 3] + "..."
