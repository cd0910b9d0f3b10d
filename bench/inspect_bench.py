#!/usr/bin/env python3
"""inspect on a 70B-Llama-shaped GPTQ checkpoint (80 layers x 7 linears, 4-bit, group 128).

Built in a temporary directory as 16 shards whose qweight and scales (past their first page)
are holes in sparse files (nothing reads them); qzeros (the symmetric gptq pattern) and g_idx
are real data. Reports
inspect's wall time, first run and warm (page cache), and the ratio to a baseline that does the
least any reader must: the official safetensors library opening every shard and reading every
qzeros and g_idx tensor, in the same process.

    python bench/inspect_bench.py [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gptqfmt import inspect  # noqa: E402
from gptqfmt.bits.packing import constant_words, pack  # noqa: E402
from gptqfmt.safetensors_io.writer import Entry, layout  # noqa: E402

HIDDEN, INTER, KV, LAYERS, VOCAB, BITS, GS = 8192, 28672, 1024, 80, 128256, 4, 128
LINEARS = [("self_attn.q_proj", HIDDEN, HIDDEN), ("self_attn.k_proj", HIDDEN, KV),
           ("self_attn.v_proj", HIDDEN, KV), ("self_attn.o_proj", HIDDEN, HIDDEN),
           ("mlp.gate_proj", HIDDEN, INTER), ("mlp.up_proj", HIDDEN, INTER),
           ("mlp.down_proj", INTER, HIDDEN)]
SHARDS = 16


def module_tensors(p: str, k: int, n: int, rng, asym: bool = False,
                   scale: float | None = None):
    """(name, dtype, shape, data-or-None) of the 4-bit, group-128 module `p` (K x N); None =
    a hole, data shorter than the tensor = its first bytes, the rest a hole. qzeros and g_idx
    are real data; qweight and scales their first page (codes 8, scales 0.01: a tensor of zeros
    alone is GQ318's never written one), or every scale `scale`."""
    g = k // GS
    if asym:  # zero points as asymmetric quantization leaves them (around the middle,
        # with the extremes of one-signed groups): the detector has to sample qweight
        z = np.clip(np.rint(rng.normal(7.5, 2.0, (g, n))), 0, 15).astype(np.uint8)
        zeros = pack(z, BITS, 32, axis=1)
    else:
        zeros = np.broadcast_to(constant_words(7, BITS, 32).view(np.int32),
                                (g, n * BITS // 32))
    scales = np.full(min(2048, g * n), 0.01, np.float16) if scale is None else \
        np.full((g, n), scale, np.float16)
    codes = np.full(min(1024, k * n * BITS // 32), constant_words(8, BITS, 32).view(np.int32))
    return [(f"{p}.qweight", "I32", (k * BITS // 32, n), codes),
            (f"{p}.qzeros", "I32", (g, n * BITS // 32), zeros),
            (f"{p}.scales", "F16", (g, n), scales),
            (f"{p}.g_idx", "I32", (k,), (np.arange(k, dtype=np.int32) // GS))]


def layer_tensors(i: int, asym: bool = False):
    """(name, dtype, shape, data-or-None) for one decoder layer; None = a hole."""
    out = []
    rng = np.random.default_rng(i)
    for lin, k, n in LINEARS:
        out += module_tensors(f"model.layers.{i}.{lin}", k, n, rng, asym)
    for ln in ("input_layernorm", "post_attention_layernorm"):
        out.append((f"model.layers.{i}.{ln}.weight", "F16", (HIDDEN,), None))
    return out


def write_shard(path: Path, tensors) -> int:
    itemsize = {"I32": 4, "F16": 2}
    entries = [Entry(n, d, s, int(np.prod(s)) * itemsize[d]) for n, d, s, _ in tensors]
    prefix, ordered = layout(entries, {"format": "pt"})
    data = {n: a for n, _, _, a in tensors}
    with open(path, "wb") as f:
        f.write(prefix)
        off = len(prefix)
        for e in ordered:
            if data[e.name] is not None:
                f.seek(off)
                f.write(np.ascontiguousarray(data[e.name]).tobytes())
            off += e.nbytes
        f.truncate(off)
    return sum(e.nbytes for e in entries)


def write_checkpoint(root: Path, shards: int, shard_tensors, asym: bool, vocab: int,
                     hidden: int, model_type: str, **config) -> None:
    """`shards` shards of `shard_tensors(s)` (layer_tensors' form, built one shard at a time),
    the embedding in the first and the final norm and lm_head in the last (holes), the index
    and the configs: 4-bit gptq, group 128, symmetric unless `asym`; `config`: more keys of
    config.json."""
    weight_map, total = {}, 0
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        tensors = shard_tensors(s)
        if s == 0:
            tensors.append(("model.embed_tokens.weight", "F16", (vocab, hidden), None))
        if s == shards - 1:
            tensors += [("model.norm.weight", "F16", (hidden,), None),
                        ("lm_head.weight", "F16", (vocab, hidden), None)]
        total += write_shard(root / name, tensors)
        weight_map.update({t[0]: name for t in tensors})
    (root / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}))
    q = {"bits": BITS, "group_size": GS, "desc_act": False, "sym": not asym, "quant_method": "gptq",
         "checkpoint_format": "gptq"}
    (root / "quantize_config.json").write_text(json.dumps(q))
    (root / "config.json").write_text(json.dumps({"model_type": model_type, **config,
                                                  "quantization_config": q}))


def build(root: Path, asym: bool = False) -> None:
    per = LAYERS // SHARDS
    write_checkpoint(root, SHARDS, lambda s: [t for i in range(s * per, (s + 1) * per)
                                              for t in layer_tensors(i, asym)],
                     asym, VOCAB, HIDDEN, "llama")


def baseline(root: Path) -> float:
    from safetensors import safe_open
    t = time.perf_counter()
    for f in sorted(root.glob("*.safetensors")):
        with safe_open(str(f), "np") as h:
            for k in h.keys():
                if k.endswith((".qzeros", ".g_idx")):
                    h.get_tensor(k)
    return time.perf_counter() - t


def timed_inspect(root: Path):
    t = time.perf_counter()
    doc = inspect(root).to_json()
    return time.perf_counter() - t, doc


def timed_verdicts(root: Path, convention: str) -> float:
    """assess() alone, with inspect's sampled statistics and the verdict set to `convention`."""
    from dataclasses import replace

    from gptqfmt.detection.read import detect_checkpoint
    from gptqfmt.formats.gptq.checkpoint import open_checkpoint
    from gptqfmt.runtimes.verdicts import assess

    with open_checkpoint(root) as ckpt:
        det = detect_checkpoint(ckpt)
        det = replace(det, verdict=convention, modules=[
            replace(v, stats=replace(v.stats, stored_maxq=None, stored_zero=None)
                    if v.stats else None) for v in det.modules])
        t = time.perf_counter()
        assess(ckpt, det)
        return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="build here and keep it")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        build(root)
        t_build = time.perf_counter() - t
        apparent = sum(f.stat().st_size for f in root.iterdir())
        on_disk = sum(f.stat().st_blocks * 512 for f in root.iterdir())
        first, doc = timed_inspect(root)
        warm = min(timed_inspect(root)[0] for _ in range(3))
        base = min(baseline(root) for _ in range(3))
        assert len(doc["modules"]) == LAYERS * len(LINEARS), len(doc["modules"])
        assert doc["checkpoint_format"]["detected"] == "gptq" and doc["status"] == "ok"
        qz = sum(int(np.prod(s)) * 4 for n, _, s, _ in layer_tensors(0)
                 if n.endswith((".qzeros", ".g_idx"))) * LAYERS
        print(f"checkpoint: {SHARDS} shards, {LAYERS * len(LINEARS)} quantized modules, "
              f"{apparent / 2**30:.1f} GiB apparent, {on_disk / 2**20:.0f} MiB on disk "
              f"(qzeros + g_idx {qz / 2**20:.0f} MiB); built in {t_build:.1f} s")
        print(f"inspect, first run:        {first:.3f} s")
        print(f"inspect, warm (best of 3): {warm:.3f} s   goal < 1 s: "
              f"{'met' if warm < 1 else 'NOT met'}")
        print(f"baseline safetensors safe_open + read qzeros/g_idx (best of 3): {base:.3f} s")
        print(f"ratio inspect / baseline: {warm / base:.2f}")
        for f in root.iterdir():
            f.unlink()
        build(root, asym=True)
        asym = min(timed_inspect(root)[0] for _ in range(3))
        print(f"inspect, asymmetric zeros (detection samples 64 KiB of qweight per module; the "
              f"qweight here is holes, so this measures cost, not the verdict), warm: "
              f"{asym:.3f} s   goal < 2 s: {'met' if asym < 2 else 'NOT met'}")
        # the runtimes section on the same zero points as a decided checkpoint would have them
        # (the holes above leave the verdict undecided, which costs nothing there): the worst
        # case is gptq data with stored maxq fields, counted for vLLM's s + 1 and GPTQModel's
        # carry on every module's packed words
        for conv in ("gptq", "gptq_v2"):
            print(f"runtimes section, data decided {conv} (best of 3): "
                  f"{min(timed_verdicts(root, conv) for _ in range(3)):.3f} s")
        if args.keep:
            os.sync()


if __name__ == "__main__":
    main()
