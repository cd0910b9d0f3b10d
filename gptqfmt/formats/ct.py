"""compressed-tensors `pack-quantized` (W2/W3/W4/W8 A16): reader, writer and config.

What compressed-tensors 0.20.0 writes (compressors/pack_quantized/base.py, `compress`), per
quantized linear `P` with weight [N, K]:
    P.weight_packed       I32  [N, ceil(K*bits/32)]   codes, dense stream along K (relayout.py)
    P.weight_scale        F16/BF16/F32  [N, G]        group strategy: G = K / group_size;
                                                      channel strategy: G = 1
    P.weight_zero_point   I32  [ceil(N*bits/32), G]   asymmetric only, dense stream along N
    P.weight_shape        I64  [2] = (N, K)
    P.weight_g_idx        I32  [K]                    only from versions with actorder "group"
and config.json `quantization_config` = {version, quant_method: "compressed-tensors",
sparsity_config, transform_config, config_groups: {name: {targets, weights: QuantizationArgs,
input_activations, output_activations, format}}, kv_cache_scheme, format: "pack-quantized",
quantization_status: "compressed", global_compression_ratio, ignore, moe_sparsity_config}
(model_compressor.py `update_config`, QuantizationConfig.model_dump). Dequantization there is
`(q - zp) * scale` on the signed values, the same number as GPTQ's `scale * (q - Z)` on the
stored offset-binary ones.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..bits.layout import trivial_g_idx
from ..bits.packing import SUPPORTED_BITS, constant_words, unpack
from ..findings import Finding
from ..safetensors_io.index import TensorStore
from .configs import CONFIG_JSON, TGI_SCALARS
from .model import COMPRESSED_TENSORS, QuantModule, discover
from .relayout import padding_clean, stream_words, transposed
from .source import ExactSource, Source
from .targets import any_match, kind, matches, patterns

CT_VERSION = "0.20.0"       # the compressed-tensors release whose layout and config are written
METHOD = "compressed-tensors"
PACKED = "pack-quantized"
SUFFIXES = {"qweight": "weight_packed", "scales": "weight_scale",   # role -> tensor suffix
            "qzeros": "weight_zero_point", "shape": "weight_shape", "g_idx": "weight_g_idx"}
STRATEGIES = ("group", "channel")
DENSE_SINCE = (0, 18)   # pack_to_int32 packs densely since 0.18.0 (before: 32 // bits per word)


def _before(version, release: tuple[int, ...]) -> bool:
    """Whether a config's `version` string names a release before `release` (False when it is
    missing or unreadable: the shapes decide then)."""
    m = re.match(r"(\d+)\.(\d+)", str(version or ""))
    return m is not None and (int(m.group(1)), int(m.group(2))) < release


@dataclass(frozen=True)
class Group:
    """One config group's weight scheme."""
    name: str
    targets: tuple[str, ...]
    bits: int
    symmetric: bool
    strategy: str
    group_size: int | None
    actorder: str | None
    usable: bool = True     # False: a GQ210 finding says why its modules are not read


@dataclass
class CtConfig:
    label: str
    groups: list[Group]
    ignore: list[str]
    format: str | None
    version: str | None
    findings: list[Finding] = field(default_factory=list)

    def group_for(self, name: str) -> Group | None:
        """The group whose targets name `name`: exact names first, then `re:` patterns, then
        class names (`Linear`), each over every group in order, as vLLM matches them."""
        for k in ("name", "regex", "class"):
            for g in self.groups:
                if any(kind(t) == k and matches(t, name) for t in g.targets):
                    return g
        return None


def parse_config(label: str, doc: dict) -> CtConfig:
    """The groups of a compressed-tensors quantization_config; every scheme gptqfmt cannot read
    as GPTQ-style integer weights (float types, quantized activations, tensor or block
    strategies, other formats) is a GQ210 finding naming the group and the value."""
    ignore = doc.get("ignore") or []
    cfg = CtConfig(label, [], [], doc.get("format"), doc.get("version"))
    bad = cfg.findings
    if isinstance(ignore, list) and all(isinstance(t, str) for t in ignore):
        cfg.ignore = list(ignore)
    else:
        bad.append(Finding("GQ210", f"ignore is {ignore!r}; expected a list of module names "
                           "and re: patterns", file=label))

    def refuse(what: str, hint: str | None = None) -> None:
        bad.append(Finding("GQ210", what, file=label, hint=hint or
                           "gptqfmt reads pack-quantized integer weights with float activations "
                           "(WnA16); convert other schemes with compressed-tensors itself"))

    if cfg.format not in (PACKED, None):
        refuse(f"format is {cfg.format!r}; expected {PACKED!r}")
    groups = doc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        refuse("config_groups is missing or empty")
        return cfg
    for name, g in groups.items():
        refused = len(bad)
        if not isinstance(g, dict) or not isinstance(g.get("weights"), dict):
            refuse(f"config_groups.{name}: no weights scheme")
            continue
        w = g["weights"]
        fmt = g.get("format")
        if fmt not in (None, PACKED):
            refuse(f"config_groups.{name}.format is {fmt!r}; expected {PACKED!r}")
        if g.get("input_activations") or g.get("output_activations"):
            refuse(f"config_groups.{name}: activations are quantized too")
        if w.get("type", "int") != "int":
            refuse(f"config_groups.{name}.weights.type is {w.get('type')!r}; expected 'int'")
        bits = w.get("num_bits")
        if bits not in SUPPORTED_BITS:
            refuse(f"config_groups.{name}.weights.num_bits is {bits!r}; gptqfmt reads "
                   f"{', '.join(map(str, SUPPORTED_BITS))}")
        strategy = w.get("strategy") or ("group" if w.get("group_size") else "channel")
        if strategy not in STRATEGIES:
            refuse(f"config_groups.{name}.weights.strategy is {strategy!r}; expected group or "
                   "channel")
        gs = w.get("group_size")
        if strategy == "group" and (not isinstance(gs, int) or isinstance(gs, bool) or gs <= 0):
            refuse(f"config_groups.{name}.weights.group_size is {gs!r}; the group strategy "
                   "needs a positive integer")
        actorder = w.get("actorder")
        actorder = "group" if actorder is True else (actorder or None)
        targets = g.get("targets")
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            refuse(f"config_groups.{name}.targets: expected a list of strings")
            targets = []
        sym = w.get("symmetric", True)
        if not isinstance(sym, bool):
            refuse(f"config_groups.{name}.weights.symmetric is {sym!r}; expected true or false")
        if w.get("dynamic") not in (None, False):
            refuse(f"config_groups.{name}.weights.dynamic is {w.get('dynamic')!r}; weights "
                   "are stored quantized only when it is false")
        if bits not in (1, 2, 4, 8) and _before(cfg.version, DENSE_SINCE):
            refuse(f"config_groups.{name}: {bits}-bit weights written by compressed-tensors "
                   f"{cfg.version}, which packed 32 // {bits} values per word with padding; "
                   f"gptqfmt reads the dense layout of {'.'.join(map(str, DENSE_SINCE))} and "
                   "later (compressors/pack_quantized/helpers.py)",
                   hint="re-save it with a current compressed-tensors")
        cfg.groups.append(Group(name, tuple(targets), bits, sym is not False,
                                strategy, gs if strategy == "group" else None, actorder,
                                usable=len(bad) == refused))
    return cfg


class CtSource(ExactSource):
    """A compressed-tensors checkpoint, read module by module into the one model."""
    format = COMPRESSED_TENSORS
    scale_axes = ("column", "group")        # weight_scale is [N, G]

    def __init__(self, store: TensorStore, config: CtConfig, config_files: list[str]):
        self.store, self.root, self.config = store, store.root, config
        self.path = store.root   # open_source sets the file where one was opened
        self.config_files = config_files
        self.declared_by: str | None = config.label
        self.findings: list[Finding] = list(store.findings) + list(config.findings)
        self.modules, self.passthrough, found = discover(store, SUFFIXES, self._module)
        self.other_tensors = self.passthrough
        if not found:
            self.findings.append(Finding("GQ314", "no tensor named *.weight_packed: nothing is "
                                         "stored pack-quantized", file=config.label))

    def _module(self, p: str, names: dict[str, str]) -> QuantModule | None:
        st, cfg = self.store, self.config
        found = self.findings
        file = st.file_of(names["qweight"])

        def bad(code, msg, tensor=None, hint=None):
            found.append(Finding(code, msg, file=file, tensor=tensor or names["qweight"],
                                 hint=hint))

        g = cfg.group_for(p)
        if g is None:
            bad("GQ211", f"no config group of {cfg.label} targets {p}, yet it is stored "
                "pack-quantized", hint="add it to a config group's targets")
            return None
        if any_match(cfg.ignore, p) and not any(t == p for t in g.targets):
            bad("GQ211", f"{cfg.label} ignore lists {p}, yet it is stored pack-quantized",
                hint="remove it from ignore, or store it unquantized")
            return None
        if not g.usable:
            return None  # the group's GQ210 says why
        if g.symmetric and "qzeros" in names:
            bad("GQ303", f"config group {g.name} is symmetric, yet {names['qzeros']} is stored: "
                "readers of a symmetric scheme ignore it (a label that contradicts the "
                "tensors)", names["qzeros"])
            return None
        needed = ["qweight", "scales", "shape"] + ([] if g.symmetric else ["qzeros"])
        missing = [SUFFIXES[r] for r in needed if r not in names]
        if missing:
            bad("GQ301", f"lacks {', '.join(p + '.' + s for s in missing)} (config group "
                f"{g.name}: {'symmetric' if g.symmetric else 'asymmetric'} {g.strategy})")
            return None
        dtypes = {"qweight": ("I32",), "qzeros": ("I32",), "shape": ("I32", "I64"),
                  "g_idx": ("I32", "I64"), "scales": ("F16", "BF16", "F32")}
        for role, t in names.items():
            if st.info(t).dtype not in dtypes[role]:
                bad("GQ302", f"dtype {st.info(t).dtype}; expected {' or '.join(dtypes[role])}", t)
                return None
        packed, scale = st.info(names["qweight"]).shape, st.info(names["scales"]).shape
        shape = st.info(names["shape"]).shape
        if len(packed) != 2 or len(scale) != 2 or tuple(shape) != (2,):
            bad("GQ303", f"weight_packed {list(packed)}, weight_scale {list(scale)}, "
                f"weight_shape {list(shape)}: expected 2-D, 2-D and [2]")
            return None
        n, k = (int(v) for v in np.asarray(st.view(names["shape"])))
        if n <= 0 or k <= 0:
            bad("GQ303", f"weight_shape is ({n}, {k}); expected positive out and in features",
                names["shape"])
            return None
        expect = (n, stream_words(k, g.bits))
        if tuple(packed) != expect:
            bad("GQ304" if packed[0] == n else "GQ303",
                f"weight_packed is {list(packed)}; weight_shape ({n}, {k}) at {g.bits} bits "
                f"(config group {g.name}) needs {list(expect)}")
            return None
        if g.strategy == "channel":
            gs, groups = -1, 1
        else:
            assert g.group_size is not None   # parse_config refuses a group without one
            gs = g.group_size
            if k % gs:
                bad("GQ303", f"in_features {k} is not a multiple of group_size {gs}: "
                    "compressed-tensors' group strategy cannot hold a partial group")
                return None
            groups = k // gs
        if tuple(scale) != (n, groups):
            bad("GQ303", f"weight_scale is {list(scale)}; expected [{n}, {groups}] "
                f"({g.strategy} strategy, group_size {g.group_size})", names["scales"])
            return None
        if not g.symmetric:
            zshape = tuple(st.info(names["qzeros"]).shape)
            if zshape != (stream_words(n, g.bits), groups):
                bad("GQ303", f"weight_zero_point is {list(zshape)}; expected "
                    f"[{stream_words(n, g.bits)}, {groups}]", names["qzeros"])
                return None
        act = False
        if "g_idx" in names:
            gi = np.asarray(st.view(names["g_idx"]), dtype=np.int64)
            if gi.shape != (k,) or gi.size and (gi.min() < 0 or gi.max() >= groups):
                bad("GQ309", f"weight_g_idx has shape {list(gi.shape)} and values outside "
                    f"[0, {groups}); expected [{k}] group numbers", names["g_idx"])
                return None
            act = not np.array_equal(gi, trivial_g_idx(k, gs))
        return QuantModule(p, g.bits, gs, k, n, g.symmetric, act,
                           st.info(names["scales"]).dtype, names)

    # -- the one model -------------------------------------------------------------------
    def qweight(self, m: QuantModule) -> np.ndarray:
        return transposed(self.store.view(m.tensors["qweight"]))

    def stored_qweight(self, m: QuantModule) -> tuple[np.ndarray, bool]:
        """weight_packed as stored, and True: qweight is its transpose (for comparisons that
        need no transposed copy)."""
        return self.store.view(m.tensors["qweight"]), True

    def qzeros(self, m: QuantModule) -> np.ndarray:
        if m.sym:
            block = constant_words(1 << (m.bits - 1), m.bits).view(np.int32)
            reps = m.out_features * m.bits // 32 // block.size
            return np.tile(block, (m.groups, reps))
        return transposed(self.store.view(m.tensors["qzeros"]))

    def scales(self, m: QuantModule) -> np.ndarray:
        return np.ascontiguousarray(self.store.view(m.tensors["scales"]).T)

    def g_idx(self, m: QuantModule) -> np.ndarray:
        if "g_idx" in m.tensors:
            return np.asarray(self.store.view(m.tensors["g_idx"]), dtype=np.int32)
        return trivial_g_idx(m.in_features, m.group_size).astype(np.int32)

    # -- what inspect and verify say of it -----------------------------------------------
    def data_findings(self, m: QuantModule, full: bool) -> list[Finding]:
        return module_checks(self, m, full)

    def describe(self) -> str:
        cfg = self.config
        return (f"compressed-tensors {cfg.format or PACKED} (config version "
                f"{cfg.version or 'not given'}; {cfg.label})")



CLAMP_ROWS = 256      # output rows of weight_packed that inspect reads for the clamp check


def module_checks(src: CtSource, m: QuantModule, full: bool = True) -> list[Finding]:
    """The data checks of one module: padding bits of the packed streams (GQ317, verify only)
    and the signed-range clamp of an asymmetric export (GQ418; inspect reads the first
    CLAMP_ROWS output rows, verify all of them)."""
    st, out = src.store, []
    roles = (("qweight", m.in_features, 1), ("qzeros", m.out_features, 0)) if full else ()
    for role, values, axis in roles:
        if role not in m.tensors:
            continue
        t = m.tensors[role]
        clean = padding_clean(st.view(t), values, m.bits, axis)
        st.release([t])
        if not clean.all():
            out.append(Finding(
                "GQ317", f"{int((~clean).sum())} of {clean.size} packed streams have bits set "
                f"past their last value ({values} values of {m.bits} bits): not the dense "
                f"layout compressed-tensors writes since 0.18 (pack_to_int32 pads with zeros)",
                file=st.file_of(t), tensor=t,
                hint="re-export with compressed-tensors 0.18 or later"))
    if not m.sym:
        out += clamp_findings(src, m, None if full else CLAMP_ROWS)
    return out


def clamp_findings(src: CtSource, m: QuantModule, rows: int | None) -> list[Finding]:
    """GQ418: the codes of an asymmetric module were clamped to the signed range (see
    signed_clamp), read over the first `rows` output rows (all when None)."""
    t = m.tensors["qweight"]
    packed = src.store.view(t)
    n = packed.shape[0] if rows is None else min(rows, packed.shape[0])
    low = top = total = 0
    for lo in range(0, n, 64):   # a few MiB of codes at a time
        codes = unpack(np.ascontiguousarray(packed[lo:min(n, lo + 64)]), m.bits,
                       axis=1)[:, :m.in_features]
        low += int(np.count_nonzero(codes < 1 << (m.bits - 1)))
        top += int(np.count_nonzero(codes == (1 << m.bits) - 1))
        total += codes.size
        if low:
            break  # a code below the midpoint: not clamped
    src.store.release([t])
    hit = signed_clamp(low, top, total, m.bits)
    if hit is None:
        return []
    return [Finding("GQ418", hit, file=src.store.file_of(t), tensor=t,
                    hint="re-export from the unquantized model with auto-round 0.16 or later "
                         "(or another exporter); the clamped codes cannot be recovered")]


def signed_clamp(low: int, top: int, total: int, bits: int) -> str | None:
    """The message when an asymmetric module's stored codes look clamped to the signed range:
    auto-round 0.13-0.15 handed its unsigned zero point to compressed-tensors, which
    re-quantized `clamp(round(w/s) + zp, -2^(bits-1), 2^(bits-1) - 1)`, so every code q >= 2^
    (bits-1) became 2^(bits-1) - 1: stored (after the +2^(bits-1) offset) no code is below the
    midpoint and the top half piles up at maxq (auto-round PR 2273; export_to_llmcompressor/
    export.py pack_layer). A real asymmetric quantizer uses the whole [0, maxq] range in every
    group, so over `total` codes none below the midpoint is not chance. None when clean."""
    mid, maxq = 1 << (bits - 1), (1 << bits) - 1
    if low or total < 256 or top * 8 < total:
        return None
    return (f"none of {total} codes read is below {mid} and {top} ({100 * top / total:.0f}%) "
            f"sit at {maxq}: the codes were clamped to the signed range [-{mid}, {mid - 1}] "
            "before the +{mid} offset (auto-round's compressed-tensors export before 0.16, PR "
            "2273), collapsing the top half of each group into one value; such exports load "
            "fine but produce garbage").replace("{mid}", str(mid))


# -- writing ---------------------------------------------------------------------------------
class CtWriter:
    """compressed-tensors pack-quantized as a written format (conversion/reformat.py)."""
    format: str = COMPRESSED_TENSORS
    # config.json only: GPTQModel reads quantize_config.json first, so none is written
    config_files: tuple[tuple[str, bool], ...] = ((CONFIG_JSON, True),)
    hint: str = ("keep this checkpoint in GPTQ: gptq_v2 keeps its g_idx and loads in GPTQModel "
            "and transformers (vLLM: 4/8-bit symmetric through Marlin)")

    def no_form(self, m: QuantModule) -> str | None:
        """Why module `m` has no lossless pack-quantized form (None: it has one)."""
        if m.act_order:
            return ("act-order (a non-trivial g_idx): vLLM 0.30 and later refuse compressed-"
                    "tensors' actorder 'group' (compressed_tensors.py: 'activation ordering ... "
                    "is no longer supported') and compressed-tensors 0.19 and later no longer "
                    "parse it (quant_args.py, 'removed 2026/08/27'); only vLLM 0.29 and older "
                    "loaded weight_g_idx. Without it pack-quantized groups are contiguous runs "
                    "of input channels, and dropping the g_idx would change the weights")
        if m.group_size != -1 and m.in_features % m.group_size:
            return (f"in_features {m.in_features} is not a multiple of group_size "
                    f"{m.group_size}: compressed-tensors' group strategy has no partial last "
                    "group (forward_helpers._process_group: 'tensor column shape must be "
                    "divisible by the given group_size')")
        return None

    def keeps(self, tensor: str) -> bool:
        """TGI's GPTQ-only scalar tensors are not carried over."""
        return tensor not in TGI_SCALARS

    def metadata(self, meta: dict[str, str] | None) -> dict[str, str] | None:
        """A shard's __metadata__ without AutoGPTQ's gptq_* keys."""
        return None if meta is None else {k: v for k, v in meta.items()
                                          if not k.startswith("gptq_")}

    def entries(self, m: QuantModule) -> list[tuple[str, str, tuple[int, ...], str]]:
        """(tensor name, dtype, shape, role) of module `m` as compressed-tensors stores it."""
        p, n, k, b = m.name, m.out_features, m.in_features, m.bits
        out = [(f"{p}.weight_packed", "I32", (n, k * b // 32), "qweight"),
               (f"{p}.weight_scale", m.scale_dtype, (n, m.groups), "scales"),
               (f"{p}.weight_shape", "I64", (2,), "shape")]
        if not m.sym:
            out.append((f"{p}.weight_zero_point", "I32", (n * b // 32, m.groups), "qzeros"))
        return out

    def tensor(self, role: str, src: Source, m: QuantModule) -> np.ndarray:
        """One output tensor of module `m`, from `src` in the one model."""
        if role == "qweight":
            return transposed(src.qweight(m))
        if role == "scales":
            return np.ascontiguousarray(src.scales(m).T)
        if role == "qzeros":
            return transposed(src.qzeros(m))
        if role == "shape":
            return np.array([m.out_features, m.in_features], dtype=np.int64)
        raise ValueError(role)

    def config(self, modules: list[QuantModule], universe: list[str], unquantized: list[str],
               provenance: dict) -> dict:
        """The quantization_config compressed-tensors writes for these modules: one config group
        per (bits, group_size, sym) with `targets` naming its modules (layer numbers generalised
        where that names no other module), `ignore` listing every unquantized weight."""
        by_scheme: dict[tuple, list[str]] = {}
        for m in modules:
            by_scheme.setdefault((m.bits, m.group_size, m.sym), []).append(m.name)
        groups = {}
        for i, ((bits, gs, sym), names) in enumerate(sorted(by_scheme.items(),
                                                             key=lambda kv: -len(kv[1]))):
            groups[f"group_{i}"] = {
                "targets": patterns(names, universe),
                "weights": {"num_bits": bits, "type": "int", "symmetric": sym,
                            "group_size": None if gs == -1 else gs,
                            "strategy": "channel" if gs == -1 else "group", "dynamic": False},
                "input_activations": None, "output_activations": None, "format": None}
        return {"version": CT_VERSION, "quant_method": METHOD, "sparsity_config": {},
                "transform_config": {}, "config_groups": groups, "kv_cache_scheme": None,
                "format": PACKED, "quantization_status": "compressed",
                "global_compression_ratio": None, "ignore": sorted(unquantized),
                "moe_sparsity_config": None, "gptqfmt": provenance}

