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

Up to 0.17.x pack_to_int32 padded each word instead (bits/ct_layouts.py): weight_packed
[N, ceil(K / floor(32/bits))], weight_zero_point [ceil(N / floor(32/bits)), G]; the same words
at 2, 4 and 8 bits, other ones at 3, 5, 6 and 7. Nothing in the config says which layout a
file has (`version` is the library's, and the nightlies before 0.18.0 already pack densely), so
the reader tells them apart by the shapes (see `CtSource`) and reads both.
"""
from __future__ import annotations

import shlex
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..bits import ct_layouts as lay
from ..bits.layout import trivial_g_idx
from ..bits.packing import SUPPORTED_BITS, constant_words
from ..findings import Finding
from ..safetensors_io.index import TensorStore
from .configs import CONFIG_JSON, TGI_SCALARS
from .model import COMPRESSED_TENSORS, QuantModule, discover
from .relayout import Banded, padded_to_dense, transposed, transposed_values
from .source import ExactSource, Source
from .targets import any_match, kind, matches, patterns

# the compressed-tensors release whose config is written; its layout is the dense one of 0.18
# and later, which convert writes at every width (CtWriter.entries)
CT_VERSION = "0.20.0"
METHOD = "compressed-tensors"
PACKED = "pack-quantized"
SUFFIXES = {"qweight": "weight_packed", "scales": "weight_scale",   # role -> tensor suffix
            "qzeros": "weight_zero_point", "shape": "weight_shape", "g_idx": "weight_g_idx"}
STRATEGIES = ("group", "channel")
# vLLM's compressed_tensors_wNa16.py: 0.25-0.33 read 2-8 bits and size weight_packed densely,
# `packed_input_dim = math.ceil(input_size_per_partition * num_bits / 32)` (0.24 and older
# read 4 and 8 bits only), although vLLM 0.23-0.33 pin compressed-tensors==0.17.0, the padded
# writer: no vLLM release loads the padded layout at 3, 5, 6 or 7 bits
VLLM_DENSE = "vLLM 0.25-0.33, every release that reads 3/5/6/7-bit compressed-tensors"


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
        cfg.groups.append(Group(name, tuple(targets), bits, sym is not False,
                                strategy, gs if strategy == "group" else None, actorder,
                                usable=len(bad) == refused))
    return cfg


@dataclass(frozen=True)
class Layout:
    """Which pack_to_int32 layout a module's tensors are in, as their shapes tell it: PADDED or
    DENSE; None where both layouts store the same bits (2, 4 or 8 bits, or rows of one word);
    UNDECIDED where the shapes fit both and the bits differ (`why` says which tensor)."""
    layout: str | None
    bits: int
    in_features: int
    tensor: str = ""
    why: str = ""


UNDECIDED = "undecided"


def _expected(values: int, bits: int, other: int, axis: int) -> dict[str, tuple[int, int]]:
    """The shape of a tensor packing `values` along `axis` (with `other` along the other axis)
    in each layout."""
    return {lo: ((other, lay.width(values, bits, lo)) if axis == 1 else
                 (lay.width(values, bits, lo), other)) for lo in lay.LAYOUTS}


def _needs(expect: dict[str, tuple[int, int]]) -> str:
    """'[64, 6]' where both layouts need that shape, else each with its layout named."""
    shapes = set(expect.values())
    if len(shapes) == 1:
        return str(list(shapes.pop()))
    return " or ".join(f"{list(s)} {lay.LABELS[lo]}" for lo, s in expect.items())


def _shape_fit(shape: tuple[int, ...], values: int, bits: int, other: int, axis: int
               ) -> tuple[str, ...]:
    """The layouts whose shape for these values `shape` is (none, one, or both)."""
    return tuple(lo for lo, s in _expected(values, bits, other, axis).items() if s == shape)


class CtSource(ExactSource):
    """A compressed-tensors checkpoint, read module by module into the one model.

    Each module's layout (padded up to 0.17, dense from 0.18; bits/ct_layouts.py) is told by
    its shapes: weight_packed's width, K values along dim 1, and weight_zero_point's height, N
    values along dim 0, each in one layout's shape and not the other's. At 3/5/6/7 bits the
    widths differ whenever K (or N) is a multiple of 32 (32 values take `bits` words densely,
    more than 32 / floor(32/bits) padded), so every real model decides; they agree for some
    rows of other lengths, up to 150 values at 3 bits, 90, 75 and 28 at 5, 6 and 7 (11 to 20
    values of 3 bits are 2 words either way). Where a module's shapes fit
    both layouts and the bits differ, the checkpoint's other modules decide: one writer packed
    them all, so when every module that decides says the same layout, the undecided ones are
    read in it. When none decides, or they disagree, an undecided module is not read: GQ319
    says so with the shapes each layout needs (reading it either way could be wrong)."""
    format = COMPRESSED_TENSORS
    scale_axes = ("column", "group")        # weight_scale is [N, G]

    def __init__(self, store: TensorStore, config: CtConfig, config_files: list[str]):
        self.store, self.root, self.config = store, store.root, config
        self.path = store.root   # open_source sets the file where one was opened
        self.config_files = config_files
        self.declared_by: str | None = config.label
        self.findings: list[Finding] = list(store.findings) + list(config.findings)
        # module -> its layout: the modules read, and (for what inspect says) those of groups
        # gptqfmt does not read whose shapes still tell it (5, 6 or 7 bits)
        self.layouts: dict[str, Layout] = {}
        self.modules, self.passthrough, found = discover(store, SUFFIXES, self._module)
        self.other_tensors = self.passthrough
        if not found:
            self.findings.append(Finding("GQ314", "no tensor named *.weight_packed: nothing is "
                                         "stored pack-quantized", file=config.label))
        self._settle_layouts()
        self.findings += self._padded_findings()

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
            self._note_layout(p, names, g)
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
        b = g.bits
        wfit = _shape_fit(tuple(packed), k, b, n, axis=1)
        if not wfit:
            bad("GQ304" if packed[0] == n else "GQ303",
                f"weight_packed is {list(packed)}; weight_shape ({n}, {k}) at {b} bits "
                f"(config group {g.name}) needs {_needs(_expected(k, b, n, axis=1))}")
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
        zfit: tuple[str, ...] = lay.LAYOUTS
        if not g.symmetric:
            zshape = tuple(st.info(names["qzeros"]).shape)
            zfit = _shape_fit(zshape, n, b, groups, axis=0)
            if not zfit:
                bad("GQ303", f"weight_zero_point is {list(zshape)}; expected "
                    f"{_needs(_expected(n, b, groups, axis=0))}", names["qzeros"])
                return None
            if not set(wfit) & set(zfit):
                bad("GQ303", f"weight_packed {list(packed)} is {lay.LABELS[wfit[0]]}, but "
                    f"weight_zero_point {list(zshape)} is {lay.LABELS[zfit[0]]}: one "
                    "pack_to_int32 packs both", names["qzeros"])
                return None
        act = False
        if "g_idx" in names:
            gi = np.asarray(st.view(names["g_idx"]), dtype=np.int64)
            if gi.shape != (k,) or gi.size and (gi.min() < 0 or gi.max() >= groups):
                bad("GQ309", f"weight_g_idx has shape {list(gi.shape)} and values outside "
                    f"[0, {groups}); expected [{k}] group numbers", names["g_idx"])
                return None
            act = not np.array_equal(gi, trivial_g_idx(k, gs))
        self.layouts[p] = self._layout(names, (k, n), b, wfit, zfit, g.symmetric, groups)
        return QuantModule(p, b, gs, k, n, g.symmetric, act,
                           st.info(names["scales"]).dtype, names)

    def _layout(self, names: dict[str, str], kn: tuple[int, int], bits: int,
                wfit: tuple[str, ...], zfit: tuple[str, ...], sym: bool,
                groups: int) -> Layout:
        """A module's Layout from the layouts its weight and zero point shapes fit."""
        both = [lo for lo in wfit if lo in zfit]
        k, n = kn
        if len(both) == 1:
            return Layout(both[0], bits, k)
        if lay.coincide(k, bits) and (sym or lay.coincide(n, bits)):
            return Layout(None, bits, k)   # the same bits either way
        role, values, other, axis = (("qweight", k, n, 1) if not lay.coincide(k, bits) else
                                     ("qzeros", n, groups, 0))
        t = names[role]
        exp = _expected(values, bits, other, axis)
        return Layout(UNDECIDED, bits, k, t, (
            f"{t} is {list(self.store.info(t).shape)}; weight_shape ({n}, {k}) at {bits} bits "
            f"needs {list(exp[lay.DENSE])} {lay.LABELS[lay.DENSE]} or "
            f"{list(exp[lay.PADDED])} {lay.LABELS[lay.PADDED]}: the same shape, with the values "
            "at other bits"))

    def _note_layout(self, p: str, names: dict[str, str], g: Group) -> None:
        """The layout of a module of a group gptqfmt does not read (5, 6 or 7 bits), where its
        shapes tell it, for what inspect says; silent where they do not."""
        st, b = self.store, g.bits
        if not (isinstance(b, int) and 1 <= b <= 8 and lay.differ(b)) or \
                "qweight" not in names or "shape" not in names or \
                st.info(names["shape"]).dtype not in ("I32", "I64") or \
                tuple(st.info(names["shape"]).shape) != (2,):
            return
        n, k = (int(v) for v in np.asarray(st.view(names["shape"])))
        packed = tuple(st.info(names["qweight"]).shape)
        fit = set(_shape_fit(packed, k, b, n, axis=1)) if n > 0 and k > 0 else set()
        if "qzeros" in names and len(fit) == 2 and len(st.info(names["qzeros"]).shape) == 2:
            zshape = tuple(st.info(names["qzeros"]).shape)
            fit &= set(_shape_fit(zshape, n, b, zshape[1], axis=0))
        if len(fit) == 1:
            self.layouts[p] = Layout(fit.pop(), b, k)

    def _settle_layouts(self) -> None:
        """Undecided modules take the layout every deciding module has; with none, or both,
        they are not read (GQ319)."""
        decided = {v.layout for v in self.layouts.values()
                   if v.layout in (lay.PADDED, lay.DENSE)}
        keep = []
        for m in self.modules:
            v = self.layouts[m.name]
            if v.layout != UNDECIDED:
                keep.append(m)
            elif len(decided) == 1:
                self.layouts[m.name] = Layout(next(iter(decided)), v.bits, v.in_features)
                keep.append(m)
            else:
                del self.layouts[m.name]
                self.findings.append(Finding(
                    "GQ319", v.why + "; " + (
                        "no other module's shapes tell the layout either" if not decided else
                        "the other modules' shapes say both layouts") + ": not read",
                    file=self.store.file_of(v.tensor), tensor=v.tensor,
                    hint="re-save the model with compressed-tensors 0.18 or later (the "
                         "dense layout), or read it with the release that wrote it"))
        self.modules = keep

    def pack_layout(self) -> dict[str, Any]:
        """The checkpoint's layout, for inspect and verify: dense, padded, mixed, or either
        (no module where the layouts differ: 2/4/8 bits), with the modules in each."""
        counts = Counter(v.layout for v in self.layouts.values())
        layouts = [lo for lo in (lay.PADDED, lay.DENSE) if counts[lo]]
        if len(layouts) == 2:
            name = "mixed"
            text = (f"mixed: {counts[lay.PADDED]} module{'s' * (counts[lay.PADDED] != 1)} "
                    f"{lay.LABELS[lay.PADDED]}, {counts[lay.DENSE]} {lay.LABELS[lay.DENSE]}")
        elif layouts:
            name, text = layouts[0], lay.LABELS[layouts[0]]
        else:
            name, text = "either", "the same bits in both layouts (2, 4 or 8 bits)"
        return {"layout": name, "description": text, "padded": counts[lay.PADDED],
                "dense": counts[lay.DENSE]}

    def _padded_findings(self) -> list[Finding]:
        """GQ320: one warning for the modules in the padded layout, which no vLLM release
        loads; the next step re-packs them where gptqfmt reads them."""
        padded = sorted(p for p, v in self.layouts.items() if v.layout == lay.PADDED)
        if not padded:
            return []
        v = self.layouts[padded[0]]
        t = f"{padded[0]}.{SUFFIXES['qweight']}"
        n, words = self.store.info(t).shape
        bits = sorted({self.layouts[p].bits for p in padded})
        read = {m.name for m in self.modules}
        root = str(self.store.root)
        if read.issuperset(padded):
            hint = (f"re-pack it in the dense layout: gptqfmt convert {shlex.quote(root)} "
                    f"{shlex.quote(root + '-dense')} --to compressed-tensors")
        else:
            hint = ("decompress it with compressed-tensors 0.17 and compress it again with "
                    "0.18 or later (gptqfmt re-packs the bits it reads: "
                    f"{', '.join(map(str, SUPPORTED_BITS))})")
        per = ", ".join(f"{lay.per_word(b)} values a word at {b} bits" for b in bits)
        return [Finding(
            "GQ320", f"{len(padded)} of {len(self.layouts)} modules are packed "
            f"{lay.LABELS[lay.PADDED]}, floor(32/bits) values to an int32 word ({per}; "
            f"{t} is [{n}, {words}], dense [{n}, {lay.width(v.in_features, v.bits, lay.DENSE)}]"
            f"): {VLLM_DENSE}, expects the dense layout, "
            "ceil(in_features * bits / 32) words a row, and refuses these shapes on load; "
            "compressed-tensors 0.18 and later unpack them as dense without a check and "
            "misread them", file=self.store.file_of(t), tensor=t, hint=hint)]

    # -- the one model -------------------------------------------------------------------
    def layout_of(self, m: QuantModule) -> str:
        """The layout module `m` is read in (DENSE where both are the same bits)."""
        v = self.layouts.get(m.name)
        return lay.PADDED if v is not None and v.layout == lay.PADDED else lay.DENSE

    def _padded(self, m: QuantModule) -> bool:
        return self.layout_of(m) == lay.PADDED

    def qweight(self, m: QuantModule) -> np.ndarray:
        return transposed(self.stored_qweight(m)[0])

    def stored_qweight(self, m: QuantModule) -> tuple[np.ndarray, bool]:
        """weight_packed as the dense layout stores it (a padded one re-packed), and True:
        qweight is its transpose (for comparisons that need no transposed copy)."""
        words = self.store.view(m.tensors["qweight"])
        if self._padded(m):
            return padded_to_dense(words, m.bits, m.in_features, axis=1), True
        return words, True

    def qzeros(self, m: QuantModule) -> np.ndarray:
        if m.sym:
            block = constant_words(1 << (m.bits - 1), m.bits).view(np.int32)
            reps = m.out_features * m.bits // 32 // block.size
            return np.tile(block, (m.groups, reps))
        words = self.store.view(m.tensors["qzeros"])
        if self._padded(m):
            words = padded_to_dense(words, m.bits, m.out_features, axis=0)
        return transposed(words)

    def scales(self, m: QuantModule) -> np.ndarray:
        return transposed_values(self.store.view(m.tensors["scales"]))

    def g_idx(self, m: QuantModule) -> np.ndarray:
        if "g_idx" in m.tensors:
            return np.asarray(self.store.view(m.tensors["g_idx"]), dtype=np.int32)
        return trivial_g_idx(m.in_features, m.group_size).astype(np.int32)

    # -- what inspect and verify say of it -----------------------------------------------
    def data_findings(self, m: QuantModule, full: bool) -> list[Finding]:
        return module_checks(self, m, full)

    def quantization(self) -> dict[str, Any]:
        return {**super().quantization(), "pack_layout": self.pack_layout()}

    def describe(self) -> str:
        cfg = self.config
        pl = self.pack_layout()
        where = f"layout {pl['description']}; " if pl["layout"] != "either" else ""
        return (f"compressed-tensors {cfg.format or PACKED} ({where}config version "
                f"{cfg.version or 'not given'}; {cfg.label})")



CLAMP_ROWS = 256      # output rows of weight_packed that inspect reads for the clamp check


def module_checks(src: CtSource, m: QuantModule, full: bool = True) -> list[Finding]:
    """The data checks of one module: padding bits of the packed streams (GQ317, verify only)
    and the signed-range clamp of an asymmetric export (GQ418; inspect reads the first
    CLAMP_ROWS output rows, verify all of them)."""
    st, out = src.store, []
    layout = src.layout_of(m)
    roles = (("qweight", m.in_features, 1), ("qzeros", m.out_features, 0)) if full else ()
    for role, values, axis in roles:
        if role not in m.tensors:
            continue
        t = m.tensors[role]
        clean = lay.padding_clean(st.view(t), values, m.bits, layout, axis)
        st.release([t])
        if clean.all():
            continue
        if layout == lay.PADDED:
            f = lay.per_word(m.bits)
            where = (f"outside their values ({values} values of {m.bits} bits, {f} a word, "
                     f"the top {32 - f * m.bits} bits of each word zero): not the padded layout "
                     "compressed-tensors wrote before 0.18")
        else:
            where = (f"past their last value ({values} values of {m.bits} bits): not the dense "
                     "layout compressed-tensors writes since 0.18")
        out.append(Finding(
            "GQ317", f"{int((~clean).sum())} of {clean.size} packed streams have bits set "
            f"{where} (pack_to_int32 pads with zeros)", file=st.file_of(t), tensor=t,
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
        codes = lay.unpack(packed[lo:min(n, lo + 64)], m.bits, m.in_features,
                           src.layout_of(m), axis=1)
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
        """(tensor name, dtype, shape, role) of module `m` as compressed-tensors stores it, in
        the dense layout of 0.18 and later at every width (CT_VERSION is written with it; the
        one model holds whole words, so ceil(K*bits/32) = K*bits/32)."""
        p, n, k, b = m.name, m.out_features, m.in_features, m.bits
        out = [(f"{p}.weight_packed", "I32", (n, k * b // 32), "qweight"),
               (f"{p}.weight_scale", m.scale_dtype, (n, m.groups), "scales"),
               (f"{p}.weight_shape", "I64", (2,), "shape")]
        if not m.sym:
            out.append((f"{p}.weight_zero_point", "I32", (n * b // 32, m.groups), "qzeros"))
        return out

    def tensor(self, role: str, src: Source, m: QuantModule) -> np.ndarray | Banded:
        """One output tensor of module `m`, from `src` in the one model; qweight's transpose
        a band at a time, as the source makes it best."""
        if role == "qweight":
            return src.qweight_bands(m)
        if role == "scales":
            return transposed_values(src.scales(m))
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

