"""The vocabulary the runtime table is written in: where a rule comes from (Citation), what a
rule looks at (Facts), one condition (Rule), one kernel path of a runtime (Path), a runtime
(Runtime), and the conditions runtimes put on checkpoints, each a function that builds a Rule.

A runtime's path is chosen from the checkpoint's base config (and the device: the default is a
current NVIDIA GPU, compute capability 8.0 or later); a module the chosen path cannot take
makes the whole model fail to load, as in the runtimes, which build every layer before serving.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from ..bits.conventions import GPTQ, GPTQ_V2
from ..formats.model import is_lm_head
from .readings import Reading


@dataclass(frozen=True)
class Citation:
    """Where a rule is written: repository, file, commit (or release tag), function."""
    repo: str
    path: str
    ref: str
    where: str = ""

    def __str__(self) -> str:
        at = self.ref[:12] if len(self.ref) == 40 else self.ref
        return f"{self.repo}@{at}:{self.path}" + (f" ({self.where})" if self.where else "")


@dataclass(frozen=True)
class Facts:
    """What a rule looks at: a module (after `dynamic`), or the checkpoint's base config
    (`name` None; shapes None). `sym` and `desc_act` are as declared (None: not set); the rest
    as declared, else as the tensors show."""
    name: str | None
    bits: int | None
    group_size: int | None
    sym: bool | None
    desc_act: bool | None
    act_order: bool | None
    pack_dtype: str | None
    in_features: int | None = None
    out_features: int | None = None
    has_g_idx: bool | None = None
    scale_dtype: str | None = None
    sources: tuple[str, ...] = ()               # config sources present (config.py labels)
    labels: tuple[tuple[str, str, str], ...] = ()   # (source, key, value) of label keys
    quantizer: str | None = None                # meta.quantizer, as written
    lm_head_declared: bool | None = None        # the config's lm_head key
    # a shard whose config (after `dynamic`) differs from its fused layer's (FUSED), as
    # "name: ... vs ...": what a runtime that resolves `dynamic` on fused names builds wrongly
    fused_conflict: str | None = None
    capability: int = 80                        # the GPU's compute capability, as 10 * major
    rows: int = 1                               # rows (tokens) per forward: 1 when decoding
    # the runtime's version asked for (doctor --runtime ID@VERSION); None: the newest the
    # entry was read at, which is what every other command judges
    version: tuple[int, ...] | None = None
    # (file, key) of keys a loader may refuse by name (AutoGPTQ's is_marlin_format)
    legacy_keys: tuple[tuple[str, str], ...] = ()

    def at_least(self, version: tuple[int, ...]) -> bool:
        """Whether the runtime version judged is `version` or later (None: the newest)."""
        return self.version is None or self.version >= version


@dataclass(frozen=True)
class Rule:
    """One condition a runtime or one of its paths puts on a checkpoint. `test` returns None
    when the condition holds, else what was found instead ("bits is 3"); `text` is the
    condition for tables ("bits in {4, 8}"). `scope`: "config" rules read the base config
    (they choose the path, or refuse the model), "module" rules every quantized module,
    "setup" rules the GPU and how the runtime is run (they choose between paths only)."""
    id: str
    text: str
    test: Callable[[Facts], str | None] = field(compare=False)
    source: Citation
    scope: str = "module"
    hint: str = field(default="", compare=False)   # the next step when it fails
    since: tuple[int, ...] | None = None           # the runtime version that added it

    def with_hint(self, hint: str) -> "Rule":
        return replace(self, hint=hint)

    def applies(self, facts: Facts) -> bool:
        """Whether the rule holds at the runtime version judged (Facts.version)."""
        return self.since is None or facts.at_least(self.since)


@dataclass(frozen=True)
class Path:
    """One kernel path of a runtime: chosen when every `when` rule holds; then every module
    must meet `requires`. `readings` says how it reads qzeros under the convention it reads
    (no entry: it does not read qzeros)."""
    kernel: str
    label: str                       # as reports group readers: "vLLM gptq_gemm"
    when: tuple[Rule, ...]
    requires: tuple[Rule, ...]
    readings: dict[str, Reading]
    source: Citation
    otherwise: str = ""              # when it is taken although an earlier path's `when` holds

    @property
    def reads_qzeros(self) -> bool:
        return Reading.SYMMETRIC not in self.readings.values()


@dataclass(frozen=True)
class Runtime:
    id: str
    name: str
    versions: str
    config_files: tuple[str, ...]  # config sources it reads, first present wins
    needs_config: bool             # False: it finds GPTQ layers by their tensors alone
    label_keys: tuple[str, ...]  # keys read for the convention, first found wins; () = none
    paths: tuple[Path, ...]
    requires: tuple[Rule, ...]   # on the base config, whichever path
    label_source: Citation
    # None: reads `dynamic` (per-module overrides and `-:` exclusions); else the source that
    # shows it builds every layer from the base config
    ignores_dynamic: Citation | None = None
    next_step: str = ""          # what to do when it refuses the checkpoint
    config_note: str = ""        # said when it finds no config it reads
    # the versions the entry covers, for doctor's ID@VERSION: one `family` (what users call
    # the runtime: "vllm"), from `since` (inclusive) to `before` (exclusive); None: open
    family: str = ""
    since: tuple[int, ...] | None = None
    before: tuple[int, ...] | None = None
    read: tuple[int, ...] | None = None    # the version whose code the entry was read at

    def covers(self, version: tuple[int, ...]) -> bool:
        return (self.since is None or version >= self.since) and \
            (self.before is None or version < self.before)

    def config_file(self, facts: Facts) -> str | None:
        """The config source this runtime reads: the first of its files that is present."""
        return config_read(self.config_files, facts)

    def convention_read(self, facts: Facts) -> str:
        """The convention this runtime reads: in the file it reads, the first of its keys
        that is set decides, compared exactly with "gptq_v2"; anything else (or nothing) is
        gptq."""
        source = self.config_file(facts)
        values = {k: v for src, k, v in facts.labels if src == source}
        for key in self.label_keys:
            if key in values:
                return GPTQ_V2 if values[key] == GPTQ_V2 else GPTQ
        return GPTQ


def config_read(files: tuple[str, ...], facts: Facts) -> str | None:
    """The config source a runtime reading `files` (first present wins) reads, or None."""
    return next((f for f in files if f in facts.sources), None)


def _as_set(values) -> str:
    return "{" + ", ".join(str(v) for v in sorted(values)) + "}"


# ---------------------------------------------------------------- the vocabulary of rules

def bits_in(allowed, source: Citation, scope: str = "module", rid: str = "bits") -> Rule:
    return Rule(rid, f"bits in {_as_set(allowed)}",
                lambda f: None if f.bits is None or f.bits in allowed else f"bits is {f.bits}",
                source, scope)


def group_size_in(allowed, source: Citation, scope: str = "module") -> Rule:
    return Rule("group_size", f"group_size in {_as_set(allowed)}",
                lambda f: None if f.group_size is None or f.group_size in allowed
                else f"group_size is {f.group_size}", source, scope)


def sym_true(source: Citation, missing: str, scope: str = "config", rid: str = "sym") -> Rule:
    """sym must be true; `missing` says what a missing key does: "true" (assumed true),
    "false" (assumed false: the rule fails), "refuse" (the rule fails: the key is required)."""
    def test(f: Facts):
        if f.sym is None:
            return None if missing == "true" else (
                "sym is not set (read as false)" if missing == "false" else
                "sym is not set (required)")
        return None if f.sym else "sym is false"
    return Rule(rid, "sym true" + {"true": " (missing: true)", "false": " (missing: false)",
                                   "refuse": " (required)"}[missing], test, source, scope)


def key_set(key: str, source: Citation) -> Rule:
    return Rule(f"{key}_set", f"{key} set",
                lambda f: None if getattr(f, key) is not None else f"{key} is not set",
                source, "config")


def divisible(dim: str, by: int, source: Citation, why: str) -> Rule:
    return Rule(f"{dim}_multiple_{by}", f"{dim} multiple of {by} ({why})",
                lambda f: None if getattr(f, dim) is None or getattr(f, dim) % by == 0
                else f"{dim} is {getattr(f, dim)}, not a multiple of {by} ({why})",
                source)


def in_features_per_group(source: Citation) -> Rule:
    return Rule("group_divides", "in_features a multiple of group_size",
                lambda f: None if f.in_features is None or f.group_size in (None, -1) or
                f.in_features % f.group_size == 0
                else f"in_features {f.in_features} is not a multiple of group_size "
                     f"{f.group_size}", source)


def pack_dtype_in(allowed, source: Citation) -> Rule:
    return Rule("pack_dtype", f"pack_dtype in {_as_set(allowed)}",
                lambda f: None if f.pack_dtype is None or f.pack_dtype in allowed
                else f"pack_dtype is {f.pack_dtype}", source)


def not_lm_head(source: Citation) -> Rule:
    return Rule("lm_head", "lm_head not quantized",
                lambda f: "a quantized lm_head" if f.name and is_lm_head(f.name)
                else None, source)


# How vLLM's model files fuse checkpoint layers (packed_modules_mapping, e.g. LlamaForCausalLM:
# {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}):
# `dynamic` is matched against the fused name, so the shards take the fused layer's config.
FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
         "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}


def fused_dynamic(source: Citation) -> Rule:
    return Rule("fused_dynamic", "`dynamic` giving every shard of a fused layer (q/k/v_proj, "
                "gate/up_proj) its fused name's config",
                lambda f: f.fused_conflict and f"{f.fused_conflict}: the fused layer is built "
                "with the latter (a load error, or weights decoded with the wrong config)",
                source, "config").with_hint(
        "next step: give the shards of each fused layer the same `dynamic` overrides, with "
        "patterns that match the fused name too (e.g. `.*\\.(gate|up|gate_up)_proj`)")


def capability_at_least(major_minor: int, source: Citation) -> Rule:
    return Rule(f"capability_{major_minor}", f"GPU compute capability >= "
                f"{major_minor // 10}.{major_minor % 10}",
                lambda f: None if f.capability >= major_minor else
                f"compute capability {f.capability // 10}.{f.capability % 10}", source, "setup")


def no_legacy_key(key: str, files: tuple[str, ...], source: Citation, since: tuple[int, ...],
                  runtime: str) -> Rule:
    """The config the runtime reads (the first of `files` present) must not carry `key`, whatever
    its value: `runtime` refuses it by name from version `since` on (GPTQModel >= 6.0:
    AutoGPTQ's is_marlin_format). Keys are compared lower-cased, as GPTQModel does."""
    def test(f: Facts) -> str | None:
        read = config_read(files, f)
        found = next((k for src, k in f.legacy_keys if src == read and k.lower() == key), None)
        if found is None or not f.at_least(since):
            return None
        return (f"{read} carries {found} (refused by name since {runtime} "
                f"{'.'.join(map(str, since))})")
    return Rule(f"no_{key}", f"no {key} key in the config it reads", test, source, "config")


def asym_needs_gptqmodel_quantizer(source: Citation) -> Rule:
    """GPTQModel refuses sym=false in format gptq unless meta.quantizer names gptqmodel >=
    0.9.0 (AutoGPTQ's asymmetric packer lost the zero points of 0)."""
    def test(f: Facts):
        keys = {k: v for _, k, v in reversed(f.labels)}  # the first file's value wins
        if f.sym is not False or keys.get("format", keys.get("checkpoint_format", GPTQ)) != GPTQ:
            return None
        q = f.quantizer or ""
        name, _, ver = q.partition(":")
        if name.strip().lower() == "gptqmodel" and parse_version(ver) >= (0, 9, 0):
            return None
        return ("sym is false in format gptq and meta.quantizer is "
                + (repr(q) if q else "not set") + " (needs gptqmodel:0.9.0 or later)")
    return Rule("asym_v1_quantizer", "sym false in format gptq only from gptqmodel >= 0.9.0",
                test, source, "config")


def parse_version(text: str) -> tuple[int, ...]:
    """A release's number as a tuple: "0.9.0" -> (0, 9, 0), "7.7.1rc1" -> (7, 7, 1) (the
    leading digits of each part, up to the first part without any), "" -> (0,)."""
    out = []
    for part in text.strip().lstrip("vV").split("."):
        digits = part[:len(part) - len(part.lstrip("0123456789"))]
        if not digits:
            break
        out.append(int(digits))
    return tuple(out) or (0,)





def lm_head_declared(source: Citation) -> Rule:
    """A quantized lm_head loads only where the config says `lm_head: true`."""
    return Rule("lm_head_declared", "a quantized lm_head needs lm_head: true",
                lambda f: "a quantized lm_head without lm_head: true in the config"
                if f.name and is_lm_head(f.name) and not f.lm_head_declared
                else None, source)



def scales_fp16(source: Citation) -> Rule:
    return Rule("fp16", "float16 model (gptq_gemm supports torch.half only; scales' dtype as "
                "the model's)", lambda f: None if f.scale_dtype in (None, "F16") else
                f"scales are {f.scale_dtype}", source)


@dataclass(frozen=True)
class Route:
    """Another format a runtime family reads where its GPTQ path does not serve: what
    doctor's plan may convert to (`to`, a convert --to target), from which version, and the
    conditions on the checkpoint (config-level facts)."""
    family: str
    to: str
    name: str                    # "vLLM >= 0.31 (compressed-tensors)"
    how: str                     # which kernel reads it, and how it reads the zero points
    since: tuple[int, ...]
    requires: tuple[Rule, ...]

    def refuses(self, facts: Facts) -> str | None:
        """Why the route does not take a checkpoint with these facts (None: it does)."""
        if facts.version is not None and facts.version < self.since:
            return f"needs {self.family} >= {'.'.join(map(str, self.since))}"
        failed = [f"{got} (needs {r.text})" for r in self.requires
                  if r.applies(facts) and (got := r.test(facts)) is not None]
        return "; ".join(failed) or None
