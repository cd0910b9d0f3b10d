"""inspect's and verify's view of a compressed-tensors or AWQ checkpoint: what is in it and every
check its format allows. Container, index and config findings come from opening it; per module
the format's own data checks (ct.module_checks) and the scales (GQ501), read
one module at a time."""
from __future__ import annotations

from typing import Any


from ..findings import Finding
from ..gptq.checks import bad_scales
from ..safetensors_io.dtypes import to_float32
from . import ct
from .model import COMPRESSED_TENSORS, QuantModule


def data_findings(src, m: QuantModule, full: bool) -> list[Finding]:
    """The format's checks of module `m` (inspect: full=False, bounded reads)."""
    if src.format == COMPRESSED_TENSORS:
        return ct.module_checks(src, m, full)
    return []   # AWQ: every nibble is a valid code or zero point; the shapes were checked


def module_findings(src, m: QuantModule) -> list[Finding]:
    """Every check of module `m` (verify, and convert before it writes)."""
    return data_findings(src, m, full=True) + scale_findings(src, m)


def scale_findings(src, m: QuantModule) -> list[Finding]:
    """GQ501: every scale finite and positive (verify)."""
    t = m.tensors["scales"]
    s = to_float32(src.store.view(t), m.scale_dtype)
    src.store.release([t])
    # compressed-tensors stores scales [N, G], AWQ [G, N] as GPTQ does
    axes = ("column", "group") if src.format == COMPRESSED_TENSORS else ("group", "column")
    bad = bad_scales(s, src.store.file_of(t), t, axes)
    return [bad] if bad else []


def module_json(src, m: QuantModule) -> dict[str, Any]:
    """A module as inspect's JSON describes it (the GPTQ keys; zero points are stored exactly,
    so there is no convention verdict)."""
    files = sorted({src.store.file_of(t) for t in m.tensors.values()})
    bias = f"{m.name}.bias" in src.store.locations
    return {"name": m.name, "bits": m.bits, "group_size": m.group_size,
            "desc_act": m.act_order, "sym": m.sym, "in_features": m.in_features,
            "out_features": m.out_features, "pack_dtype": "int32", "groups": m.groups,
            "scale_dtype": m.scale_dtype, "has_g_idx": "g_idx" in m.tensors,
            "has_bias": bias, "excluded_by_config": False, "valid": True, "files": files,
            "zero_point": None}


def summary(src) -> dict[str, Any]:
    """inspect's `quantization` for these modules: a value where every module agrees."""
    mods = src.modules

    def uniform(attr):
        vals = {getattr(m, attr) for m in mods}
        return vals.pop() if len(vals) == 1 else None

    return {"bits": uniform("bits"), "group_size": uniform("group_size"), "sym": uniform("sym"),
            "desc_act": uniform("act_order"), "pack_dtype": "int32" if mods else None,
            "lm_head": any(m.name.split(".")[-1] == "lm_head" for m in mods),
            "static_groups": False,
            "mixed": any(len({getattr(m, a) for m in mods}) > 1
                         for a in ("bits", "group_size", "act_order", "sym"))}


def layout_words(src) -> str:
    """What the format stores, in words, for the text report."""
    if src.format == COMPRESSED_TENSORS:
        cfg = src.config
        return (f"compressed-tensors {cfg.format or ct.PACKED} (config version "
                f"{cfg.version or 'not given'}; {cfg.label})")
    return f"AutoAWQ GEMM ({src.label or 'no config; from the tensor shapes'})"
