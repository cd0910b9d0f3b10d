"""The safetensors reader (gptqfmt/safetensors_io/reader.py): the same tensors and metadata as
the reference library on the shipped fixtures."""
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file as torch_load_file

from gptqfmt.safetensors_io import SafetensorsFile
from tests.support import CKPT

FILES = sorted(CKPT.glob("*/*.safetensors"))


@pytest.mark.parametrize("path", FILES[::7], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_reader_equals_reference_on_fixtures(path):
    ref = torch_load_file(str(path))
    f = SafetensorsFile(path)
    assert list(f.tensors) and sorted(f.tensors) == sorted(ref)
    for name, t in ref.items():
        v = f.view(name)
        if t.dtype == torch.bfloat16:
            assert np.array_equal(v, t.view(torch.int16).numpy().view(np.uint16))
        else:
            assert np.array_equal(v, t.numpy()) and v.dtype == t.numpy().dtype


def test_header_metadata_kept():
    f = SafetensorsFile(CKPT / "autogptq-b4-asym-gptq" / "model.safetensors")
    assert f.metadata["format"] == "pt" and f.metadata["gptq_bits"] == "4"
    assert json.loads(json.dumps(f.metadata)) == f.metadata
