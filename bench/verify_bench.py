#!/usr/bin/env python3
"""`verify` throughput on real data: GB of qweight checked per second.

Builds (in a temporary directory) LAYERS decoder layers of a 70B Llama (hidden 8192,
intermediate 28672, 8 KV heads), 4-bit, group 128, asymmetric zero points, codes spread around
their zero point the way real weights are, labelled correctly. Then runs the full `verify`
(every check, every qweight word) and, in the same process, a baseline that only reads the same
qweight tensors with the official safetensors library and sums them.

    python bench/verify_bench.py [--layers 4] [--act-order]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gptqfmt.gptq.packing import pack  # noqa: E402
from gptqfmt.safetensors_io.writer import save_file  # noqa: E402
from gptqfmt.validate import validate  # noqa: E402

HIDDEN, INTER, KV, BITS, GS = 8192, 28672, 1024, 4, 128
LINEARS = [("self_attn.q_proj", HIDDEN, HIDDEN), ("self_attn.k_proj", HIDDEN, KV),
           ("self_attn.v_proj", HIDDEN, KV), ("self_attn.o_proj", HIDDEN, HIDDEN),
           ("mlp.gate_proj", HIDDEN, INTER), ("mlp.up_proj", HIDDEN, INTER),
           ("mlp.down_proj", INTER, HIDDEN)]
POOL_ROWS = 256  # input channels generated per output width, then tiled


def module(rng, k, n, act_order):
    zero = rng.integers(3, 13, n)                      # per column, the same in every group
    codes = np.clip(zero + np.round(rng.standard_t(4, (POOL_ROWS, n)) * 2.0), 0, 15)
    tile = pack(codes.astype(np.uint8), BITS, 32, axis=0)
    qweight = np.tile(tile, (k // POOL_ROWS, 1))
    g = k // GS
    qzeros = pack(np.broadcast_to(zero, (g, n)).astype(np.uint8), BITS, 32, axis=1)
    scales = (rng.random((g, n), np.float32) * 0.01 + 0.001).astype(np.float16)
    g_idx = (np.arange(k) // GS).astype(np.int32)
    if act_order:  # permute whole tiles' worth of channels so codes stay consistent per group
        g_idx = g_idx.reshape(-1, GS)[rng.permutation(k // GS)].reshape(-1)
    return {"qweight": qweight, "qzeros": qzeros, "scales": scales, "g_idx": g_idx}


def build(root: Path, layers: int, act_order: bool) -> int:
    rng = np.random.default_rng(0)
    weight_map, qbytes = {}, 0
    for i in range(layers):
        tensors = {}
        for lin, k, n in LINEARS:
            for role, arr in module(rng, k, n, act_order).items():
                tensors[f"model.layers.{i}.{lin}.{role}"] = arr
            qbytes += tensors[f"model.layers.{i}.{lin}.qweight"].nbytes
        name = f"model-{i + 1:05d}-of-{layers:05d}.safetensors"
        save_file(tensors, root / name, {"format": "pt"})
        weight_map.update({t: name for t in tensors})
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    q = {"bits": BITS, "group_size": GS, "desc_act": act_order, "sym": False,
         "quant_method": "gptq", "format": "gptq_v2", "checkpoint_format": "gptq_v2"}
    (root / "quantize_config.json").write_text(json.dumps(q))
    return qbytes


def baseline(root: Path) -> float:
    from safetensors import safe_open
    t = time.perf_counter()
    for f in sorted(root.glob("*.safetensors")):
        with safe_open(str(f), "np") as h:
            for k in h.keys():
                if k.endswith(".qweight"):
                    h.get_tensor(k).sum()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--act-order", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        qbytes = build(root, args.layers, args.act_order)
        validate(root)  # warm the page cache
        runs = []
        for _ in range(2):
            t = time.perf_counter()
            report = validate(root)
            runs.append(time.perf_counter() - t)
        best = min(runs)
        base = min(baseline(root) for _ in range(2))
        det = report.detection
        assert det.verdict == "gptq_v2", det.evidence
        assert not report.failed(), [f.one_line() for f in report.findings]
        print(f"{args.layers} layers x 7 linears of a 70B Llama, 4-bit, group 128, "
              f"{'act-order' if args.act_order else 'no act-order'}: "
              f"{qbytes / 1e9:.2f} GB of qweight")
        print(f"verify (all checks, all data), warm, best of 2: {best:.2f} s = "
              f"{qbytes / best / 1e9:.2f} GB/s of qweight   goal >= 1 GB/s: "
              f"{'met' if qbytes / best >= 1e9 else 'NOT met'}")
        print(f"baseline safetensors get_tensor + sum of every qweight: {base:.2f} s = "
              f"{qbytes / base / 1e9:.2f} GB/s")
        print(f"ratio verify / baseline: {best / base:.2f}; detected {det.verdict} "
              f"(confidence {det.confidence:.4f})")


if __name__ == "__main__":
    main()
