#!/usr/bin/env python3
"""Acceptance run: do `gptqfmt doctor PATH --runtime ID --fix DST` outputs load and decode right
in the runtimes' OWN code, on a CPU?

    /work/peers/bin/python scripts/peer_acceptance.py [--out FILE.md] [--work DIR] [--keep]
                                                      [--fixtures DIR] [--only KEY ...]
                                                      [--gptqfmt-note TEXT]

About 15 minutes on 2 CPU cores (GPTQModel.load takes 1.5 minutes a model: torch.compile).
The peers' environment (Python >= 3.11):
    python3 -m venv /work/peers && . /work/peers/bin/activate
    pip install torch==2.13.0 && pip install transformers==5.24.0 compressed-tensors==0.20.0
    pip install gptqmodel==7.7.0 optimum   # pure Python sdist; it pulls torch>=2.14.1, so:
    pip install torch==2.13.0              # back to the CPU wheel (pip warns; GPTQModel works)
    pip install /path/to/gptqfmt

Not a test and never imported by one: it needs a separate environment with the peers installed
(torch, transformers, compressed-tensors, GPTQModel and optimum, plus gptqfmt itself), which the
project's dev venv does not have. gptqfmt is run as the installed package's CLI (a subprocess of
this interpreter, cwd = the work dir and `-P`, so a source tree in the cwd cannot shadow it).

What it does:
  1. builds whole small Llamas with fixtures/make_whole_models.py (30 layers x 7 linears,
     hidden 64), correctly labelled and mislabelled (`mislabel`), with a tiny WordLevel
     tokenizer added (GPTQModel.load always loads one);
  2. for each model and runtime (gptqmodel, transformers, vllm): `gptqfmt doctor SRC --runtime ID`
     (text: first two lines and exit code; json: answer and plan) and `... --fix DST`;
  3. loads the correctly labelled gptq originals with GPTQModel's torch backend
     (BACKEND.GPTQ_TORCH, float16: TorchLinear refuses float32) and with transformers
     (AutoModelForCausalLM, which goes through optimum and GPTQModel's kernel selection): these
     are the references. Every other original (as it is) and every GPTQ-format DST is loaded
     the same two ways and its logits compared with the reference's of the same loader
     (expected: bit-identical); GPTQModel's dequantize_weight() of each of the 210 modules is
     compared with the reference's too, and the reference's with this script's own numpy
     decode of the v1 tensors;
  4. a compressed-tensors DST is decompressed with compressed-tensors' own
     PackedQuantizationCompressor.decompress (scheme from the DST's config) and compared with the
     reference's dequantized weights; a plain float32 LlamaForCausalLM fed those weights gives
     logits compared with the same dense model fed the reference's weights; the packed tensors are
     re-packed with compressed-tensors' own compress() and compared byte for byte; and
     transformers' own loader (AutoModelForCausalLM, compressed-tensors quantizer) is tried too.

Prints a markdown report (and writes it to --out).
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
RUNTIMES = ("gptqmodel", "transformers", "vllm")
GPTQFMT = [sys.executable, "-P", "-c",
           "import importlib; importlib.import_module('gptqfmt.cli.main').run()"]


@dataclass(frozen=True)
class ModelCase:
    key: str
    bits: int
    act: bool
    data: str            # the convention the zero points are written in
    declared: str        # what the configs say
    ref: str             # key of the correctly labelled gptq model of the same weights

    @property
    def mislabelled(self) -> bool:
        return self.data != self.declared


CASES = [
    ModelCase("b4-gptq", 4, False, "gptq", "gptq", "b4-gptq"),
    ModelCase("b4-gptq_v2", 4, False, "gptq_v2", "gptq_v2", "b4-gptq"),
    ModelCase("b4-v2data-as-gptq", 4, False, "gptq_v2", "gptq", "b4-gptq"),
    ModelCase("b4-v1data-as-gptq_v2", 4, False, "gptq", "gptq_v2", "b4-gptq"),
    ModelCase("b4-act-gptq", 4, True, "gptq", "gptq", "b4-act-gptq"),
    ModelCase("b4-act-v2data-as-gptq", 4, True, "gptq_v2", "gptq", "b4-act-gptq"),
    ModelCase("b8-gptq", 8, False, "gptq", "gptq", "b8-gptq"),
    ModelCase("b8-v2data-as-gptq", 8, False, "gptq_v2", "gptq", "b8-gptq"),
]


# ---------------------------------------------------------------------------------------------
# building

def build_models(fixtures: Path, root: Path, cases: list[ModelCase]) -> dict[str, Path]:
    sys.path.insert(0, str(fixtures))
    import make_whole_models as w  # noqa: PLC0415 (the fixture builder of the tree given)

    paths: dict[str, Path] = {}
    built: dict[tuple, Path] = {}
    for c in cases:
        spec = w.WholeSpec(bits=c.bits, act_order=c.act, convention=c.data)
        dst = root / "src" / c.key
        if not c.mislabelled:
            w.build_whole_model(spec, dst)
        else:
            plain = built.get((c.bits, c.act, c.data))
            if plain is None:
                plain = root / "src" / f"_plain-b{c.bits}-{c.act}-{c.data}"
                w.build_whole_model(spec, plain)
            declared = w.mislabel(plain, dst, spec)
            assert declared == c.declared, (declared, c)
        built[(c.bits, c.act, c.data)] = dst
        add_tokenizer(dst)
        paths[c.key] = dst
    return paths


def add_tokenizer(d: Path) -> bool:
    """A WordLevel tokenizer over the 128 ids (t1..t127, <unk> = 0): GPTQModel.load always
    loads a tokenizer, and a real checkpoint ships one. Returns whether it had to be added."""
    if (d / "tokenizer.json").exists():
        return False
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0} | {f"t{i}": i for i in range(1, 128)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "t1",
        "eos_token": "t2", "model_max_length": 512}))
    return True


def tree_hash(d: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(d.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(d).as_posix().encode())
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# gptqfmt

@dataclass
class DoctorRun:
    rc: int
    lines: list[str]
    answer: str = ""
    plan: list[str] = field(default_factory=list)
    plan_note: str = ""
    fix_rc: int | None = None
    fix_out: str = ""
    dst: Path | None = None


def gptqfmt(args: list[str], cwd: Path) -> tuple[int, str]:
    p = subprocess.run(GPTQFMT + args, cwd=cwd, capture_output=True, text=True,
                       env=os.environ | {"NO_COLOR": "1"})
    return p.returncode, (p.stdout + p.stderr)


def run_doctor(src: Path, runtime: str, dst: Path, cwd: Path) -> DoctorRun:
    rc, out = gptqfmt(["doctor", str(src), "--runtime", runtime, "--color", "never"], cwd)
    r = DoctorRun(rc, out.splitlines()[:2])
    jrc, jout = gptqfmt(["doctor", str(src), "--runtime", runtime, "--format", "json"], cwd)
    try:
        doc = json.loads(jout)
        r.answer = doc.get("answer") or doc.get("status", "?")
        plan = doc.get("plan") or {}
        r.plan = [s["command"] for s in plan.get("steps", [])]
        if not r.plan:
            r.plan_note = "no plan" + (f" (tried: {len(plan.get('tried', []))})"
                                       if plan.get("tried") else "")
    except (ValueError, KeyError) as e:
        r.answer = f"json unreadable ({e}; rc {jrc})"
    frc, fout = gptqfmt(["doctor", str(src), "--runtime", runtime, "--fix", str(dst),
                         "--color", "never"], cwd)
    r.fix_rc, r.fix_out = frc, fout
    r.dst = dst if dst.exists() else None
    return r


# ---------------------------------------------------------------------------------------------
# peers

def input_ids():
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 128, (2, 16), generator=g)
    ids[:, 0] = 1
    return ids


@dataclass
class Loaded:
    logits: object = None                 # torch.Tensor
    weights: dict | None = None           # module name -> float16 [out, in]
    kernels: str = ""
    error: str = ""
    seconds: float = 0.0


def quiet(fn, *a, **kw):
    """Run fn with the peers' chatter (banners, progress bars) captured; on an exception, the
    exception's own message."""
    buf = io.StringIO()
    try:
        with redirect_stdout(buf), redirect_stderr(buf):
            return fn(*a, **kw), buf.getvalue()
    except Exception as e:  # noqa: BLE001 - a refusal is a result here
        e.captured = buf.getvalue()  # type: ignore[attr-defined]
        raise


def _kernels(model) -> str:
    names = sorted({type(m).__name__ for n, m in model.named_modules()
                    if n.endswith(("q_proj", "down_proj"))})
    return ",".join(names)


def _first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"


def load_gptqmodel(path: Path) -> Loaded:
    import torch
    from gptqmodel import BACKEND, GPTQModel

    t0 = time.time()
    out = Loaded()
    try:
        m, _ = quiet(GPTQModel.load, str(path), backend=BACKEND.GPTQ_TORCH, device="cpu",
                     dtype=torch.float16)
        model = m.model
        model.eval()
        with torch.no_grad():
            out.logits = model(input_ids=input_ids()).logits.float().clone()
            out.kernels = _kernels(model)
            out.weights = {}
            for name, mod in model.named_modules():
                if hasattr(mod, "dequantize_weight") and hasattr(mod, "qweight"):
                    w = mod.dequantize_weight()
                    if tuple(w.shape) == (mod.in_features, mod.out_features):
                        w = w.t()  # GPTQModel's dequantize_weight is [in, out]
                    if tuple(w.shape) != (mod.out_features, mod.in_features):
                        raise RuntimeError(f"{name}: dequantize_weight shape {tuple(w.shape)}")
                    out.weights[name] = w.contiguous().clone()
        del m, model
    except Exception as e:  # noqa: BLE001
        out.error = _first_line(e)
    gc.collect()
    out.seconds = time.time() - t0
    return out


def load_transformers(path: Path) -> Loaded:
    import torch
    from transformers import AutoModelForCausalLM

    t0 = time.time()
    out = Loaded()
    report = io.StringIO()
    handler = logging.StreamHandler(report)
    hf_logger = logging.getLogger("transformers")
    hf_logger.addHandler(handler)
    try:
        model, _ = quiet(AutoModelForCausalLM.from_pretrained, str(path), device_map="cpu",
                         dtype=torch.float16)
        model.eval()
        with torch.no_grad():
            out.logits = model(input_ids=input_ids()).logits.float().clone()
        out.kernels = _kernels(model)
        del model
    except Exception as e:  # noqa: BLE001
        out.error = _first_line(e)
        cap = getattr(e, "captured", "") + report.getvalue()
        mism = [" ".join(ln.split()) for ln in cap.splitlines() if "MISMATCH" in ln and "|" in ln]
        if mism:
            out.error += f" [load report: {len(mism)} MISMATCH rows, e.g. `{mism[0]}`]"
    finally:
        hf_logger.removeHandler(handler)
    gc.collect()
    out.seconds = time.time() - t0
    return out


def read_tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    idx = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(idx.read_text())["weight_map"].values())) if idx.exists() \
        else ["model.safetensors"]
    t = {}
    for f in files:
        t.update(load_file(str(path / f)))
    return t


def numpy_decode_v1(path: Path, bits: int) -> dict:
    """This script's own decode of GPTQ v1 tensors: W[n, k] = (q[k, n] - (zs[g, n] + 1)) * s[g, n]
    with g = g_idx[k] (bits packed from the low end of each int32 word; qweight along K, qzeros
    along N)."""
    t = read_tensors(path)
    per = 32 // bits
    mask = (1 << bits) - 1
    out = {}
    for name in [n[:-len(".qweight")] for n in t if n.endswith(".qweight")]:
        qw = t[name + ".qweight"].numpy().view(np.uint32)
        qz = t[name + ".qzeros"].numpy().view(np.uint32)
        s = t[name + ".scales"].numpy().astype(np.float32)
        g = t[name + ".g_idx"].numpy().astype(np.int64)
        shifts = (np.arange(per, dtype=np.uint32) * bits)
        q = ((qw[:, None, :] >> shifts[None, :, None]) & mask).reshape(-1, qw.shape[1])
        z = ((qz[:, :, None] >> shifts[None, None, :]) & mask).reshape(qz.shape[0], -1)
        z = (z.astype(np.int64) + 1) & mask if bits < 8 else (z.astype(np.int64) + 1) % 256
        # exact in float32 (a small integer times a float16), then rounded once to float16:
        # what a float16 multiply gives
        w = ((q.astype(np.float32) - z[g].astype(np.float32)) * s[g]).astype(np.float16)
        out[name] = w.T.copy()
    return out


def ct_decompress(path: Path) -> tuple[dict | None, str, str]:
    """compressed-tensors' own PackedQuantizationCompressor.decompress over every module of the
    DST (in the scales' dtype, float16, as it does on load); also re-packs each with its
    compress() and compares the bytes. Returns (weights, repack verdict, error)."""
    import torch
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from compressed_tensors.utils.match import match_name

    cfg = json.loads((path / "config.json").read_text())["quantization_config"]
    qc = QuantizationConfig.model_validate(
        {k: v for k, v in cfg.items() if k not in ("gptqfmt",)})
    t = read_tensors(path)
    weights, repack_bad, n = {}, [], 0
    try:
        for name in sorted(n[:-len(".weight_packed")] for n in t if n.endswith(".weight_packed")):
            scheme = next(s for s in qc.config_groups.values()
                          if any(match_name(name, tg) for tg in s.targets))
            sd = {k.split(".")[-1]: v for k, v in t.items() if k.startswith(name + ".")}
            dec = PackedQuantizationCompressor.decompress(sd, scheme)
            weights[name] = dec["weight"]
            # re-pack with compressed-tensors' own compress(): from its unpacked zero points
            re_sd = {"weight": dec["weight"], "weight_scale": sd["weight_scale"],
                     "weight_zero_point": dec["weight_zero_point"]}
            if "weight_g_idx" in sd:
                re_sd["weight_g_idx"] = sd["weight_g_idx"]
            com = PackedQuantizationCompressor.compress(re_sd, scheme)
            for k in ("weight_packed", "weight_zero_point"):
                if k in sd and not torch.equal(com[k], sd[k]):
                    repack_bad.append(f"{name}.{k}")
            n += 1
    except Exception as e:  # noqa: BLE001
        return None, "", _first_line(e)
    verdict = (f"compress() re-pack byte-identical ({n}/{n} modules)" if not repack_bad
               else f"compress() re-pack DIFFERS in {len(repack_bad)} tensors, e.g. "
                    f"{repack_bad[0]}")
    return weights, verdict, ""


def dense_logits(path: Path, weights: dict):
    """A plain float32 LlamaForCausalLM from path's config.json (quantization dropped) with the
    unquantized tensors from the checkpoint and `weights` for the 210 linears."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = json.loads((path / "config.json").read_text())
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = "float32"
    model = LlamaForCausalLM(LlamaConfig(**cfg)).float().eval()
    t = read_tensors(path)
    sd = {k: v.float() for k, v in t.items() if k.endswith(".weight") and "layers" not in k
          or "layernorm" in k}
    sd |= {f"{k}.weight": v.float() for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if "rotary" not in m]
    if missing or unexpected:
        raise RuntimeError(f"dense model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    with torch.no_grad():
        lg = model(input_ids=input_ids()).logits.float().clone()
    del model
    return lg


def ct_native_control(work: Path) -> str:
    """Control for transformers' compressed-tensors loader: a 1-layer Llama quantized W4 asym
    group 32 by hand, compressed by compressed-tensors' OWN ModelCompressor (pack-quantized),
    saved, and loaded back by AutoModelForCausalLM. If that is refused too, a refusal of
    gptqfmt's compressed-tensors output by the same loader is the peers' limitation."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    model = LlamaForCausalLM(cfg).half()
    qc = QuantizationConfig.model_validate({
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "int", "symmetric": False, "group_size": 32,
            "strategy": "group"}}},
        "ignore": ["lm_head"], "format": "pack-quantized"})
    apply_quantization_config(model, qc)
    for _, m in model.named_modules():
        if hasattr(m, "weight_zero_point"):
            g = m.weight.data.float().reshape(m.weight.shape[0], -1, 32)
            lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
            sc = ((hi - lo) / 15).clamp(min=1e-4)
            m.weight_scale.data = sc.to(m.weight_scale.dtype)
            m.weight_zero_point.data = torch.round(-lo / sc).clamp(0, 15).to(
                m.weight_zero_point.dtype)
    comp = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    quiet(comp.compress_model, model)
    out = work / "ct-native-control"
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(str(out))
    comp.update_config(str(out))
    t = read_tensors(out)
    zp = tuple(t["model.layers.0.self_attn.q_proj.weight_zero_point"].shape)
    ld = load_transformers(out)
    return (f"compressed-tensors' own asymmetric pack-quantized checkpoint (1-layer Llama, W4 "
            f"g32, written by ModelCompressor.compress_model + save_pretrained; q_proj "
            f"weight_zero_point stored {zp}) loaded by AutoModelForCausalLM: "
            + (f"refused: {ld.error}" if ld.error else f"loaded [{ld.kernels}]"))


# ---------------------------------------------------------------------------------------------
# comparing

def cmp_tensors(a, b) -> str:
    import torch

    if a is None or b is None:
        return "n/a"
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    if torch.equal(a, b):
        return "identical"
    d = (a - b).abs().max().item()
    rel = d / max(b.abs().max().item(), 1e-30)
    close = torch.allclose(a, b, rtol=1e-5, atol=1e-5)
    return f"{'allclose' if close else 'DIFFERS'} max abs diff {d:.3g} (rel {rel:.2g})"


def cmp_weights(w: dict | None, ref: dict | None) -> str:
    import torch

    if w is None or ref is None:
        return "n/a"
    if set(w) != set(ref):
        return f"module sets differ ({len(w)} vs {len(ref)})"
    bad = [n for n in ref if not torch.equal(w[n], ref[n])]
    if not bad:
        return f"identical ({len(ref)}/{len(ref)} modules)"
    d = max((w[n] - ref[n]).abs().max().item() for n in bad)
    return f"DIFFERS in {len(bad)}/{len(ref)} modules, max abs diff {d:.3g}"


def loaded_cell(ld: Loaded, ref: Loaded, with_weights: bool = True) -> str:
    if ld.error:
        return f"refused: {ld.error}"
    s = f"logits {cmp_tensors(ld.logits, ref.logits)}"
    if with_weights and ld.weights is not None and ref.weights is not None:
        s += f"; dequant {cmp_weights(ld.weights, ref.weights)}"
    return s + f" [{ld.kernels}]"


def peer_right(peer: str) -> bool | None:
    """Whether the peer cell shows the right weights and logits (None: nothing was checked)."""
    if peer.startswith("same bytes as"):
        peer = peer.split(": ", 1)[1]
    if "CT decompress:" in peer:
        return "dequant identical" in peer and "dense logits identical" in peer
    if peer.startswith("GPTQModel:"):
        g, _, h = peer.partition("; transformers: ")
        return g.startswith("GPTQModel: logits identical") and h.startswith("logits identical")
    if peer.startswith("as is: is the reference"):
        return True
    if peer.startswith("as is:"):
        return peer.startswith("as is: logits identical")
    return None


def agree(r: DoctorRun, peer: str, runtime: str) -> str:
    """Does the peer bear out doctor's claim? A claim is: 'serves' (as is), or --fix exit 0
    (fixed: DST computes the right weights)."""
    ok = peer_right(peer)
    claims = r.fix_rc == 0 or r.answer == "serves"
    if ok is None:
        return "no claim checked" if not claims else "UNCHECKED (no peer for this runtime)"
    if claims and ok:
        return "yes"
    if claims and not ok:
        return "**NO: doctor claims right, peer differs**"
    return "peer right, but doctor made no claim" if ok else "yes (doctor: not right)"


def md_escape(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


# ---------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="also write the markdown report here")
    ap.add_argument("--work", type=Path, help="work directory (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--fixtures", type=Path, default=REPO / "fixtures")
    ap.add_argument("--only", nargs="*", help="model keys to run (references are added)")
    ap.add_argument("--gptqfmt-note", default="",
                    help="what gptqfmt build is installed (e.g. the commit), for the report")
    a = ap.parse_args(argv)

    import torch

    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    cases = CASES
    if a.only:
        want = set(a.only) | {c.ref for c in CASES if c.key in a.only}
        cases = [c for c in CASES if c.key in want]
    work = a.work or Path(tempfile.mkdtemp(prefix="peer-acceptance-"))
    work.mkdir(parents=True, exist_ok=True)
    log = lambda *x: print(*x, file=sys.stderr, flush=True)  # noqa: E731
    t_start = time.time()

    from importlib import metadata

    versions = {}
    for dist, mod in (("torch", "torch"), ("transformers", "transformers"),
                      ("compressed-tensors", "compressed_tensors"), ("GPTQModel", "gptqmodel"),
                      ("optimum", "optimum"), ("gptqfmt", "gptqfmt")):
        try:
            m = __import__(mod)
            where = list(getattr(m, "__path__", []))[:1] or [getattr(m, "__file__", "?")]
            versions[dist] = f"{metadata.version(dist)} ({where[0]})"
        except Exception as e:  # noqa: BLE001
            versions[dist] = f"not importable: {_first_line(e)}"
    if a.gptqfmt_note:
        versions["gptqfmt"] += f"; {a.gptqfmt_note}"

    log(f"building {len(cases)} models under {work}")
    paths = build_models(a.fixtures, work, cases)

    # doctor, and doctor --fix
    runs: dict[tuple[str, str], DoctorRun] = {}
    for c in cases:
        for rt in RUNTIMES:
            (work / "fixed").mkdir(exist_ok=True)  # convert wants DST's parent to exist
            dst = work / "fixed" / f"{c.key}--{rt}"
            runs[(c.key, rt)] = r = run_doctor(paths[c.key], rt, dst, work)
            log(f"doctor {c.key} {rt}: rc {r.rc} {r.answer}; plan {r.plan or r.plan_note}; "
                f"--fix rc {r.fix_rc}")

    # references
    refs: dict[str, dict[str, Loaded]] = {}
    notes: list[str] = []
    for key in dict.fromkeys(c.ref for c in cases):
        log(f"reference {key}")
        g = load_gptqmodel(paths[key])
        h = load_transformers(paths[key])
        if g.error:
            raise SystemExit(f"GPTQModel cannot load the reference {key}: {g.error}")
        own = numpy_decode_v1(paths[key], next(c.bits for c in cases if c.key == key))
        import torch as _t
        own_t = {k: _t.from_numpy(v) for k, v in own.items()}
        dense = dense_logits(paths[key], g.weights)
        refs[key] = {"gptqmodel": g, "transformers": h, "dense": Loaded(logits=dense)}
        notes.append(f"reference `{key}`: GPTQModel dequant vs this script's numpy decode of v1: "
                     f"{cmp_weights(g.weights, own_t)}; GPTQModel logits vs transformers logits: "
                     f"{cmp_tensors(h.logits, g.logits) if not h.error else h.error}; "
                     f"GPTQModel logits vs dense float32 Llama with its dequantized weights: "
                     f"{cmp_tensors(dense, g.logits)}; kernels: GPTQModel [{g.kernels}], "
                     f"transformers [{h.kernels}]; load s: {g.seconds:.0f} / {h.seconds:.0f}")

    log("compressed-tensors control")
    try:
        notes.append(ct_native_control(work))
    except Exception as e:  # noqa: BLE001
        notes.append(f"compressed-tensors control could not run: {_first_line(e)}")

    # originals as they are
    as_is: dict[tuple[str, str], Loaded] = {}
    for c in cases:
        if c.key == c.ref:
            as_is[(c.key, "gptqmodel")] = refs[c.key]["gptqmodel"]
            as_is[(c.key, "transformers")] = refs[c.key]["transformers"]
            continue
        log(f"original as-is {c.key}")
        as_is[(c.key, "gptqmodel")] = load_gptqmodel(paths[c.key])
        as_is[(c.key, "transformers")] = load_transformers(paths[c.key])

    # fixed outputs
    fixed: dict[tuple[str, str], str] = {}
    seen: dict[str, tuple[str, str]] = {}
    for c in cases:
        ref = refs[c.ref]
        for rt in RUNTIMES:
            r = runs[(c.key, rt)]
            if r.dst is None:
                fixed[(c.key, rt)] = "no DST written"
                continue
            added = add_tokenizer(r.dst)
            h = tree_hash(r.dst)
            if h in seen:
                fixed[(c.key, rt)] = f"same bytes as `{seen[h][0]}` DST: {seen[h][1]}"
                continue
            qc = json.loads((r.dst / "config.json").read_text()).get("quantization_config", {})
            log(f"fixed {c.key} {rt}: {qc.get('quant_method')}")
            if qc.get("quant_method") == "compressed-tensors":
                w, repack, err = ct_decompress(r.dst)
                if err:
                    cell = f"compressed-tensors decompress refused: {err}"
                else:
                    dl = dense_logits(r.dst, w)
                    cell = (f"CT decompress: dequant {cmp_weights(w, ref['gptqmodel'].weights)}; "
                            f"dense logits {cmp_tensors(dl, ref['dense'].logits)}; {repack}")
                hf = load_transformers(r.dst)
                cell += "; transformers AutoModel: " + (
                    f"refused: {hf.error}" if hf.error else
                    f"logits vs dense reference {cmp_tensors(hf.logits, ref['dense'].logits)} "
                    f"[{hf.kernels}]")
            else:
                g = load_gptqmodel(r.dst)
                hf = load_transformers(r.dst)
                cell = (f"GPTQModel: {loaded_cell(g, ref['gptqmodel'])}; "
                        f"transformers: {loaded_cell(hf, ref['transformers'], False)}")
            if added:
                cell += " (tokenizer added to DST for loading)"
            fixed[(c.key, rt)] = cell
            seen[h] = (f"{c.key}--{rt}", cell)

    # report
    L = []
    L.append("# gptqfmt doctor --fix: peer acceptance on CPU\n")
    L.append(f"Generated by `scripts/peer_acceptance.py` in {time.time() - t_start:.0f} s. "
             "Input: `input_ids` = randint(0, 128, (2, 16)) seed 0, first token 1; every model "
             "loaded in float16 on CPU (GPTQModel's TorchLinear refuses float32); the dense Llama "
             "used for compressed-tensors outputs runs in float32 on the float16 weights.\n")
    L.append("Versions:\n")
    L += [f"- {k}: {v}" for k, v in versions.items()]
    L.append("")
    L.append("Models (fixtures/make_whole_models.py, 30 layers x 7 linears = 210 modules, "
             "hidden 64, group 32, asymmetric):\n")
    for c in cases:
        L.append(f"- `{c.key}`: {c.bits}-bit, {'act-order' if c.act else 'no act-order'}, "
                 f"zero points written as {c.data}, configs declare {c.declared}; reference "
                 f"`{c.ref}`")
    L.append("")
    L.append("## Originals as they are, loaded by the peers\n")
    L.append("Compared with the reference of the same loader (the correctly labelled gptq model "
             "of the same weights). GPTQModel = `GPTQModel.load(path, backend=BACKEND.GPTQ_TORCH, "
             "device='cpu', dtype=float16)`; transformers = `AutoModelForCausalLM.from_pretrained("
             "path, device_map='cpu', dtype=float16)` (optimum + GPTQModel's kernel choice).\n")
    L.append("| model | GPTQModel (torch) | transformers |")
    L.append("|---|---|---|")
    for c in cases:
        g, h = as_is[(c.key, "gptqmodel")], as_is[(c.key, "transformers")]
        ref = refs[c.ref]
        cg = "reference" if c.key == c.ref else loaded_cell(g, ref["gptqmodel"])
        ch = "reference" if c.key == c.ref else loaded_cell(h, ref["transformers"], False)
        if c.key == c.ref:
            cg += f" [{g.kernels}]"
            ch += f" [{h.kernels}]" if not h.error else f" refused: {h.error}"
        L.append(f"| `{c.key}` | {md_escape(cg)} | {md_escape(ch)} |")
    L.append("")
    L.append("## doctor, doctor --fix, and the peers on the result\n")
    L.append("Doctor line 1 and 2 from the text output (exit code); answer and plan from "
             "`--format json`; `--fix DST` exit code and its last line; the peer check of DST "
             "(GPTQ-format DST: GPTQModel and transformers vs the references; compressed-tensors "
             "DST: compressed-tensors' own decompress vs the reference's dequantized weights, a "
             "dense float32 Llama on both, and transformers' own loader). Where doctor says the "
             "runtime serves the original, the as-is peer result is shown (vLLM itself cannot "
             "run here).\n")
    L.append("| model | runtime | doctor (rc) | why | answer | plan | --fix rc: last line | "
             "peer result | agrees? |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for c in cases:
        for rt in RUNTIMES:
            r = runs[(c.key, rt)]
            l1 = r.lines[0] if r.lines else ""
            l2 = r.lines[1] if len(r.lines) > 1 else ""
            plan = "<br>".join(f"`{p}`" for p in r.plan) or r.plan_note
            last = (r.fix_out.strip().splitlines() or [""])[-1]
            peer = fixed[(c.key, rt)]
            if r.dst is None and r.answer == "serves" and rt in ("gptqmodel", "transformers"):
                peer = "as is: " + loaded_cell(as_is[(c.key, rt)], refs[c.ref][rt],
                                               rt == "gptqmodel") \
                    if c.key != c.ref else "as is: is the reference"
            elif r.dst is None and rt == "vllm":
                peer = "no DST; vLLM not runnable on this CPU"
            L.append(f"| `{c.key}` | {rt} | {md_escape(l1)} ({r.rc}) | {md_escape(l2)} | "
                     f"{r.answer} | {md_escape(plan)} | {r.fix_rc}: {md_escape(last)} | "
                     f"{md_escape(peer)} | {agree(r, peer, rt)} |")
    L.append("")
    L.append("## Checks of the references\n")
    L += [f"- {n}" for n in notes]
    L.append("")
    L.append("## Full `doctor --fix` outputs\n")
    for c in cases:
        for rt in RUNTIMES:
            r = runs[(c.key, rt)]
            L.append(f"<details><summary>{c.key} --runtime {rt} --fix (rc {r.fix_rc})</summary>"
                     f"\n\n```\n{r.fix_out.rstrip()}\n```\n</details>\n")
    text = "\n".join(L) + "\n"
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    if not a.keep and not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.exit(3)
