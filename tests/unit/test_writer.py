"""The safetensors writer (gptqfmt/safetensors_io/writer.py): byte-identical to the reference
library, golden header bytes, bf16 as torch rounds it."""
import struct

import numpy as np
import pytest
import safetensors.numpy as st_np
import torch
from safetensors.torch import save as torch_save

from gptqfmt.safetensors_io import SafetensorsFile, bf16_to_f32, f32_to_bf16, save_file


def test_golden_header_bytes(tmp_path):
    save_file({"b": np.zeros(1, np.float16), "a": np.zeros(1, np.int32)}, tmp_path / "g",
              {"format": "pt"})
    blob = (tmp_path / "g").read_bytes()
    header = (b'{"__metadata__":{"format":"pt"},'
              b'"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},'
              b'"b":{"dtype":"F16","shape":[1],"data_offsets":[4,6]}}')
    header += b" " * (-len(header) % 8)
    assert blob == struct.pack("<Q", len(header)) + header + b"\0" * 6


@pytest.mark.parametrize("meta", [None, {"format": "pt"}])
def test_bytes_equal_reference_writer_for_every_numpy_dtype(tmp_path, meta):
    rng = np.random.default_rng(1)
    tensors = {f"t.{dt}": rng.integers(0, 100, size=(3, 2)).astype(dt)
               for dt in ("int8", "uint8", "int16", "uint16", "float16", "int32", "uint32",
                          "float32", "float64", "int64", "uint64", "bool")}
    tensors["z.empty"] = np.zeros((0, 4), np.float32)
    tensors["z.scalar"] = np.array(7, np.int32)  # 0-d stays 0-d
    tensors["name with \u00e9 and \x1b[31m"] = np.ones(2, np.float16)
    save_file(tensors, tmp_path / "x", meta)
    assert (tmp_path / "x").read_bytes() == st_np.save(tensors, metadata=meta)


def test_bf16_round_trip_matches_torch(tmp_path):
    x = torch.randn(5, 7, dtype=torch.float32) * 1000
    x[0, 0] = float("nan")
    b = x.to(torch.bfloat16)
    raw = f32_to_bf16(x.numpy())
    want = b.view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(x.numpy())
    assert np.array_equal(raw[~nan], want[~nan])  # round to nearest even, like torch
    assert np.isnan(bf16_to_f32(raw[nan])).all()  # NaN stays NaN (payloads may differ)
    b = b.view(torch.int16).clone()
    b[torch.from_numpy(nan)] = 0x7FC0
    b = b.view(torch.bfloat16)
    save_file({"s": ("BF16", raw)}, tmp_path / "b")
    assert (tmp_path / "b").read_bytes() == torch_save({"s": b})
    got = bf16_to_f32(SafetensorsFile(tmp_path / "b").view("s"))
    assert np.array_equal(got, b.to(torch.float32).numpy(), equal_nan=True)
