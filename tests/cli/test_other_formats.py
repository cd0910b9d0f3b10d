"""A file or directory in another format (GGUF, PyTorch, a pickle, a git-LFS pointer) given as
PATH: inspect and verify name it in one finding line with the next step, and end the way every
container error ends (exit 1, the finding on stdout, nothing on stderr, a valid JSON report).
Quantization formats whose configs name them and that gptqfmt cannot read (GPTQModel's planar
gptq_p, VPTQ, AutoGPTQ's Marlin repack) are GQ203 in every command, said by name."""
import json
import pickle
import struct

import pytest

from gptqfmt.resources import validator
from tests.support import FIXTURES, unwrap

GGUF = b"GGUF" + struct.pack("<IQQ", 3, 0, 0)
TORCH_ZIP = b"PK\x03\x04" + bytes(22) + struct.pack("<HH", 10, 0) + b"m/data.pkl"
TORCH_LEGACY = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.\x80\x02M\xe9\x03."
LFS = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 9\n"
NOTHING = "nothing here for it to check"
CONVERT = "convert the weights to safetensors first: `python -c 'import torch, safetensors.torch"

# case: (files to write under tmp_path/ck, PATH relative to tmp_path, the first stdout line,
# what the hint begins with); {d} is tmp_path/ck
CASES = {
    "gguf-file": ({"m.gguf": GGUF}, "ck/m.gguf",
                  "m.gguf: GQ130 a GGUF file (version 3), llama.cpp's format, not safetensors; "
                  f"gptqfmt checks GPTQ checkpoints in safetensors, so there is {NOTHING}",
                  "to see what it holds: `gguf-dump {d}/m.gguf` (pip install gguf)"),
    "torch-zip-file": ({"m.pt": TORCH_ZIP}, "ck/m.pt",
                       "m.pt: GQ130 a PyTorch checkpoint (torch.save's ZIP format, entry "
                       "m/data.pkl), not safetensors", CONVERT),
    "torch-legacy-file": ({"m.bin": TORCH_LEGACY}, "ck/m.bin",
                          "m.bin: GQ130 a PyTorch checkpoint (torch.save's legacy pickle "
                          "format), not safetensors", CONVERT),
    "pickle-file": ({"m.pkl": pickle.dumps({"w": 1}, protocol=3)}, "ck/m.pkl",
                    "m.pkl: GQ130 a Python pickle (protocol 3), not safetensors",
                    "save the weights with safetensors"),
    "lfs-pointer-file": ({"model.safetensors": LFS}, "ck/model.safetensors",
                         "model.safetensors: GQ117 starts with 'version https://git-lfs': a "
                         "git-LFS pointer file, not the shard itself",
                         "fetch the content in the clone it came from: `cd {d} && git lfs pull`"),
    "pytorch-directory": ({"pytorch_model.bin": TORCH_ZIP, "config.json": b"{}"}, "ck",
                          "{d}: GQ128 no *.safetensors file and no model.safetensors.index.json "
                          "in this directory; it holds pytorch_model.bin, a PyTorch checkpoint "
                          "(torch.save's ZIP format, entry m/data.pkl)", CONVERT),
    "gguf-directory": ({"model.gguf": GGUF}, "ck",
                       "{d}: GQ128 no *.safetensors file and no model.safetensors.index.json in "
                       "this directory; it holds model.gguf, a GGUF file (version 3), llama.cpp's"
                       f" format; gptqfmt checks GPTQ checkpoints in safetensors, so there is "
                       f"{NOTHING}", "to see what it holds: `gguf-dump {d}/model.gguf`"),
    "lfs-pointer-directory": ({"pytorch_model.bin": LFS}, "ck",
                              "{d}: GQ128 no *.safetensors file and no "
                              "model.safetensors.index.json in this directory; it holds "
                              "pytorch_model.bin, a git-LFS pointer file",
                              "fetch the content in the clone it came from: `cd {d} && git lfs "
                              "pull`"),
}
SCHEMA = {"inspect": "inspect", "verify": "report"}


def make(tmp_path, case):
    files, path, line, hint = CASES[case]
    d = tmp_path / "ck"
    d.mkdir()
    for name, data in files.items():
        (d / name).write_bytes(data)
    return tmp_path / path, line.format(d=d), hint.format(d=d)


@pytest.mark.parametrize("command", ["inspect", "verify"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_named_with_the_next_step(run_cli, tmp_path, case, command):
    path, line, hint = make(tmp_path, case)
    r = run_cli(command, path)
    assert r.exit_code == 1 and r.stderr == ""
    verdict, first, last = unwrap(r.stdout)
    code = line.split(": ", 1)[1].split(" ", 1)[0]     # GQ130, GQ117: named by the verdict
    assert verdict.startswith("FAIL: ") and code in verdict
    assert first.startswith(f"{line} (hint: {hint}")
    assert "header length" not in r.stdout and "Traceback" not in r.stdout
    assert last == "FAIL: 1 error, 0 warnings, 0 infos; stopped"

    r = run_cli(command, path, "--format", "json")
    assert r.exit_code == 1 and r.stderr == ""
    doc = json.loads(r.stdout)
    validator(SCHEMA[command]).validate(doc)
    assert (doc["status"], doc["exit_code"], len(doc["findings"])) == ("fail", 1, 1)
    f = doc["findings"][0]
    assert f"{f['file']}: {f['code']} {f['message']}" == line and f["hint"].startswith(hint)


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_ends_like_any_container_error(run_cli, tmp_path, command):
    """Same exit code, stderr and closing line as a header length past the limit (GQ102)."""
    path, _, _ = make(tmp_path, "gguf-file")
    ours, theirs = (run_cli(command, p) for p in (path, FIXTURES / "hostile" /
                                                  "header-claims-a-terabyte"))
    assert (ours.exit_code, ours.stderr) == (theirs.exit_code, theirs.stderr) == (1, "")
    assert unwrap(ours.stdout)[-1] == unwrap(theirs.stdout)[-1]


# fixtures/invalid/<case>: (what the one GQ203 line must say, what its hint begins with)
NAMED = {
    "planar-gptq-p-label-3-bits": (
        "quantize_config.json: GQ203 checkpoint_format is 'gptq_p': GPTQModel's planar layout",
        "load it with GPTQModel 7.3.4 or later"),
    "planar-gptq-p-bits": (
        "quantize_config.json: GQ203 checkpoint_format is 'gptq_p': GPTQModel's planar layout",
        "load it with GPTQModel 7.3.4 or later"),
    "vptq-quant-method": (
        "config.json:quantization_config: GQ203 quant_method is 'vptq': VPTQ (microsoft/VPTQ): "
        "vector quantization, not GPTQ's packing", "load it with VPTQ"),
    "autogptq-marlin-format-true": (
        "quantize_config.json: GQ203 is_marlin_format is true: AutoGPTQ's Marlin repack",
        "load it with AutoGPTQ 0.7 (from_quantized(..., use_marlin=True))"),
}


@pytest.mark.parametrize("command", ["inspect", "verify", "convert", "fix-label"])
@pytest.mark.parametrize("case", sorted(NAMED))
def test_quantization_formats_known_by_name_are_refused_as_such(run_cli, tmp_path, case,
                                                               command):
    """Never read as GPTQ (no module rows, no runtimes section, nothing written), never a
    traceback: one GQ203 line naming the format, then the closing line."""
    src = FIXTURES / "invalid" / case
    line, hint = NAMED[case]
    args = [src] + ([tmp_path / "dst", "--to", "gptq_v2"] if command == "convert" else [])
    r = run_cli(command, *args)
    assert r.exit_code == 1 and r.stderr == ""
    verdict, first, last = unwrap(r.stdout)
    assert verdict.startswith("FAIL: ") and "GQ203" in verdict
    assert first.startswith(line) and f" (hint: {hint}" in first
    assert last == "FAIL: 1 error, 0 warnings, 0 infos; stopped"
    assert not (tmp_path / "dst").exists()

    r = run_cli(command, *args, "--format", "json")
    assert r.exit_code == 1 and r.stderr == ""
    doc = json.loads(r.stdout)
    validator({**SCHEMA, "convert": "convert", "fix-label": "fix_label"}[command]).validate(doc)
    assert [f["code"] for f in doc["findings"]] == ["GQ203"]
    assert doc["findings"][0]["hint"].startswith(hint)
