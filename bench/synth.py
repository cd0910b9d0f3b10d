"""Synthetic real-data layers of a 70B Llama for the benches (not a test fixture).

Codes are spread around each column's zero point the way real weights are (student-t), so the
detector and the converter see realistic data; a pool of rows is packed once and tiled.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gptqfmt.bits.packing import pack
from gptqfmt.safetensors_io.writer import save_file

HIDDEN, INTER, KV, BITS, GS = 8192, 28672, 1024, 4, 128
LINEARS = [("self_attn.q_proj", HIDDEN, HIDDEN), ("self_attn.k_proj", HIDDEN, KV),
           ("self_attn.v_proj", HIDDEN, KV), ("self_attn.o_proj", HIDDEN, HIDDEN),
           ("mlp.gate_proj", HIDDEN, INTER), ("mlp.up_proj", HIDDEN, INTER),
           ("mlp.down_proj", INTER, HIDDEN)]
POOL_ROWS = 256


def module(rng, k, n, convention="gptq_v2", act_order=False):
    zero = rng.integers(3, 13, n)                      # per column, the same in every group
    codes = np.clip(zero + np.round(rng.standard_t(4, (POOL_ROWS, n)) * 2.0), 0, 15)
    qweight = np.tile(pack(codes.astype(np.uint8), BITS, 32, axis=0), (k // POOL_ROWS, 1))
    g = k // GS
    stored = zero - (1 if convention == "gptq" else 0)
    qzeros = pack(np.broadcast_to(stored, (g, n)).astype(np.uint8), BITS, 32, axis=1)
    scales = (rng.random((g, n), np.float32) * 0.01 + 0.001).astype(np.float16)
    g_idx = (np.arange(k) // GS).astype(np.int32)
    if act_order:  # as GPTQ's desc_act leaves it: each group a set of channels anywhere in K
        g_idx = rng.permutation(g_idx)  # (the zero is per column, so codes fit every group)
    return {"qweight": qweight, "qzeros": qzeros, "scales": scales, "g_idx": g_idx}


def write_layers(root: Path, layers: int, make) -> int:
    """`layers` layers of LINEARS, one shard each, with the index; `make(rng, k, n)` gives a
    module's tensors by role. Returns the qweight bytes."""
    rng = np.random.default_rng(0)
    weight_map, qbytes = {}, 0
    for i in range(layers):
        tensors = {}
        for lin, k, n in LINEARS:
            for role, arr in make(rng, k, n).items():
                tensors[f"model.layers.{i}.{lin}.{role}"] = arr
            qbytes += tensors[f"model.layers.{i}.{lin}.qweight"].nbytes
        tensors[f"model.layers.{i}.input_layernorm.weight"] = np.ones(HIDDEN, np.float16)
        name = f"model-{i + 1:05d}-of-{layers:05d}.safetensors"
        save_file(tensors, root / name, {"format": "pt"})
        weight_map.update({t: name for t in tensors})
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return qbytes


def build(root: Path, layers: int, convention: str = "gptq_v2", act_order: bool = False) -> int:
    """Write `layers` layers, one shard each, with configs; returns the qweight bytes."""
    qbytes = write_layers(root, layers,
                          lambda rng, k, n: module(rng, k, n, convention, act_order))
    q = {"bits": BITS, "group_size": GS, "desc_act": act_order, "sym": False,
         "quant_method": "gptq", "format": convention, "checkpoint_format": convention}
    (root / "quantize_config.json").write_text(json.dumps(q, indent=2))
    (root / "config.json").write_text(json.dumps({"model_type": "llama",
                                                  "quantization_config": q}, indent=2))
    (root / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {}}}))
    return qbytes


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]   # AutoAWQ GEMM: nibble i of a word holds channel 8c + this


def awq_words(codes: np.ndarray) -> np.ndarray:
    """AutoAWQ GEMM's packing of codes [R, N] into words [R, N/8] (int32)."""
    r, n = codes.shape
    c = codes.reshape(r, n // 8, 8)[:, :, AWQ_ORDER].astype(np.uint32)
    return (c << (4 * np.arange(8, dtype=np.uint32))).sum(-1, dtype=np.uint32).view(np.int32)


def awq_module(rng, k, n):
    """One module as AutoAWQ GEMM writes it, with the codes module() draws."""
    zero = rng.integers(3, 13, n)
    codes = np.clip(zero + np.round(rng.standard_t(4, (POOL_ROWS, n)) * 2.0), 0, 15)
    g = k // GS
    return {"qweight": np.tile(awq_words(codes.astype(np.uint8)), (k // POOL_ROWS, 1)),
            "qzeros": awq_words(np.broadcast_to(zero, (g, n)).astype(np.uint8)),
            "scales": (rng.random((g, n), np.float32) * 0.01 + 0.001).astype(np.float16)}


def build_awq(root: Path, layers: int) -> int:
    """`layers` layers of the 70B shape as AutoAWQ GEMM writes them (qweight [K, N/8], qzeros
    [K/128, N/8], scales [K/128, N]), one shard each, with transformers' AwqConfig in
    config.json. Returns the qweight bytes."""
    qbytes = write_layers(root, layers, awq_module)
    q = {"quant_method": "awq", "version": "gemm", "bits": BITS, "group_size": GS,
         "zero_point": True}
    (root / "config.json").write_text(json.dumps({"model_type": "llama",
                                                  "quantization_config": q}, indent=2))
    return qbytes
