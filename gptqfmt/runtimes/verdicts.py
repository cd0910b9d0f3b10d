"""What each runtime makes of a checkpoint (the rules of table.py applied to it): whether it
loads it, with which kernel, which convention it reads, and whether the weights it computes are
the ones the data mean (readings.py: what each reading makes of the stored fields).

A runtime decodes a module right when its reading gives the data's Z in every cell; where it
does not, the report says how many cells differ and by how much a weight moves (scale x the
change of Z; verify only, as inspect does not read scales). Nothing is decided when the data's
convention is not.
"""
from __future__ import annotations

import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

import numpy as np

from ..bits import native
from ..bits.conventions import GPTQ_V2, convert_words, effective_zeros
from ..bits.packing import unpack
from ..bits.swar import CHUNK
from ..detection.decide import AMBIGUOUS, ModuleVerdict
from ..detection.pool import Detection
from ..findings import CATALOGUE, Finding
from ..formats.gptq.checkpoint import Checkpoint, Module
from ..formats.model import is_lm_head
from ..parallel import bounded_map, cpus
from ..safetensors_io.dtypes import to_float32
from . import rules as rt
from .readings import (
    Reading,
    agrees_without_reading,
    canonical,
    cause_of,
    cause_text,
    count_misread,
    differs_everywhere,
    modelled,
    read_zeros,
    truth_zeros,
)
from .table import RUNTIMES

# the device verdicts assume unless told: a current NVIDIA GPU (Ampere or later)
DEFAULT_CAPABILITY = 80


@dataclass(frozen=True)
class Misread:
    """One module under one reading: cells whose Z differs from the data's, the largest weight
    change that makes (None: scales not read), and why."""
    cells: int
    max_change: float | None
    cause: str | None = None


@dataclass(frozen=True)
class Scenario:
    """The checkpoint as a fix would leave it, judged without writing it (doctor's plan):
    `label` written as checkpoint_format and format in every config file (fix-label);
    `no_act_order`: desc_act false, as the act-order relabel writes where every g_idx is
    arange(K) // group_size; `drop_legacy`: the keys loaders refuse by name removed;
    `convention`: the stored zero points converted to it (lossless: the data's Z kept in
    every cell, which the caller has checked). `version`: the runtime's version judged."""
    label: str | None = None
    no_act_order: bool = False
    drop_legacy: bool = False
    convention: str | None = None
    version: tuple[int, ...] | None = None

    def config(self, cfg: rt.Facts) -> rt.Facts:
        labels = cfg.labels
        if self.label is not None:
            files = [f for f in cfg.sources if f != "__metadata__"]
            labels = tuple((f, k, self.label) for f in files
                           for k in ("checkpoint_format", "format")) + \
                tuple(x for x in labels if x[0] == "__metadata__")
        return replace(cfg, labels=labels, version=self.version,
                       legacy_keys=() if self.drop_legacy else cfg.legacy_keys,
                       **self._act_order(cfg))

    def module(self, facts: rt.Facts) -> rt.Facts:
        changes = self._act_order(facts)
        return replace(facts, **changes) if changes else facts

    def _act_order(self, facts: rt.Facts) -> dict[str, Any]:
        return {"desc_act": False} if self.no_act_order else {}


NONE = Scenario()


# the Facts a module sets from its own values (module_values), in this order
MODULE_FIELDS = ("bits", "group_size", "sym", "desc_act", "act_order", "pack_dtype",
                 "in_features", "out_features", "has_g_idx", "scale_dtype")


def module_values(m: Module) -> tuple[Any, ...]:
    """Module `m`'s own values of MODULE_FIELDS, as declared after `dynamic` and as its
    tensors show: what its facts hold beyond the checkpoint's and its name."""
    d = m.declared
    return (m.bits, m.group_size, d.sym if d else None, d.desc_act if d else None,
            m.act_order, m.pack_dtype, m.in_features, m.out_features, "g_idx" in m.tensors,
            m.scale_dtype)


def module_facts(base: rt.Facts, m: Module) -> rt.Facts:
    """A module's facts: the checkpoint's (config_facts: labels, sources, quantizer, device)
    with the module's name and own values (module_values)."""
    return replace(base, name=m.name, fused_conflict=None,
                   **dict(zip(MODULE_FIELDS, module_values(m))))


def config_facts(ckpt: Checkpoint, capability: int) -> rt.Facts:
    """The base config as runtimes read it (a value no file declares: what every module's
    shapes agree on)."""
    mods = [m for m in ckpt.valid_modules if m.declared is not None]
    base = ckpt.config.base if ckpt.config else None

    def pick(declared, attr):
        if declared is not None:
            return declared
        vals = {getattr(m, attr) for m in mods}
        return vals.pop() if len(vals) == 1 else None

    return rt.Facts(
        name=None, bits=pick(base and base.bits, "bits"),
        group_size=pick(base and base.group_size, "group_size"),
        sym=base.sym if base else None, desc_act=base.desc_act if base else None,
        act_order=any(m.act_order for m in mods),
        pack_dtype=pick(base and base.pack_dtype, "pack_dtype"),
        sources=_sources(ckpt), labels=_labels(ckpt), quantizer=ckpt.quantizer,
        capability=capability, lm_head_declared=ckpt.config.lm_head if ckpt.config else None,
        fused_conflict=_fused_conflict(ckpt),
        legacy_keys=ckpt.config.legacy_keys() if ckpt.config else ())


def _fused_conflict(ckpt: Checkpoint) -> str | None:
    """The first shard of a fused layer whose config after `dynamic` differs from the config
    `dynamic` gives the fused name (rt.FUSED), said with both; None when every shard agrees."""
    cfg = ckpt.config
    if cfg is None or not cfg.dynamic:
        return None
    keys = ("bits", "group_size", "sym", "desc_act")
    for m in ckpt.modules:
        head, _, part = m.name.rpartition(".")
        if part not in rt.FUSED:
            continue
        fused = f"{head}.{rt.FUSED[part]}"
        own, theirs = cfg.for_module(m.name), cfg.for_module(fused)
        if own != theirs:
            def show(c):
                return "no quantization" if c is None else ", ".join(
                    f"{k}={getattr(c, k)!r}" for k in keys if own is None or theirs is None
                    or getattr(own, k) != getattr(theirs, k))
            return f"{m.name} has {show(own)}, but {fused} gets {show(theirs)}"
    return None


def _labels(ckpt: Checkpoint) -> tuple[tuple[str, str, str], ...]:
    if not ckpt.config:
        return ()
    return tuple((d.file, d.key, d.value) for d in ckpt.config.declared_in)


def _sources(ckpt: Checkpoint) -> tuple[str, ...]:
    return tuple(ckpt.config.sources) if ckpt.config else ()


def misread(ckpt: Checkpoint, m: Module, v: ModuleVerdict, truth: str, reading: Reading,
            label_right: bool, scales: bool) -> Misread:
    """How `reading` of module `m` differs from the Z the data mean (`truth`: the detected
    convention). With `scales`, the largest weight change too (reads the module's scales and
    compares every field); without, the cells are counted on the packed words (inspect)."""
    return misreads(ckpt, m, v, truth, [(reading, label_right)], scales)[(reading, label_right)]


def misreads(ckpt: Checkpoint, m: Module, v: ModuleVerdict, truth: str,
             keys: list[tuple[Reading, bool]], scales: bool) -> dict[tuple[Reading, bool], Misread]:
    """misread for several (reading, label read right) of one module. The readings that need
    every field compared (verify, and what the packed-word counts do not cover) share one walk
    over the module, a chunk of groups at a time: the fields unpacked once, the data's Z and the
    scales read once per chunk."""
    out: dict[tuple[Reading, bool], Misread] = {}
    full: dict[tuple[Reading, bool], str] = {}     # -> cause, the ones compared field by field
    maxscale: list[float] = []

    def scale_max() -> float:
        if not maxscale:
            t = m.tensors["scales"]
            top = native.largest_magnitude(ckpt.view(t), ckpt.store.info(t).dtype)
            maxscale.append(largest_finite(ckpt.float32(t)) if top is None else top)
        return maxscale[0]

    for reading, right in keys:
        same = (canonical(reading, m.bits), right)
        if same not in out and same not in full:
            r = _misread_closed(ckpt, m, v, truth, *same, scales, scale_max)
            if isinstance(r, Misread):
                out[same] = r
            else:
                full[same] = r
    if full:
        out.update(_compare_fields(ckpt, m, v, truth, full, scales))
    return {(reading, right): out[(canonical(reading, m.bits), right)] for reading, right in keys}


def _high(v: ModuleVerdict) -> np.ndarray:
    """The flat cells whose stored maxq the codes say is Z = 2^bits (readings.truth_zeros)."""
    return np.fromiter(v.stats.consistent_at if v.stats else (), dtype=np.int64)


def _misread_closed(ckpt, m, v, truth, reading, label_right, scales, scale_max):
    """The Misread where it follows without comparing fields, else its cause (a str)."""
    if agrees_without_reading(reading, truth, v):
        return Misread(0, 0.0 if scales else None)
    cause = cause_of(reading, label_right, m.bits)
    reading = modelled(reading, m.bits)
    if truth == GPTQ_V2 and reading is Reading.V1_NOWRAP:
        # s + 1 against s: every Z one higher, so every weight moves by its scale
        return Misread(m.groups * m.out_features, scale_max() if scales else None, cause)
    if not scales:
        if differs_everywhere(reading, truth):
            return Misread(m.groups * m.out_features, None, cause)
        cells = count_misread(ckpt.view(m.tensors["qzeros"]), m.bits, m.out_features,
                              m.groups * m.out_features, _high(v), truth, reading)
        if cells is not None:
            return Misread(cells, None, cause) if cells else Misread(0, None)
    return cause


def largest_finite(x: np.ndarray) -> float:
    """max |x| over the finite values (0 when none): a weight change, whose non-finite scales
    are GQ501's to report, never a NaN in a report."""
    return float(finite_magnitudes(np.asarray(x, dtype=np.float32)).max(initial=0.0))


def finite_magnitudes(s32: np.ndarray) -> np.ndarray:
    """|scale| per cell, 0 where the scale is not finite (GQ501's to report; never a weight
    change)."""
    with np.errstate(invalid="ignore"):   # a signalling NaN scale (mutated bytes)
        mag = np.abs(s32)
    mag[~np.isfinite(mag)] = 0
    return mag


def largest_change(mag: np.ndarray, dz: np.ndarray) -> float:
    """max |scale x dZ| in float32 over the cells whose Z changes (dZ: int32, a scratch array
    this overwrites), finite products only, from `mag` (finite_magnitudes of the scales): what
    largest_finite(s32[moved] * dZ[moved]) gives without gathering the moved cells. A float32
    product rounds the same whatever the signs, an unmoved cell adds 0 and a non-finite scale's
    magnitude is 0; a product that overflows (a bf16 scale near the float32 limit) is left out
    and the others count. Worked example: scales [2, 3, -5], dZ [1, 0, -15]: 2, 0 and 75: 75."""
    with np.errstate(over="ignore"):
        products = np.multiply(mag, np.abs(dz, out=dz), dtype=np.float32)
    top = float(products.max(initial=0.0))
    return top if np.isfinite(top) else largest_finite(products)


def _compare_fields(ckpt: Checkpoint, m: Module, v: ModuleVerdict, truth: str,
                    todo: dict[tuple[Reading, bool], str], scales: bool,
                    stored_as: tuple[str, str] | None = None
                    ) -> dict[tuple[Reading, bool], Misread]:
    """Compare every field under each reading of `todo` ((reading, right) -> cause) with the
    data's Z, a chunk of groups at a time; with `scales`, the largest scale x change of Z.
    `stored_as`: (from, to): the fields as convert would store them in `to` (`truth`), from data
    stored in `from` (a lossless conversion: no stored maxq the codes read as 2^bits)."""
    qz = ckpt.view(m.tensors["qzeros"])
    # the scales only where the weight change is asked for (a remote store fetches a view)
    sc = ckpt.view(m.tensors["scales"]) if scales else None
    sc_dtype = ckpt.store.info(m.tensors["scales"]).dtype
    high = _high(v) if stored_as is None else np.zeros(0, dtype=np.int64)
    n = m.out_features
    rows = max(1, CHUNK // max(1, n))
    cells = dict.fromkeys(todo, 0)
    worst = dict.fromkeys(todo, 0.0)
    for r0 in range(0, qz.shape[0], rows):
        part = qz[r0:r0 + rows]
        if stored_as is not None:
            part = convert_words(part, m.bits, *stored_as)[0]
        stored = unpack(part, m.bits, axis=1)
        at = high[(high >= r0 * n) & (high < (r0 + len(part)) * n)] - r0 * n
        want = truth_zeros(stored, m.bits, truth, at)
        raw = sc[r0:r0 + rows] if sc is not None else None
        # the scales' finite magnitudes: made where the compiled loop does not take the
        # scales, once a chunk
        mag: np.ndarray | None = None
        for key in todo:
            reading = modelled(key[0], m.bits)
            got = (effective_zeros(stored, m.bits, reading.rule) if reading.rule is not None
                   else read_zeros(part, m.bits, reading))
            got -= want                      # the change of Z per cell (int32, in place)
            moved = int(np.count_nonzero(got))
            cells[key] += moved
            if raw is None or not moved:
                continue
            change = native.largest_change(raw, sc_dtype, got)
            if change is None:
                if mag is None:
                    mag = finite_magnitudes(to_float32(raw, sc_dtype))
                change = largest_change(mag, got)
            worst[key] = max(worst[key], change)
    return {key: Misread(cells[key], worst[key] if scales else None,
                         todo[key] if cells[key] else None) if cells[key] else
            Misread(0, 0.0 if scales else None) for key in todo}


# ---------------------------------------------------------------- verdicts


@dataclass
class PathVerdict:
    """One kernel path of a runtime on this checkpoint."""
    path: rt.Path
    taken: bool = False              # the path the runtime takes on the default device
    loads: bool = True
    convention_read: str | None = None
    decodes_correctly: bool | None = None
    reasons: list[str] = field(default_factory=list)
    failed: list[tuple[rt.Rule, str]] = field(default_factory=list)   # rules that refuse it
    # finding code -> (modules it names, the first of them)
    causes: dict[str, tuple[int, str]] = field(default_factory=dict)
    modules_affected: int = 0
    cells_affected: int = 0
    max_weight_change: float | None = None
    next_steps: list[str] = field(default_factory=list)   # the hints among `reasons`

    @property
    def when(self) -> str:
        parts = [r.text for r in self.path.when]
        if self.path.otherwise and not self.taken:
            parts.append(self.path.otherwise)
        return "; ".join(parts) or "always"

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.path.kernel, "taken": self.taken, "when": self.when,
                "loads": self.loads, "convention_read": self.convention_read,
                "decodes_correctly": self.decodes_correctly, "reasons": self.reasons,
                "modules_affected": self.modules_affected,
                "zero_cells_affected": self.cells_affected,
                "max_weight_change": _rounded(self.max_weight_change),
                "rules_failed": [_rule_json(r, got) for r, got in self.failed]}


@dataclass
class RuntimeVerdict:
    """One runtime: the path it takes on the default device (None: its config-level rules
    refuse the checkpoint, or no path's conditions hold), and every path its config allows."""
    runtime: rt.Runtime
    taken: PathVerdict | None
    paths: list[PathVerdict]
    refusal: list[str] = field(default_factory=list)         # when taken is None
    failed: list[tuple[rt.Rule, str]] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)      # the hints among `refusal`

    @property
    def loads(self) -> bool:
        return self.taken is not None and self.taken.loads

    @property
    def decodes_correctly(self) -> bool | None:
        return self.taken.decodes_correctly if self.taken else None

    @property
    def reasons(self) -> list[str]:
        return self.taken.reasons if self.taken else self.refusal

    @property
    def alternatives(self) -> list[PathVerdict]:
        return [p for p in self.paths if not p.taken]

    def to_json(self) -> dict[str, Any]:
        r, t = self.runtime, self.taken
        return {"id": r.id, "name": r.name, "versions": r.versions, "loads": self.loads,
                "kernel": t.path.kernel if t else None,
                "convention_read": t.convention_read if t else None,
                "decodes_correctly": self.decodes_correctly, "reasons": self.reasons,
                "modules_affected": t.modules_affected if t else 0,
                "zero_cells_affected": t.cells_affected if t else 0,
                "max_weight_change": _rounded(t.max_weight_change) if t else None,
                "rules_failed": [_rule_json(rule, got) for rule, got in
                                 (t.failed if t else self.failed)],
                "paths": [p.to_json() for p in self.paths]}


def _rule_json(rule: rt.Rule, got: str) -> dict[str, str]:
    return {"rule": rule.id, "condition": rule.text, "found": got, "source": str(rule.source)}


def _rounded(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.6g}")


def _failures(rules: Iterable[rt.Rule], facts: rt.Facts) -> list[tuple[rt.Rule, str]]:
    out = []
    for rule in rules:
        if not rule.applies(facts):
            continue
        got = rule.test(facts)
        if got is not None:
            out.append((rule, got))
    return out


def _line(rule: rt.Rule, got: str) -> str:
    return f"{got} (needs {rule.text})"


def assess(ckpt: Checkpoint, det: Detection, scales: bool = False,
           capability: int = DEFAULT_CAPABILITY,
           runtimes: Iterable[rt.Runtime] | None = None, scenario: Scenario = NONE,
           progress: Callable[[int], Callable[[int], Any]] | None = None
           ) -> list[RuntimeVerdict]:
    """Every runtime's verdict on `ckpt` (detected as `det`; the modules of `det` are the
    ones judged). `scales`: compute the largest weight change (reads the scales of the modules
    a runtime misreads; verify). `capability`: the GPU's compute capability (10 * major).

    `scenario`: judge the checkpoint as a fix would leave it (Scenario). `progress`: called
    with the module count as the pass over the modules starts; it returns the function to call
    as each module is judged (ops.reports.rounds).

    Modules are summed up as they are read (_Refused, _Tally), in module order: nothing per
    module outlives its turn, whatever the module count."""
    cfg = scenario.config(config_facts(ckpt, capability))
    by_name = {v.name: v for v in det.modules}
    mods = [m for m in ckpt.valid_modules if m.declared is not None and m.name in by_name]
    truth = det.verdict if det.verdict != AMBIGUOUS else None
    # the stored fields converted from the data's convention to the scenario's, as convert
    # would write them (every field compared: the closed forms read the stored words)
    stored_as = (truth, scenario.convention) if truth and scenario.convention else None
    truth = scenario.convention if stored_as else truth
    chosen = list(runtimes if runtimes is not None else RUNTIMES)
    dynamic = _dynamic_changes(ckpt, mods)
    # the paths whose config-level conditions hold: the ones a verdict is given on
    open_paths = [p for r in chosen for p in r.paths
                  if not _failures([x for x in p.when if x.scope != "setup"], cfg)]
    refused = _module_refusals(cfg, mods, open_paths, scenario)
    tallies: dict[tuple[Reading, bool], _Tally] = {}

    def tally(reading: Reading, label_right: bool) -> _Tally:
        if (reading, label_right) not in tallies:  # a reading no loading path applies
            assert truth is not None   # a verdict decodes only once the data's convention is known
            tallies.update(_tallies(ckpt, mods, by_name, truth, [(reading, label_right)],
                                    scales, stored_as))
        return tallies[(reading, label_right)]

    if truth is not None:
        # every reading that a path which loads would apply, over every module in one pass,
        # in threads (numpy releases the GIL on the word arithmetic)
        pairs = {(p.readings[r.convention_read(cfg)], r.convention_read(cfg) == truth)
                 for r in chosen if not _refusal(r, cfg, dynamic)[0] for p in r.paths
                 if id(p) in refused and not refused[id(p)].modules}
        tallies.update(_tallies(ckpt, mods, by_name, truth,
                                sorted(pairs, key=lambda t: (t[0].value, t[1])), scales, stored_as,
                                progress))
    where = shlex.quote(str(ckpt.path))   # the checkpoint as the next steps name it
    out = []
    for runtime in chosen:
        refusal, failed = _refusal(runtime, cfg, dynamic)
        paths: list[tuple[bool, PathVerdict]] = []
        for path in runtime.paths:
            if id(path) not in refused:
                continue
            on_device = not _failures([r for r in path.when if r.scope == "setup"], cfg)
            paths.append((on_device, _path_verdict(runtime, path, refused[id(path)], cfg,
                                                   truth, tally, where)))
        taken = next((pv for ok, pv in paths if ok), None)
        if taken is None and not refusal:
            for p in runtime.paths:
                fails = _failures([r for r in p.when if r.scope != "setup"], cfg)
                failed += fails
                refusal.append(f"{p.kernel}: " + "; ".join(_line(r, g) for r, g in fails))
            refusal.insert(0, "no kernel path takes this checkpoint")
        if refusal:
            steps = _next_steps(runtime, failed, where)
            out.append(RuntimeVerdict(runtime, None, [pv for _, pv in paths], refusal + steps,
                                      failed, steps))
            continue
        assert taken is not None   # else refused above
        taken.taken = True
        out.append(RuntimeVerdict(runtime, taken,
                                  [taken] + [pv for _, pv in paths if pv is not taken]))
    return out


@dataclass
class _Refused:
    """What one path's module rules refuse, over every module: how many modules fail one, and
    per rule (by id, in the order first met) the rule, what the first module failing it has,
    how many fail it and the first of them."""
    modules: int = 0
    rules: dict[str, tuple[rt.Rule, str, int, str]] = field(default_factory=dict)


def _module_refusals(cfg: rt.Facts, mods: list[Module], paths: list[rt.Path],
                     scenario: Scenario = NONE) -> dict[int, _Refused]:
    """id(path) -> what its module rules refuse, for each of `paths`: each module's facts
    built once and tested against every path, then dropped."""
    out = {id(p): _Refused() for p in paths}
    # a rule reads a module's name only to ask whether it is an lm_head: modules alike in
    # everything else (a mixture of experts' thousands) are judged once, and only their
    # failures are kept (most modules fail no path)
    judged: dict[tuple[Any, ...], list[tuple[rt.Path, list[tuple[rt.Rule, str]]]]] = {}
    for m in mods:
        alike = (module_values(m), is_lm_head(m.name))
        failing = judged.get(alike)
        if failing is None:
            facts = scenario.module(module_facts(cfg, m))
            failing = judged[alike] = [(p, fails) for p in paths
                                       if (fails := _failures(p.requires, facts))]
        for p, fails in failing:
            r = out[id(p)]
            r.modules += 1
            for rule, got in fails:
                _, first_got, n, first = r.rules.get(rule.id, (rule, got, 0, m.name))
                r.rules[rule.id] = (rule, first_got, n + 1, first)
    return out


@dataclass
class _Tally:
    """One reading (with whether the label is read right) summed over every module: the
    modules and cells it misreads, per cause (finding code, in the order first met) how many
    modules and the first of them, and the largest weight change (None: none measured)."""
    modules: int = 0
    cells: int = 0
    causes: dict[str, tuple[int, str]] = field(default_factory=dict)
    max_change: float | None = None

    def add(self, name: str, r: Misread) -> None:
        if not r.cells:
            return
        assert r.cause is not None   # a reading that misreads cells says why
        self.modules += 1
        self.cells += r.cells
        n, first = self.causes.get(r.cause, (0, name))
        self.causes[r.cause] = (n + 1, first)
        if r.max_change is not None:
            self.max_change = r.max_change if self.max_change is None else \
                max(self.max_change, r.max_change)


def _tallies(ckpt: Checkpoint, mods: list[Module], by_name: dict[str, ModuleVerdict],
             truth: str, keys: list[tuple[Reading, bool]], scales: bool,
             stored_as: tuple[str, str] | None = None,
             progress: Callable[[int], Callable[[int], Any]] | None = None
             ) -> dict[tuple[Reading, bool], _Tally]:
    """misreads of every module under each of `keys`, summed up in module order as the
    modules are read (threads, a few modules in flight, each one's pages dropped after).
    `stored_as`: (from, to) the stored fields are converted first (Scenario.convention)."""
    out = {k: _Tally() for k in keys}

    def module(m: Module) -> list[tuple[tuple[Reading, bool], Misread]]:
        """The readings that misread cells of module `m` (most modules: none)."""
        try:
            if stored_as:
                todo = {(modelled(r, m.bits), right): cause_of(r, right, m.bits)
                        for r, right in keys}
                got = _compare_fields(ckpt, m, by_name[m.name], truth, todo, scales, stored_as)
                found = {(r, right): got[(modelled(r, m.bits), right)] for r, right in keys}
            else:
                found = misreads(ckpt, m, by_name[m.name], truth, keys, scales)
            return [(key, r) for key, r in found.items() if r.cells]  # the rest adds nothing
        finally:
            ckpt.store.release(m.tensors.values())  # resident memory: one module a thread

    infos = ckpt.store.infos   # alike asks it of every module: a lookup, not a call

    def alike(m: Module) -> tuple[Any, ...] | None:
        """What fixes a module's misreads without the weight change: a symmetric pattern is
        every stored word of its qzeros (symmetric_pattern compares whole words, padding
        included), so modules alike in it, the bits and the qzeros' shape misread alike (a
        mixture of experts' thousands are judged once). None: the module is read."""
        v = by_name[m.name]
        if scales or v.pattern is None or v.stats is not None:
            return None
        qz = infos[m.tensors["qzeros"]]
        return (v.pattern, m.bits, m.groups, m.out_features, qz.dtype, qz.shape)

    advance = progress(len(mods)) if progress is not None else None
    keys_of = [alike(m) for m in mods]
    seen: set[tuple[Any, ...]] = set()
    todo = []   # read in the threads: the first module of each alike kind, and those of none
    for m, k in zip(mods, keys_of):
        if k is None or k not in seen:
            todo.append(m)
            if k is not None:
                seen.add(k)
    judged: dict[tuple[Any, ...], list[tuple[tuple[Reading, bool], Misread]]] = {}
    # most modules' misreads follow from their verdict without reading (microseconds): a
    # task per module would cost more to hand over than to run, so a task takes many
    batch = max(1, len(todo) // (16 * cpus()))
    with ThreadPoolExecutor(max_workers=cpus()) as pool:
        done = iter(bounded_map(pool, module, todo, batch=batch))
        for m, k in zip(mods, keys_of):
            if k is None or k not in judged:
                found = next(done)
                if k is not None:
                    judged[k] = found
            else:
                found = judged[k]
            for key, r in found:
                out[key].add(m.name, r)
            if advance is not None:
                advance(1)
    return out


def _refusal(runtime: rt.Runtime, cfg: rt.Facts, dynamic: list[str]
             ) -> tuple[list[str], list[tuple[rt.Rule, str]]]:
    """Why `runtime` refuses the checkpoint before any path (empty: it does not), and the
    config-level rules that fail."""
    failed = _failures(runtime.requires, cfg)
    refusal = [_line(rule, got) for rule, got in failed]
    if runtime.needs_config and runtime.config_file(cfg) is None:
        refusal.insert(0, f"no quantization config it reads: it reads "
                       f"{' or '.join(runtime.config_files)}"
                       + (f" ({runtime.config_note})" if runtime.config_note else ""))
    if runtime.ignores_dynamic is not None and dynamic:
        refusal.append(f"{len(dynamic)} module(s) differ from the base config through "
                       f"`dynamic`, e.g. {dynamic[0]}; it does not read `dynamic` and "
                       "builds every layer from the base config")
    return refusal, failed


def _dynamic_changes(ckpt: Checkpoint, mods: list[Module]) -> list[str]:
    """What a runtime that ignores `dynamic` builds wrongly: modules whose declared config
    differs from the base (`name: key=value`), and layers a `-:` rule leaves in full
    precision (it would look for their qweight)."""
    cfg = ckpt.config
    if cfg is None or not cfg.dynamic:
        return []
    out = []
    for m in mods:
        diff = [f"{k}={getattr(m.declared, k)!r}" for k in ("bits", "group_size", "sym",
                                                            "desc_act")
                if getattr(m.declared, k) != getattr(cfg.base, k)]
        if diff:
            out.append(f"{m.name} ({', '.join(diff)})")
    for name in ckpt.other_tensors:
        if name.endswith(".weight"):
            layer = name[:-len(".weight")]
            if any(r.exclude and r.pattern.match(layer) for r in cfg.dynamic):
                out.append(f"{layer} (left in full precision by a `-:` rule)")
    return out


def _path_verdict(runtime: rt.Runtime, path: rt.Path, refused: _Refused, cfg: rt.Facts,
                  truth: str | None, tally: Callable[[Reading, bool], _Tally],
                  where: str = "PATH") -> PathVerdict:
    """`refused`: what the path's module rules refuse; `tally(reading, label read right)`:
    that reading over every module."""
    pv = PathVerdict(path)
    if refused.modules:
        pv.loads = False
        pv.modules_affected = refused.modules
        for rule, got, n, first in refused.rules.values():
            pv.failed.append((rule, got))
            pv.reasons.append(f"{_modules(n, first)}: {_line(rule, got)}")
        pv.next_steps = _next_steps(runtime, pv.failed, where)
        pv.reasons += pv.next_steps
        return pv
    label = runtime.convention_read(cfg)
    pv.convention_read = label if path.reads_qzeros else None
    if truth is None:
        pv.reasons.append("the data do not decide between gptq and gptq_v2 (GQ402/GQ404): "
                          "whether it reads the zero points right is not known")
        return pv
    reading = path.readings[label]
    t = tally(reading, label == truth)
    pv.modules_affected, pv.cells_affected, pv.causes = t.modules, t.cells, dict(t.causes)
    pv.decodes_correctly = pv.cells_affected == 0
    pv.max_weight_change = t.max_change if t.max_change is not None else \
        (0.0 if pv.decodes_correctly else None)
    for cause, (n, first) in pv.causes.items():
        pv.reasons.append(f"{_modules(n, first)}: "
                          + cause_text(cause, reading, label, truth, path.kernel))
    if pv.decodes_correctly:
        pv.reasons.append("ignores qzeros; every zero point is the symmetric constant it "
                          "assumes" if reading is Reading.SYMMETRIC else
                          f"reads the zero points as {label}, which the data are")
    return pv


def _next_steps(runtime: rt.Runtime, failed: list[tuple[rt.Rule, str]], where: str
                ) -> list[str]:
    """The failed rules' hints (each once), else the runtime's own next step, naming the
    checkpoint (`where`, shell-quoted) where they say {PATH}."""
    hints = list(dict.fromkeys(rule.hint for rule, _ in failed if rule.hint))
    return [h.replace("{PATH}", where) for h in
            hints or ([runtime.next_step] if runtime.next_step else [])]


def _modules(n: int, first: str) -> str:
    return f"{n} module{'s' if n != 1 else ''} (e.g. {first})"


# ---------------------------------------------------------------- findings for --runtime


def runtime_findings(verdicts: Iterable[RuntimeVerdict], where: str | None) -> list[Finding]:
    """verify --runtime: the findings that fail the gate (GQ601 refuses to load, GQ602-GQ605
    decodes wrongly, one per cause) and those that warn (GQ606 another path of it would,
    GQ607 not decidable)."""
    out: list[Finding] = []
    for v in verdicts:
        r = v.runtime
        head = f"{r.name} {r.versions}"
        details: dict[str, Any] = {"runtime": r.id}
        if not v.loads:
            failed = v.taken.failed if v.taken else v.failed
            hints = v.taken.next_steps if v.taken else v.next_steps
            out.append(Finding("GQ601", f"{head} would not load it: " + "; ".join(
                               x for x in v.reasons if x not in hints), file=where,
                               hint="; ".join(hints) or None,
                               details={**details, "rules_failed": [
                                   _rule_json(rule, got) for rule, got in failed]}))
        elif v.decodes_correctly is False:
            t = v.taken
            assert t is not None   # a verdict on decoding is the taken path's
            for cause, (n, first) in t.causes.items():
                out.append(Finding(
                    cause, f"{head} ({t.path.kernel}) would compute other weights than the data "
                    f"mean: {_modules(n, first)}: " + cause_text(
                        cause, t.path.readings[t.convention_read or 'gptq'],
                        t.convention_read or "gptq", "", t.path.kernel
                    ).replace(", but the data are ", "")
                    + f"; {t.cells_affected} zero-point cells in {t.modules_affected} modules"
                    + (f", weights move by up to {t.max_weight_change:.6g}"
                       if t.max_weight_change else ""),
                    file=where, hint=CATALOGUE[cause].hint,
                    details={**details, "kernel": t.path.kernel, "modules": n,
                             "zero_cells_affected": t.cells_affected,
                             "max_weight_change": _rounded(t.max_weight_change)}))
        elif v.decodes_correctly is None:
            out.append(Finding("GQ607", f"{head}: " + "; ".join(v.reasons), file=where,
                               details=details))
        for alt in (v.alternatives if v.taken is not None else []):
            if not alt.loads or alt.decodes_correctly is False:
                what = "would not load it" if not alt.loads else "would decode it wrongly"
                out.append(Finding("GQ606", f"{head}: its {alt.path.kernel} path ({alt.when}) "
                                   f"{what}: " + "; ".join(alt.reasons), file=where,
                                   details={**details, "kernel": alt.path.kernel}))
    return out

