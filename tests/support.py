"""What the tests share: paths and fixture data, the slow bit-by-bit packing reference, the
checkpoint builders of the convert fault tests and the mutation-fuzzing harness. Tests import from
here, never from each other nor from conftest.py (which keeps only pytest hooks and fixtures);
scripts/fuzz.py imports the harness, so nothing here needs more than numpy and gptqfmt.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import shutil
import struct
import sys
import types
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from gptqfmt import formats
from gptqfmt.bits.conventions import ZeroRule, sym_field
from gptqfmt.bits.packing import pack
from gptqfmt.errors import FindingError, OutputError, UsageError
from gptqfmt.numerics.cpu import dequant
from gptqfmt.ops.inspect import inspect_checkpoint
from gptqfmt.ops.verify import validate
from gptqfmt.safetensors_io import save_file
from gptqfmt.safetensors_io.index import open_store

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
CKPT = FIXTURES / "ckpt"
FORMATS = FIXTURES / "formats"
Q = "model.layers.0.self_attn.q_proj"  # the module the single-module edits touch


def load_script(path: Path):
    """A script of the repository (a fixture generator, scripts/...) imported as a module, once
    (by its file name)."""
    name = path.stem
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_generator(name: str = "make_fixtures"):
    """A fixture generator script under fixtures/, imported as a module."""
    if str(FIXTURES) not in sys.path:
        sys.path.insert(0, str(FIXTURES))  # the generators import each other
    return load_script(FIXTURES / f"{name}.py")


GEN = load_generator()
SPECS = {s.name: s for s in GEN.specs()}
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())


def gpu_available() -> bool:
    try:
        import cupy  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


# ------------------------------------- the slow bit-by-bit packing reference (packing, convert)

def slow_pack_column(values, bits, word_bits):
    """One Python integer as the bit stream: value k at bit k*bits, then cut into words."""
    stream = 0
    for k, v in enumerate(values):
        for b in range(bits):
            if (int(v) >> b) & 1:
                stream |= 1 << (k * bits + b)
    n_words = len(values) * bits // word_bits
    return [(stream >> (i * word_bits)) & ((1 << word_bits) - 1) for i in range(n_words)]


def slow_unpack_column(words, bits, word_bits):
    stream = 0
    for i, w in enumerate(words):
        stream |= (int(w) & ((1 << word_bits) - 1)) << (i * word_bits)
    n = len(words) * word_bits // bits
    return [(stream >> (k * bits)) & ((1 << bits) - 1) for k in range(n)]


# ------------------------------------ the checkpoints of the convert fault tests (faults, signals)

TMP_TAG = ".gptqfmt-tmp-"


def build(d, shards=4, k=2048, n=4096):
    """A symmetric 4-bit gptq checkpoint in `shards` files, 2 modules each (~34 MB with the
    defaults)."""
    d.mkdir()
    rng = np.random.default_rng(0)
    wm = {}
    for s in range(shards):
        t = {}
        for j in range(2):
            p = f"model.layers.{s * 2 + j}.mlp.up_proj"
            t[f"{p}.qweight"] = rng.integers(-2**31, 2**31, (k // 8, n), dtype=np.int64) \
                .astype(np.int32)
            t[f"{p}.qzeros"] = pack(np.full((k // 128, n), sym_field(4, "gptq")), 4, 32, 1)
            t[f"{p}.scales"] = np.full((k // 128, n), 0.01, np.float16)
            t[f"{p}.g_idx"] = (np.arange(k) // 128).astype(np.int32)
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(t, d / name)
        wm.update({x: name for x in t})
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    (d / "quantize_config.json").write_text(json.dumps(
        {"bits": 4, "group_size": 128, "sym": True, "desc_act": False,
         "checkpoint_format": "gptq"}))
    (d / "tokenizer.json").write_text("{}")


def digest(d):
    return {p.name: digest_file(p) for p in sorted(d.iterdir())}


def digest_file(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def tensors_of(path) -> dict[str, tuple]:
    """{name: (dtype, shape, bytes)} of every tensor of a checkpoint directory."""
    st = open_store(path)
    try:
        return {t: (st.info(t).dtype, tuple(st.info(t).shape), st.view(t).tobytes())
                for t in st.locations}
    finally:
        st.close()


def dequant_all(path) -> dict[str, np.ndarray]:
    """W [K, N] float32 of every module, through the one model (a GPTQ checkpoint read as its
    label says)."""
    src = formats.open_source(path)
    try:
        return {m.name: dequant(formats.module_tensors(src, m), ZeroRule.V2)
                for m in src.modules}
    finally:
        src.close()


def ct_copy(tmp_path, name="ct-b4-asym-g32"):
    d = tmp_path / name
    shutil.copytree(FORMATS / name, d)
    return d


def edit_config(d, fn):
    cfg = json.loads((d / "config.json").read_text())
    fn(cfg["quantization_config"])
    (d / "config.json").write_text(json.dumps(cfg))


def rewrite_tensors(d, fn):
    st = open_store(d)
    t = {n: (st.info(n).dtype, np.array(st.view(n))) for n in st.locations}
    st.close()
    fn(t)
    save_file(t, d / "model.safetensors")


def staging_dirs(parent):
    return sorted(p for p in parent.iterdir() if TMP_TAG in p.name)


# -------------------------------------------------- mutation fuzzing (test_fuzz, scripts/fuzz.py)
# A mutation takes one file of a small checkpoint (a shard, the index or a config) and changes
# its bytes: bit flips, truncation, insertions, or splices of hostile JSON tokens into headers and
# configs. `run_one` then runs inspect and verify and classifies the outcome: a finding or usage
# error is a clean refusal; any other exception is a crash.

TOKENS = [b"-1", b"-0", b"1e400", b"null", b"NaN", b"18446744073709551616", b"[]", b"{}",
          b'"\\ud800"', b'"F16"', b'"I32"', b'"BF16"', b"0", b"4294967296", b'"\\u001b[2J"',
          b"[[[[[[[[", b'"data_offsets"', b'"shape"', b'"__metadata__"', b",", b":"]


def mutate(blob: bytes, rnd: random.Random) -> bytes:
    b = bytearray(blob)
    header_end = 8 + struct.unpack("<Q", blob[:8])[0] if len(blob) >= 8 and \
        struct.unpack("<Q", blob[:8])[0] < len(blob) else len(blob)
    for _ in range(rnd.randint(1, 4)):
        op = rnd.choice(["flip", "flip", "cut", "insert", "token", "token", "length", "data"])
        pos = rnd.randrange(max(1, min(len(b), header_end)))
        if op == "data" and len(b) > header_end:  # tensor values: scales, g_idx, qzeros, ...
            pos = rnd.randrange(header_end, len(b))
            b[pos:pos + 4] = bytes(rnd.choice([0x00, 0x7C, 0x7E, 0xFF, 0x80, rnd.randrange(256)])
                                   for _ in range(min(4, len(b) - pos)))
            continue
        if op == "flip" and b:
            b[pos] ^= 1 << rnd.randrange(8)
        elif op == "cut":
            end = pos + rnd.randint(1, 64) if rnd.random() < 0.7 else len(b)
            del b[pos:end]
        elif op == "insert":
            b[pos:pos] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 8)))
        elif op == "token":
            tok = rnd.choice(TOKENS)
            b[pos:pos + rnd.randint(0, len(tok))] = tok
        elif op == "length" and len(b) >= 8:
            b[:8] = struct.pack("<Q", rnd.choice([0, 1, len(b), len(b) - 8, 2**40, 2**64 - 1,
                                                  rnd.randrange(len(b) + 16)]))
    return bytes(b)


def mutated_copy(src: Path, dst: Path, rnd: random.Random) -> Path:
    shutil.copytree(src, dst)
    files = sorted(p for p in dst.iterdir() if p.suffix in (".safetensors", ".json"))
    target = rnd.choice(files)
    target.write_bytes(mutate(target.read_bytes(), rnd))
    return target


def run_one(path: Path, out: Path | None = None) -> str:
    """'clean' (ran, findings or not), 'refused' (a finding or usage error), or raises on a crash
    (any other exception, a bare internal GptqfmtError, or a report that is not valid JSON).
    With `out`, convert (and verify --against) run too."""
    try:
        json.dumps(inspect_checkpoint(path).to_json(), allow_nan=False)
        rep = validate(path, jobs=1)
        json.dumps(rep.to_json(), allow_nan=False)
        if out is not None:
            from gptqfmt.conversion import convert
            from gptqfmt.ops.equivalence import compare
            convert(path, out, allow_lossy=True)
            compare(path, out, backend="cpu")
        return "clean"
    except (FindingError, UsageError, OutputError):
        return "refused"


# ------------------------------------------------- a Hugging Face cache, laid out as the Hub's

def git_blob_id(data: bytes) -> str:
    """The git blob id of `data`, from git itself when it is installed (the independent
    oracle), else from the documented formula."""
    import subprocess
    try:
        return subprocess.run(["git", "hash-object", "--stdin"], input=data, check=True,
                              capture_output=True).stdout.decode().strip()
    except (OSError, subprocess.CalledProcessError):
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def hf_cache_entry(cache: Path, repo_id: str, src: Path, commit: str,
                   refs: tuple[str, ...] = ("main",)) -> Path:
    """Put the files of checkpoint `src` into the Hugging Face cache `cache` as revision
    `commit` of `repo_id`, as huggingface_hub lays a download out: blobs named by content hash
    (sha256 for what the Hub stores in LFS, here the .safetensors files; the git blob id for
    the rest), snapshots/<commit>/<file> a relative link to its blob, refs/<ref> the commit.
    Returns the snapshot directory."""
    entry = cache / ("models--" + repo_id.replace("/", "--"))
    (entry / "blobs").mkdir(parents=True, exist_ok=True)
    snap = entry / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        data = f.read_bytes()
        blob = (hashlib.sha256(data).hexdigest() if f.suffix == ".safetensors"
                else git_blob_id(data))
        (entry / "blobs" / blob).write_bytes(data)
        link = snap / f.relative_to(src)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path(*[".."] * (len(f.relative_to(src).parts) + 1), "blobs", blob))
    (entry / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (entry / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (entry / "refs" / ref).write_text(commit)
    return snap


# compressed-tensors 0.20 needs Python 3.11 (the test extra pins it there, pyproject.toml): the
# format tests' oracle, its packer, compressor and decompressor, with torch
HAVE_CT = sys.version_info >= (3, 11)
needs_ct = pytest.mark.skipif(not HAVE_CT, reason="compressed-tensors 0.20 needs Python 3.11")


# ------------------ compressed-tensors' two pack_to_int32 layouts, slowly (bits/ct_layouts.py)

def slow_ct_row(values, bits, layout):
    """One row of stored values as compressed-tensors packs it, one Python integer per word,
    value by value: padded (<= 0.17) puts value i in word i // floor(32/bits) at bit
    (i % floor(32/bits)) * bits; dense (>= 0.18) puts it at bit i*bits of one stream."""
    per = 32 // bits
    n = -(-len(values) // per) if layout == "padded" else -(-len(values) * bits // 32)
    stream = 0
    for i, v in enumerate(values):
        start = (i // per) * 32 + (i % per) * bits if layout == "padded" else i * bits
        stream |= int(v) << start
    return [(stream >> (32 * w)) & 0xFFFFFFFF for w in range(n)]


def slow_ct_values(words, bits, count, layout):
    """The inverse of slow_ct_row: `count` values from one row of words."""
    per = 32 // bits
    stream = sum((int(w) & 0xFFFFFFFF) << (32 * i) for i, w in enumerate(words))
    out = []
    for i in range(count):
        start = (i // per) * 32 + (i % per) * bits if layout == "padded" else i * bits
        out.append((stream >> start) & ((1 << bits) - 1))
    return out


# compressed-tensors' own helpers.py of a release, from its wheel, where one is at hand: pip
# download compressed-tensors==0.17.1 (or 0.18.0) --no-deps -d /tmp/ctw (GPTQFMT_CT_WHEELS names
# another folder). Only the helpers are run (they need torch), not the package's import chain.
CT_WHEELS = Path(os.environ.get("GPTQFMT_CT_WHEELS", "/tmp/ctw"))
CT_HELPERS = "compressed_tensors/compressors/pack_quantized/helpers.py"


def ct_release_helpers(version: str):
    """compressed-tensors `version`'s pack_quantized/helpers.py as a module (pack_to_int32,
    unpack_from_int32), or pytest.skip when its wheel or torch is not at hand."""
    import zipfile
    pytest.importorskip("torch")
    wheel = CT_WHEELS / f"compressed_tensors-{version}-py3-none-any.whl"
    if not wheel.is_file():
        pytest.skip(f"no {wheel.name} in {CT_WHEELS} (pip download compressed-tensors=="
                    f"{version} --no-deps -d {CT_WHEELS})")
    name = f"ct_helpers_{version.replace('.', '_')}"
    if name not in sys.modules:
        mod = types.ModuleType(name)
        code = zipfile.ZipFile(wheel).read(CT_HELPERS).decode()
        exec(compile(code, f"{wheel}/{CT_HELPERS}", "exec"), mod.__dict__)
        sys.modules[name] = mod
    return sys.modules[name]


def unwrap(text: str) -> list[str]:
    """A text report's logical lines: each line the reporter wrapped at 100 columns joined back
    (a continuation is indented four columns deeper than the line it continues)."""
    out: list[str] = []
    base = 0
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        if out and line.strip() and indent == base + 4:
            out[-1] += " " + line.strip()
            continue
        out.append(line)
        base = indent
    return out


@contextmanager
def loops(compiled: bool):
    """The compiled loops (gptqfmt.bits.native) on or off, as a user turns them off
    (GPTQFMT_NATIVE=0)."""
    saved = os.environ.get("GPTQFMT_NATIVE")
    os.environ["GPTQFMT_NATIVE"] = "1" if compiled else "0"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["GPTQFMT_NATIVE"]
        else:
            os.environ["GPTQFMT_NATIVE"] = saved


def c_compiler() -> str | None:
    """The C compiler this interpreter builds extensions with, where it and Python.h are at
    hand (else None): where `pip install` builds gptqfmt.bits._native."""
    import sysconfig
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    return cc if shutil.which(cc) is not None and headers.is_file() else None
